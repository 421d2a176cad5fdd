"""Round ten, each mechanism on real lines of the held-out sets 4z, 5a and 5b (the sources named at
each test; the whole logs are in tests/fixtures/logs/heldout4z/ to 5b/). Round ten reads by shapes
that many tools share: a log of tools labkit does not know is a log, a program's own word that it is
stuck is a hang, any launcher's worker that failed with a code is a ``child_failed``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from labkit.cli import main
from labkit.logs import found_nothing, parse_lines, parse_log

HELD = Path(__file__).parent / "fixtures" / "logs"


def _log(folder: str, stem: str) -> Path:
    (path,) = (HELD / folder).glob(f"*{stem}.txt")
    return path


def _kinds(parsed) -> list[str]:  # noqa: ANN001 - a ParsedLog
    return sorted({f.kind for f in parsed.failure_records})


@pytest.mark.parametrize("folder,stem", [
    # TensorFlow's quoted absl/INFO collective lines (tensorflow/models#10849)
    ("heldout5a", "tfmodels10849"),
    # ESPnet2's set-up lines behind ``[tts-server-gpu:0/8] ... (abs_task:1162) INFO: `` (espnet/espnet#4161)
    ("heldout5b", "espnet4161"),
])
def test_a_log_of_tools_labkit_does_not_know_is_read_not_refused(folder, stem, capsys):
    path = _log(folder, stem)
    parsed = parse_log(path)
    assert not found_nothing(parsed)
    (finding,) = parsed.findings
    assert finding["kind"] == "no_iteration" and "a program's output" in finding["message"]
    assert main(["parse", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["iterations"] == []


def test_a_config_is_still_no_log(tmp_path):
    """A run's config (JSON or YAML) passed by mistake is refused, whatever words it holds."""
    yaml = tmp_path / "run.yaml"
    yaml.write_text("# the run\nname: gpt\ntime_limit: '00:30:00'\nlog_level: INFO\nlayers:\n  - 12\n")
    assert found_nothing(parse_log(yaml))
    documented = tmp_path / "documented.yaml"  # more comment lines than keys: still a config
    documented.write_text("".join(f"# note {i}\n" for i in range(6)) + "name: gpt\nlayers: 12\n")
    assert found_nothing(parse_log(documented))
    js = tmp_path / "run.json"
    js.write_text(json.dumps({"name": "gpt", "time_limit": "00:30:00", "error": "Killed"}, indent=1))
    assert found_nothing(parse_log(js))


def test_a_program_that_says_it_may_be_stuck_is_a_hang():
    """XLA's rendezvous: ``This thread has been waiting for `initialize clique ...` for 10 seconds
    and may be stuck.`` (jax-ml/jax#22740)."""
    parsed = parse_log(_log("heldout5a", "jax22740"))
    assert _kinds(parsed) == ["hang"]
    assert _kinds(parse_lines(["the progress bar hung up on us"])) == []


def test_any_launchers_worker_that_failed_with_a_code_is_a_child_failed():
    """``paddle.distributed.launch``: ``LAUNCH ERROR ... Container failed !!!`` then ``Container rank 0
    status failed cmd [...] code 1 log log/workerlog.0`` (PaddlePaddle/PaddleDetection#7380)."""
    assert _kinds(parse_log(_log("heldout5a", "paddledet7380"))) == ["child_failed"]
    # a script's own "Process 1 failed with return code 1" is no launcher's report (cosmos-rl#681, the
    # reading of heldout4b), and srun's tasks are Slurm's (heldout3g, heldout4a)
    assert "child_failed" not in _kinds(parse_log(_log("heldout4b", "cosmosrl681")))
    assert _kinds(parse_lines(["srun: error: nid001: task 3: Exited with exit code 1",
                               "worker 2 exited with exit code 0"])) == []


