"""Step lines of other training loops, format by format (labkit/logs/loops.py), and fp16 loss-scale
lines cut by a terminal wrap (findings.py). Each real log of these kinds is a corpus log
(tests/fixtures/logs/real: olmo692, pithtrain7, launcher55, learndeepspeed1, pytorch118369);
the lines here are written as each tool's format prints them, to pin the edges of each rule."""

from __future__ import annotations

import pandas as pd
import pytest

from labkit.logs import loops, parse_lines
from labkit.logs.findings import _unwrap

# pith-train's logger: f"step {step:08d}/{total:08d} | step-time {t:.3f} sec | ..."
PITH = ("2026-04-01 14:06:36 | INFO | step 00000012/00000015 | step-time 812.5 ms | cross-entropy-loss "
        "2.6636 | learning-rate 1.000000e-06 | gradient-norm 20.2657 | peak-gpu-memory 63.65 GB")


def test_dashed_step_lines():
    p = parse_lines([PITH])
    (r,) = p.to_dict()["iterations"]
    assert (r["iteration"], r["train_iters"], r["elapsed_ms"], r["lm_loss"], r["lr"], r["grad_norm"]) == (
        12, 15, 812.5, 2.6636, 1e-06, 20.2657)
    assert p.memory["max_allocated_mb"].tolist() == [pytest.approx(63.65e9 / 2**20)]
    assert loops.parse_step_line("step 3/15 | step-time 1.0 sec | learning-rate 1e-06") is None  # no loss
    assert loops.parse_step_line("step 3/15 was skipped | loss 2.0") is None  # no "|" after the counter


# Lightning's tqdm postfix (tqdm.format_num: the shorter of str(n) and '{:.3g}', padded to 5)
BAR = "Epoch 1:  42%|####2     | 420/1000 [01:10<01:37,  5.95it/s, loss=2.51, v_num=3, {}]"


@pytest.mark.parametrize("postfix, want", [
    ("reduced_train_loss=2.480, global_step=419.0", (419, 2.48)),
    ("train_loss=2.470, global_step=12345.0", (12345, 2.47)),
    ("global_step=419.0", (419, 2.51)),  # only the bar's own running loss
    ("reduced_train_loss=2.480, global_step=1.23e+3", None),  # the step rounded: not known
])
def test_lightning_bar_postfix(postfix, want):
    its = parse_lines([BAR.format(postfix)]).to_dict()["iterations"]
    assert [(r["iteration"], r["lm_loss"]) for r in its] == ([want] if want else [])


def test_a_message_glued_to_a_lightning_bar_is_read_too():
    line = BAR.format("reduced_train_loss=2.480, global_step=419.0") + (
        "[E ProcessGroupNCCL.cpp:458] [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=96120, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800123 milliseconds "
        "before timing out.")
    d = parse_lines([line]).to_dict()
    assert [r["iteration"] for r in d["iterations"]] == [419]
    assert [f["kind"] for f in d["failures"]] == ["nccl_timeout"]


# OLMo's log_metrics_to_console: f"{prefix}\n" + "\n".join(f"    {name}={format_float(value)}")
OLMO = ["2024-08-06 09:59:26.181 node-3:0  olmo.train:908  INFO    [step=10/100,epoch=0]",
        "    optim/total_grad_norm=1.250", "    train/CrossEntropyLoss=7.125",
        "    throughput/device/tokens_per_second=26,668", "    System/Peak GPU Memory (MB)=46,911",
        "2024-08-06 09:59:30.181 node-3:0  olmo.train:908  INFO    [step=11/100,epoch=0]",
        "    optim/total_grad_norm=nan", "    train/CrossEntropyLoss=7.000",
        "2024-08-06 09:59:31.000 node-3:0  olmo.train:1200  INFO    Saving checkpoint",
        "2024-08-06 09:59:34.181 node-3:0  olmo.train:908  INFO    [step=12/100,epoch=0]",
        "    throughput/total_tokens=3,145,728"]  # no loss: no record


def test_olmo_records_over_lines():
    # beside another tool's line (the lines of a record hold no trigger word: read while it is open)
    p = parse_lines(["node-3:1234:1234 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.3<0>", *OLMO])
    its = p.to_dict()["iterations"]
    assert [(r["iteration"], r["train_iters"], r["lm_loss"], r["grad_norm"]) for r in its] == [
        (10, 100, 7.125, 1.25), (11, 100, 7.0, None)]
    assert p.iterations["tokens_per_gpu_per_sec"].tolist()[0] == 26668.0
    mem = p.memory[["iteration", "max_allocated_mb"]].values.tolist()
    assert mem == [[10, pytest.approx(46911e6 / 2**20)]]
    # the record at the end of the file is closed there
    assert [r["iteration"] for r in parse_lines(OLMO[:3]).to_dict()["iterations"]] == [10]


@pytest.mark.parametrize("wrapped, whole", [
    ("Attempted loss scal                                 e: 8192, reducing to 4096",
     "Attempted loss scale: 8192, reducing to 4096"),
    ("Attempted loss scale:                                 8192, reducing to 4096",
     "Attempted loss scale: 8192, reducing to 4096"),
    ("Attempted loss scale: 81                  92, reducing to 4096",
     "Attempted loss scale: 8192, reducing to 4096"),
])
def test_a_terminal_wrap_inside_a_loss_scale_line(wrapped, whole):
    assert _unwrap(wrapped) == whole
    line = f"[deepspeed] OVERFLOW! Rank 0 Skipping step. {wrapped}"
    (f,) = parse_lines([line]).findings
    assert f["kind"] == "fp16_overflow" and f["skipped_steps"] == 1 and f["loss_scale"] == 4096.0


# nanochat's base_train.py print0(f"step {step:05d}/{num_iterations:05d} ({pct_done:.2f}%) | loss: ...")
NANOCHAT = ["step 00010/01000 (1.00%) | loss: 6.123456 | lrm: 1.00 | dt: 123.45ms | tok/sec: 123,456 | "
            "mfu: 12.34 | total time: 0.12m",
            "step 00011 (1.10%) | loss: 6.000001 | lrm: 1.00 | dt: 120.00ms | tok/sec: 123,000 | "
            "bf16_mfu: 12.00 | epoch: 1 | total time: 0.13m"]
# MaxText's metric logger, behind absl's prefix; before 2024 "TFLOP/s:" and no tokens
MAXTEXT = ["I0929 19:48:42.123456 140123 max_logging.py:12] completed step: 10, seconds: 1.150, "
           "TFLOP/s/device: 470.000, Tokens/s/device: 57000.000, total_weights: 1000, loss: 10.010, "
           "lm_loss: 10.000, perplexity: 1.000",
           "completed step: 11, seconds: 1.100, TFLOP/s: 400.000, loss: 9.900"]
NCCL = "node-3:1234:1234 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.3<0>"


@pytest.mark.parametrize("with_nccl", [False, True])  # no trigger word: read beside other tools too
def test_nanochat_and_maxtext_step_lines(with_nccl):
    p = parse_lines([NCCL] * with_nccl + NANOCHAT)
    its = p.iterations
    assert its[["iteration", "lm_loss", "elapsed_ms", "tokens_per_sec", "mfu"]].values.tolist() == [
        [10, 6.123456, 123.45, 123456.0, 12.34], [11, 6.000001, 120.0, 123000.0, 12.0]]
    assert its["train_iters"].tolist()[0] == 1000 and pd.isna(its["train_iters"].tolist()[1])
    its = parse_lines([NCCL] * with_nccl + MAXTEXT).iterations
    assert its[["iteration", "lm_loss", "elapsed_ms", "tflops_per_gpu"]].values.tolist() == [
        [10, 10.0, 1150.0, 470.0], [11, 9.9, 1100.0, 400.0]]
    assert its["tokens_per_gpu_per_sec"].tolist()[0] == 57000.0