def test_a_unit_of_time_per_unit_of_work_is_the_step_time():
    """TensorFlow's CIFAR-10 multi-GPU example: ``step 380, loss = 3.31 (11381.4 examples/sec; 0.022
    sec/batch)`` (tensorflow/models#4090), and open_clip's time named by what it timed: ``Data (t):
    14.173 Batch (t): 18.240`` (mertyg/vision-language-models-are-bows#27)."""
    its = parse_log(_log("heldout5a", "tfmodels4090")).iterations
    assert its["elapsed_ms"].iloc[0] == 22.0 and its["samples_per_sec"].iloc[0] == 11381.4
    its = parse_log(_log("heldout5b", "bows27")).iterations
    assert its["elapsed_ms"].iloc[0] == 18240.0 and len(its) == 7


def test_a_position_after_the_loss_counts_the_steps():
    """PyTorch's quickstart loop, ``loss: 2.072397  [    0/60000]``, printed by two Ray SGD workers
    behind ``(pid=65987)`` (ray-project/ray#17440): one record per position, the first copy's loss."""
    its = parse_log(_log("heldout4z", "ray17440")).iterations
    assert its["iteration"].tolist() == [0, 6400, 12800, 19200, 25600]
    assert its["lm_loss"].tolist() == [2.072397, 2.128398, 2.069065, 2.072120, 2.022932]


def _layout(folder: str, stem: str) -> tuple:
    lay = parse_log(_log(folder, stem)).layout
    return tuple(lay[k] for k in ("world_size", "tp", "pp", "dp"))


def test_gpt_neox_states_its_model_parallel_size_and_its_pipeline_apart():
    """``NeoXArgs.configure_distributed_args() using world size: 8 and model-parallel size: 1``
    says nothing of the pipeline (EleutherAI/gpt-neox#1334); its dump's ``pipe_parallel_size
    .... 0......default`` is no pipeline (gpt-neox's slurm/llemma-f-0.2/debug_0_62691629.out at
    8adbad8), where Megatron v1's same words meant none."""
    assert _layout("heldout5c", "neox1334") == (8, 1, None, None)
    assert _layout("heldout3o", "llemma") == (8, 2, 1, 4)


def test_prefixes_of_job_runners_and_quotes_are_peeled():
    """NeMo-Run's ``i.pretrain/0 [default1]:`` before a traceback cut at both ends
    (NVIDIA-NeMo/Speech#12473), and a torchrun agent's traceback quoted line by line with ``> ``
    (modelscope/ms-swift#3343): each is the uncaught exception it shows."""
    assert _kinds(parse_log(_log("heldout5c", "nemo12473"))) == ["python_exception"]
    assert _kinds(parse_log(_log("heldout5d", "msswift3343"))) == ["python_exception"]


def test_more_statements_of_the_world():
    """llm.c's ``Started Multi Node training managed by Slurm: ProcessID:0, NumProcess::4``
    (karpathy/llm.c#426) and torchtitan's 2024 mesh ``Building 1-D device mesh with ('dp',), [4]``
    (pytorch/torchtitan#111)."""
    assert _layout("heldout5e", "llmc426")[0] == 4
    assert _layout("heldout5e", "torchtitan111") == (4, 1, 1, 4)


def test_a_log_indented_as_a_pages_code_block_keeps_its_rank_prefix():
    """picotron's step lines as a README shows them, indented four blanks: ``    [rank 2] Step: 1
    | Loss: 10.9062 | ... | Memory usage:   1.75GB`` (aws-samples/awsome-distributed-training,
    3.test_cases/pytorch/picotron/SmolLM-1.7B/ec2/README.md at 052f609)."""
    parsed = parse_log(_log("heldout5e", "awsome"))
    assert len(parsed.iterations) == 3 and len(parsed.memory) == 3
    assert set(parsed.memory["rank"]) == {2}


def test_a_cross_validations_lines_are_no_steps():
    """WeNet's ``DEBUG CV Batch 5/3700 loss 74.450745 ... history loss 58.864828 rank 3``, its
    cross-validation over 8 GPUs (wenet-e2e/wenet#990)."""
    parsed = parse_log(_log("heldout5b", "wenet990"))
    assert parsed.iterations.empty