def test_lightning_member_line_gives_the_world_size():
    lines = ["Initializing distributed: GLOBAL_RANK: 3, MEMBER: 4/16", *NANOCHAT]
    assert parse_lines(lines).layout["world_size"] == 16
    assert parse_lines(NANOCHAT).layout["world_size"] is None


# NeMo Automodel: "step {i} | epoch {e} | loss {l:.4f} | ... | mem {m:.2f} GiB | tps {t:.2f}({t/n:.2f}/gpu)"
AUTOMODEL = ("2026-08-10 16:01:51 | INFO | root | step 42 | epoch 0 | loss 0.8168 | grad_norm 0.9202 | "
             "lr 1.00e-05 | mem 25.46 GiB | tps 31039.28(3879.91/gpu) | num_label_tokens 40593")


@pytest.mark.parametrize("line, want", [
    (AUTOMODEL, {"iteration": 42, "lm_loss": 0.8168, "lr": 1e-05, "grad_norm": 0.9202,
                 "tokens_per_sec": 31039.28, "tokens_per_gpu_per_sec": 3879.91}),
    ("[1,0]<stdout>:Step #10\tLoss: 0.924903", {"iteration": 10, "lm_loss": 0.924903}),  # Horovod's examples
    ("steps: 2 loss: 12.6157 iter time (s): 2.673 samples/sec: 95.775",  # DeepSpeed's pipeline engine
     {"iteration": 2, "lm_loss": 12.6157, "elapsed_ms": 2673.0, "samples_per_sec": 95.775}),
    ("Epoch 4 | iter 961 step 961 | loss train: 1.062, val: 1.057 | iter time: 529.46 ms (step)",  # litgpt
     {"iteration": 961, "lm_loss": 1.062, "elapsed_ms": 529.46}),
])
def test_more_step_line_formats(line, want):
    its = parse_lines([line]).to_dict()["iterations"]
    assert len(its) == 1 and {k: its[0][k] for k in want} == want


def test_axolotl_trainer_dicts_give_memory_rows():
    line = ("{'loss': 4.75, 'grad_norm': 98.5, 'learning_rate': 5e-06, 'memory/max_mem_active(gib)': 25.45, "
            "'memory/max_mem_allocated(gib)': 25.45, 'memory/device_mem_reserved(gib)': 30.22, 'epoch': 1.0}")
    p = parse_lines([line, line.replace("4.75", "2.0312")])
    assert [r["iteration"] for r in p.to_dict()["iterations"]] == [1, 2]
    assert p.memory[["iteration", "max_allocated_mb", "reserved_mb"]].values.tolist() == [
        [1, 25.45 * 1024, 30.22 * 1024], [2, 25.45 * 1024, 30.22 * 1024]]


@pytest.mark.parametrize("code, kinds", [("-9", ["child_failed", "host_oom"]), ("-11", ["child_failed"]),
                                         ("1", ["child_failed"])])
def test_deepspeed_launcher_exit_code(code, kinds):
    lines = ["[2023-04-14 13:11:27,879] [INFO] [launch.py:428:sigkill_handler] Killing subprocess 13266",
             "[2023-04-14 13:11:27,885] [ERROR] [launch.py:434:sigkill_handler] ['/usr/bin/python3', '-u', "
             f"'main.py', '--local_rank=0'] exits with return code = {code}"]
    assert sorted(f["kind"] for f in parse_lines(lines).to_dict()["failures"]) == kinds


def test_an_excepthooks_uncaught_error_and_olmos_rank_prefix():
    line = ("[2024-04-18 19:10:41] CRITICAL [olmo.util:158, rank=3] Uncaught OLMoThreadError: generator "
            "thread data thread 3 failed")
    (f,) = parse_lines([line]).to_dict()["failures"]
    assert (f["kind"], f["rank"]) == ("python_exception", 3)
    assert f["message"] == "OLMoThreadError: generator thread data thread 3 failed"