def test_a_megatron_record_of_name_equals_value_fields():
    """ezpz's Megatron-DeepSpeed records on Aurora: ``iteration=  136004/  136100 | consumed_samples=
    835608576 | elapsed_time_per_iteration_ms=3415.3 | ... | tokens_per_gpu_per_second_tgs=4797.255 |``
    (argonne-lcf/Megatron-DeepSpeed, ALCF/notes/cooldown.md at 6c20809)."""
    its = parse_log(_log("heldout4x", "alcfmds_cooldown")).iterations
    first = its.iloc[0]
    assert (first["iteration"], first["train_iters"], first["elapsed_ms"], first["global_batch_size"]) == (
        136004, 136100, 3415.3, 6144)
    assert (first["skipped"], first["tokens_per_gpu_per_sec"], first["lm_loss"]) == (0, 4797.255, 12.316531)


def test_skypilots_node_prefix_and_a_record_the_page_wrapped():
    """SkyPilot's ``(head, rank=0, pid=3808) `` before Open MPI's tag on nccl-tests' lines
    (skypilot-org/skypilot, examples/gcp_gpu_direct_tcpx/README.md at 088eebc), and before a
    detectron2 record the page wrapped after ``loss_ce_1: 2.253  ``, its rest at the margin
    (``loss_giou_1: 2.033  ...  time: 1386.3151  data_time: 0.1655  lr: 7.2025e-07  max_mem: 2907``;
    skypilot-org/skypilot#2952): a metric's ``loss_giou_1: `` is no host's prefix."""
    (table,) = parse_log(_log("heldout4x", "skypilotgcp")).nccl_tests
    assert (table["ranks"], len(table["rows"]), table["avg_busbw_gbps"]) == (16, 24, 122.073)
    parsed = parse_log(_log("heldout4z", "skypilot2952"))
    (rec,) = parsed.iterations.to_dict("records")
    assert (rec["iteration"], rec["lm_loss"], rec["elapsed_ms"], rec["lr"]) == (
        19, 60.84, 1386315.1, 7.2025e-07)
    assert parsed.memory["max_allocated_mb"].tolist() == [2907.0]


def test_an_excerpt_that_starts_at_an_exception_line_shows_an_uncaught_exception():
    """A FastChat thread's excerpt begins at ``ConnectionError: ('Connection aborted.',
    ConnectionResetError(104, 'Connection reset by peer'))``, then torchrun's SIGTERMs and its agent's
    ``failed (exitcode: 1) local_rank: 5`` (lm-sys/FastChat#1951)."""
    parsed = parse_log(_log("heldout4y", "fastchat1951"))
    assert sorted(f.kind for f in parsed.failure_records) == ["child_failed", "python_exception"]
    # an exception's name in the middle of a log, after no frame, is no traceback's end
    assert _kinds(parse_lines(["step 1 loss 2.0", "ConnectionError: retrying in 5 s"])) == []


def test_a_watchdogs_what_repeat_and_a_glued_rank_prefix_count_no_new_timeout():
    """Sixteen ranks' watchdog timeouts on Perlmutter, each told again by C++'s ``what():  [PG 3 Rank
    2] Process group watchdog thread terminated with exception: [Rank 2] Watchdog caught ...`` (a
    process group's rank, no prefix), and one glued behind a frame line (``... /usr/local/lib/p[rank13]:
    [E216 ...] [Rank 3] Watchdog caught ...``) (alexk101/sc24-dl-tutorial, err_log.txt at 3904415):
    one event per global rank."""
    parsed = parse_log(_log("heldout4w", "perlmutter_dp4_tp4_sixteen_rank_watchdog_timeouts_glued"
                                         "_lines_srun_exit_134_step_cancelled_sc24tutorial"))
    timeouts = [f for f in parsed.failure_records if f.kind == "nccl_timeout"]
    assert sorted(f.rank for f in timeouts) == list(range(16))


def test_the_shells_killed_report_is_the_sigkill_guess():
    """bash's job-control report ``launch_fsdp_small.sh: line 149: 190869 Killed   ... torchrun ...``
    ends a torchtitan run's log (QIU023/torchtitan_attention_residual,
    phase4_kimi_attnres_lm_pretrain/fp8_paperalign_C_save200.log at a204ab4)."""
    parsed = parse_log(_log("heldout5g", "qiu023"))
    assert _kinds(parsed) == ["host_oom"] and len(parsed.iterations) == 22


def test_a_scripts_own_step_lines_among_deepspeeds_are_all_read():
    """A tutorial's ``step:0, loss:5.453125`` ... ``step:300, loss:3.48828125`` (no trigger word) among
    DeepSpeed's ``OVERFLOW!`` lines and its engine's lossless ``step=0`` record
    (hwang2006/large-scale-lm-tutorials, docs/07_zero_redundancy_optimization.md at 20aadcb): every
    step line, not only those beside a trigger word."""
    its = parse_log(_log("heldout5h", "hwang")).iterations
    assert len(its) == 31 and its["iteration"].iloc[-1] == 300 and its["lm_loss"].iloc[-1] == 3.48828125


@pytest.mark.parametrize("folder,stem,steps", [
    # Lightning Fabric's tensor-parallel example: ``Iteration 0 complete`` ... ``Iteration 7 complete``
    # (Lightning-AI/pytorch-lightning, examples/fabric/tensor_parallel/README.md at 7f0c343)
    ("heldout5h", "fabrictp", list(range(8))),
    # a ViT script on Frontier: ``Current iteration: 100/500000 (0.0%)`` (alexk101/sc24-dl-tutorial,
    # 1000_scientists/param-sweep-python-3109071.out at 73fb589)
    ("heldout5g", "frontier_vit_tp8_set_x_trace_current_iteration_progress_lines_step_and_job_time_limit"
                  "_sc24tutorial", [100, 200, 300, 400, 500, 600]),
    # 30 ranks' ``RANK 2: running step 1/10`` behind srun's labels: one step (sparticlesteve/
    # pytorch-nccl-hang, a Slurm output at 02be1b4)
    ("heldout4r", "pytorch_nccl_hang", [1]),
])
def test_a_line_that_says_only_that_a_step_ran_is_its_record(folder, stem, steps):
    assert parse_log(_log(folder, stem)).iterations["iteration"].tolist() == steps


def test_a_timeouts_rank_comes_from_the_line_a_wrap_cut_it_from():
    """``[rank0]:[E ProcessGroupNCCL.cpp:1182] [Rank 0] NCCL watchdog thread terminated with exception:
    [Rank 0`` / ``] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, ...`` hard-wrapped
    at 100 columns (zd11024/NaviLLM#34), and NeMo RL's Ray actor ``(MegatronPolicyWorker[rank=97]
    pid=3421713, ip=10.1.2.206) [rank97]:[E323 ...] [Rank 6] Watchdog caught ...`` (NVIDIA-NeMo/RL#2140):
    the process's rank, not a process group's."""
    (f,) = [f for f in parse_log(_log("heldout5k", "navillm34")).failure_records if f.kind == "nccl_timeout"]
    assert f.rank == 0
    (f,) = [f for f in parse_log(_log("heldout5j", "nemorl2140")).failure_records if f.kind == "nccl_timeout"]
    assert f.rank == 97


def test_nanotrons_time_per_iteration_is_the_step_time():
    """``iteration: 211364 / 1500000 | consumed_tokens: 480B | time_per_iteration_ms: 8.79K | ...``
    behind ``[INFO|DP=0|TP=0|lrdn0007]:`` (mii-llm/zagreus-nesso-slm, README.md at 49e1b23)."""
    its = parse_log(_log("heldout5i", "zagreus")).iterations
    assert its["elapsed_ms"].tolist() == [8790.0, 8740.0]


def test_mlperf_logs_steps_scales_and_bracketed_units():
    """MLPerf submissions' logs: DeepCAM's ``:::MLLOG {... "key": "train_loss", ... "metadata": {...,
    "epoch_num": 1, "step_num": 10}}`` beside a ``learning_rate`` event of the same step
    (mlcommons/hpc_results_v1.0, HelmholtzAI/.../deepcam/result_1.txt at d77db2c); GNMT's fp16
    optimizer's
    ``Skipped batch, new scale: 512.0`` (mlcommons/training_results_v0.7, Fujitsu/.../gnmt/result_1.txt
    at c664061); MXNet SSD's ``training time: 112.634 [ms], speed: 7954.944 [imgs/sec]`` and ``MPI size:
    16`` (the same repository, DellEMC/results/4xC4140/ssd/result_1.txt)."""
    its = parse_log(_log("heldout5l", "helmholtzai")).iterations
    assert len(its) == 153 and its["iteration"].iloc[0] == 10 and its["lr"].notna().all()
    (finding,) = parse_log(_log("heldout5l", "fujitsu")).findings
    assert (finding["kind"], finding["skipped_steps"]) == ("fp16_overflow", 32)
    parsed = parse_log(_log("heldout5l", "dellemc"))
    first = parsed.iterations.iloc[0]
    assert (first["elapsed_ms"], first["samples_per_sec"], parsed.layout["world_size"]) == (
        112.634, 7954.944, 16)


@pytest.mark.parametrize("stem,steps,loss", [
    # a Trainer's progress table pasted as a Markdown table: ``Step | Training Loss | Validation Loss |
    # Accuracy`` over ``-- | -- | -- | --`` (m3hrdadfi/soxan#9): the validation columns aside
    ("soxan9", 14, 0.6984),
    # Turi Create's box table ``| Iteration    | Loss         | Elapsed Time |`` (apple/turicreate#2771)
    ("turicreate2771", 7, 5.2557),
])
def test_a_table_drawn_with_pipes_gives_a_record_per_row(stem, steps, loss):
    its = parse_log(_log("heldout5o", stem)).iterations
    assert len(its) == steps and its["lm_loss"].iloc[0] == loss


def test_torch_1s_thcudacheck_a_spaced_process_count_and_toks_per_device():
    """``THCudaCheck FAIL file=/pytorch/torch/csrc/cuda/Module.cpp line=37 error=10 : invalid device
    ordinal`` (TsinghuaAI/CPM-1-Finetune#36); accelerate's ``[INFO] Num processes:    2``
    (Ankush610/Distributed-Training-Lab, Accelerate/.../logs/logs_25728.out at 2a2df38); lit-llama's
    ``speed: 1771 toks/s/device`` (Lightning-AI/lit-llama#380)."""
    assert _kinds(parse_log(_log("heldout5n", "cpm1finetune36"))) == ["cuda_error"]
    assert parse_log(_log("heldout5n", "ankush610_25728")).layout["world_size"] == 2
    its = parse_log(_log("heldout5m", "litllama380")).iterations
    assert its["tokens_per_gpu_per_sec"].iloc[-1] == 1771.0


def test_a_scale_another_word_names_is_no_loss_scale():
    """open_clip's ``... LR: 0.000000 Logit Scale: 100.000 - V4``
    (mertyg/vision-language-models-are-bows#27): the temperature of its contrastive loss, not an fp16
    loss scale."""
    assert parse_log(_log("heldout5b", "bows27")).iterations["loss_scale"].isna().all()
    for line in ("step 5, loss: 2.0, loss scale: 1024, lr: 0.1",
                 "step 5, loss: 2.0, current loss scale: 1024, lr: 0.1"):
        assert parse_lines([line]).iterations["loss_scale"].tolist() == [1024.0]
