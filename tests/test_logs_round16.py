"""Round sixteen: layouts stated by DeepSpeed's pipeline engine and gpt-neox's launcher, each
reading checked on the real lines it came from (sources in each folder's README.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from labkit.logs import parse_log
from labkit.logs.deepspeed import neox_sizes, topology

LOGS = Path(__file__).parent / "fixtures" / "logs"
TOPOLOGY = sorted(p for p in LOGS.rglob("*.txt") if b"Using topology: {" in p.read_bytes())


def _line(path: Path, words: str) -> str:
    return next(ln for ln in path.read_text(errors="replace").splitlines() if words in ln)


def test_the_corpus_holds_topology_lines_of_several_layouts():
    assert len(TOPOLOGY) >= 8
    assert len({json.dumps(topology(_line(p, "Using topology: {"))) for p in TOPOLOGY}) >= 5


@pytest.mark.parametrize("path", TOPOLOGY, ids=lambda p: f"{p.parent.name}/{p.name[:60]}")
def test_deepspeeds_topology_line_gives_the_layout_read_by_hand(path):
    # ``Using topology: {ProcessCoord(pipe=0, data=0, model=0): 0, ..., ProcessCoord(pipe=1, data=7,
    # model=0): 15}`` (Megatron-DeepSpeed and gpt-neox runs, behind whatever prefix their launcher put)
    want = json.loads(path.with_name(path.stem + ".expected.json").read_text())["layout"]
    got = topology(_line(path, "Using topology: {"))
    assert got == {k: want[k] for k in ("world_size", "tp", "pp", "dp")}


def test_a_topology_line_cut_short_states_nothing():
    # the same line cut where a collector or a terminal would cut it: the ranks listed are a part
    # of the world, so no layout is read from it
    line = _line(LOGS / "real" / "bigscience_gpt2-meg-ds-3d__meg_ds_3d_gpt2_perf_n16-ds-on.txt",
                 "Using topology: {")
    assert topology(line)["world_size"] == 64
    assert topology(line[:1000]) == {}
    # the last rank dropped and the brace put back: the axes make 64 ranks, the line lists 63
    assert topology(line[:line.rindex(", ProcessCoord")] + "}") == {}


def test_gpt_neox_states_its_gpus_and_its_config_keys():
    # gpt-neox's deepy.py (EleutherAI/gpt-neox#227, 2021): ``INFO:ConfigMonster:Total number of GPUs
    # determined to be: 1``, then its config as a dict with ``'pipe-parallel-size': 1,
    # 'model-parallel-size': 1``: a one-GPU run, not a log without a layout
    (path,) = (LOGS / "heldout6b").glob("*neox227.txt")
    assert parse_log(path).layout == {"world_size": 1, "tp": 1, "pp": 1, "dp": 1, "cp": None}
    # gpt-neox's YAML inside its args dump (Llemma, 2024): ``"pipe_parallel_size": 0,\n
    # "model_parallel_size": 2`` (0: no pipeline)
    (llemma,) = (LOGS / "heldout3o").glob("gpt_neox_2024*.txt")
    assert neox_sizes(_line(llemma, "config_files ....")) == {"pp": 1, "tp": 2}


def test_terminates_of_two_ranks_are_two_timeouts_a_subgroups_any_ranks():
    # torch 1.x (NVIDIA/nccl#719, 2022, inside a log viewer's box): no watchdog line logged, then
    # ``terminate called ...`` / ``what():  [Rank 0] Watchdog caught collective operation timeout:
    # WorkNCCL(SeqNum=1, ...)`` and the same for ``[Rank 1]``: two ranks' timeouts, two events
    (path,) = (LOGS / "heldout6e").glob("*nccl719.txt")
    timeouts = [f for f in parse_log(path).failure_records if f.kind == "nccl_timeout"]
    assert [(f.rank, f.count) for f in timeouts] == [(0, 1), (1, 1)]
    # torch 2.0 (huggingface/transformers#26724, 2023): the logger's own ``[E ProcessGroupNCCL.cpp:915]
    # [Rank 2] NCCL watchdog thread terminated with exception: [Rank 2] Watchdog caught ...`` line
    # after rank 0's: an event, not a repeat
    (path,) = (LOGS / "heldout6g").glob("*transformers26724.txt")
    assert [f.rank for f in parse_log(path).failure_records if f.kind == "nccl_timeout"] == [0, 2]
    # a subgroup's ``what():  [PG 1 Rank 0]`` repeats the timeout its rank's own line logged with the
    # process's rank (``[rank4]:``): one event per rank, sixteen ranks (heldout4w, sc24 tutorial)
    (path,) = (LOGS / "heldout4w").glob("torch_2025_vit_perlmutter*.txt")
    want = json.loads(path.with_name(path.stem + ".expected.json").read_text())["failures"]["counts"]
    assert sum(f.kind == "nccl_timeout" for f in parse_log(path).failure_records) == want["nccl_timeout"]


@pytest.mark.parametrize("stem, world", [
    # torch's c10d before 2.0 without its ``Rank N:`` prefix (OpenAccess-AI-Collective/axolotl#1041,
    # three machines): ``Completed store-based barrier for key:store_based_barrier_key:2 with 6 nodes.``
    ("axolotl1041", 6),
    # fairseq's banner over the devices gathered from every rank (facebookresearch/fairseq#2385, two
    # nodes): ``***********************CUDA enviroments for all 8 workers***********************``
    ("fairseq2385", 8),
])
def test_a_ranks_count_in_the_programs_own_words_is_the_world(stem, world):
    (path,) = (LOGS / "heldout6g").glob(f"*{stem}.txt")
    assert parse_log(path).layout["world_size"] == world


def test_two_processes_out_of_memory_at_one_size_on_two_devices_are_two_events():
    # DeepSpeed ZeRO-2 on two nodes (shibing624/MedicalGPT#318, 2023): two processes' ``torch.cuda
    # .OutOfMemoryError: CUDA out of memory. Tried to allocate 8.01 GiB. GPU 6 has a total capacty
    # ...`` and ``... GPU 1 ...``, each split after ``torch.cuda`` by the other's output, no rank prefix
    (path,) = (LOGS / "heldout6f").glob("deepspeed_zero2_2023*.txt")
    ooms = [f for f in parse_log(path).failure_records if f.kind == "gpu_oom"]
    assert [f.count for f in ooms] == [1, 1] and [f.line for f in ooms] == [2, 3]
    # and our engine's line (no device) with torch's error after it (``GPU 0 has a total capacity``)
    # stay one event: a real capped run on an H100 (tests/fixtures/logs/gpu/)
    ooms = [f for f in parse_log(LOGS / "gpu" / "labkit_h100_350m_cuda_oom_capped_2026.txt").failure_records
            if f.kind == "gpu_oom"]
    assert [(f.rank, f.count, f.line) for f in ooms] == [(0, 2, 19)]


DUMPED_MP = sorted(p for p in LOGS.rglob("*.txt") if p.with_name(p.stem + ".expected.json").exists()
                   and re.search(rb"\n\s*(?:\S+ )?\s*model_parallel_size \.{3,} *\d", p.read_bytes()))


@pytest.mark.parametrize("path", DUMPED_MP, ids=lambda p: f"{p.parent.name}/{p.name[:60]}")
def test_an_argument_dumps_model_parallel_size_is_tp(path):
    # gpt-neox's dump (EleutherAI/gpt-neox#792: ``model_parallel_size ............. 2``, beside
    # ``pipe_parallel_size .............. 1``), Megatron-DeepSpeed's ZeRO runs (BigScience)
    want = json.loads(path.with_name(path.stem + ".expected.json").read_text())["layout"]
    assert parse_log(path).layout["tp"] == want["tp"] is not None
    assert len(DUMPED_MP) >= 3


def test_a_step_time_with_its_unit_after_the_value_is_read_in_that_unit():
    # Megatron-Bridge (NVIDIA-NeMo/Megatron-Bridge#5306, 2026), one record over four lines:
    # ``iteration 5/50 | elapsed time per iteration: 21392.5 ms |`` / ``learning rate: ...``
    (path,) = (LOGS / "heldout6h").glob("megatron_bridge_2026*.txt")
    its = parse_log(path).iterations
    assert its["iteration"].tolist() == [5] and its["elapsed_ms"].tolist() == [21392.5]
    assert its["lr"].tolist() == [1.35e-4] and its["global_batch_size"].tolist() == [4096]


def test_horovodruns_prefix_names_the_rank_and_its_report_of_a_workers_exception_is_one():
    # horovodrun under Slurm (horovod/horovod#2097, 2020): ``Fri Sep 25 16:52:57 2020[1]<stderr>:User
    # function raise error: 2 root error(s) found.``: rank 1's function raised (TensorFlow's error)
    (path,) = (LOGS / "heldout6i").glob("horovod_2020*.txt")
    failures = parse_log(path).failure_records
    assert [(f.kind, f.rank) for f in failures] == [("python_exception", 1)]
    assert "2 root error(s) found" in failures[0].message


def test_sizes_named_with_their_size_suffix_state_the_layout():
    # MAGI-1 (SandAI-org/MAGI-1#31, 2025): ``Initializing with world_size=8, dp_size=1, tp_size=1,
    # pp_size=1, cp_size=8``
    (path,) = (LOGS / "heldout6m").glob("*magi1_31.txt")
    assert parse_log(path).layout == {"world_size": 8, "tp": 1, "pp": 1, "dp": 1, "cp": 8}


def test_a_step_of_the_steps_planned_glued_to_its_metrics_is_a_record():
    # zipnerf under accelerate, resumed (SuLvXiangXin/zipnerf-pytorch#78, 2023): ``2023-08-18 15:37:54:
    # 1/25000:loss=0.05934,psnr=20.902,lr=3.14e-06 | data=0.05782,...``
    (path,) = (LOGS / "heldout6p").glob("accelerate_2023_zipnerf*.txt")
    its = parse_log(path).iterations
    assert its[["iteration", "lm_loss", "lr"]].to_dict("records") == [
        {"iteration": 1, "lm_loss": 0.05934, "lr": 3.14e-06}]


INITIALIZED = sorted(p for p in LOGS.rglob("*.txt") if p.with_name(p.stem + ".expected.json").exists()
                     and b"model parallel with size" in p.read_bytes())


@pytest.mark.parametrize("path", INITIALIZED, ids=lambda p: f"{p.parent.name}/{p.name[:60]}")
def test_megatrons_groups_as_it_builds_them_state_tp_and_pp(path):
    # Megatron-LM's ``> initialized tensor model parallel with size 8`` / ``> initialized pipeline model
    # parallel with size 1`` (v1's ``> initializing model parallel with size 4``: TP), read alone,
    # against the hand reading of every log of the corpus that prints them
    from labkit.logs.stated import launcher_flags

    want = json.loads(path.with_name(path.stem + ".expected.json").read_text())["layout"]
    said = launcher_flags([ln for ln in path.read_text(errors="replace").splitlines()
                           if "parallel with size" in ln])
    said.pop("v1", None)  # v1's line marks the log as Megatron v1's (frames.layout_of: no pipeline)
    assert said and all(said[k] == want[k] for k in said), (said, want)
    assert len(INITIALIZED) >= 10


def test_rocms_runtime_on_a_hung_gpu_is_a_device_error():
    # ROCm on MI300X (ROCm/ROCm#4021, 2024): ``HW Exception by GPU node-9 (Agent handle: 0x...) reason
    # :GPU Hang`` from eleven processes (the first glued to a Trainer's bar), then ``Aborted (core dumped)``
    (path,) = (LOGS / "heldout6t").glob("rocm_2024*.txt")
    failures = parse_log(path).failure_records
    assert [f.kind for f in failures] == ["cuda_error"] and "GPU Hang" in failures[0].message


@pytest.mark.parametrize("stem", ["llamafactory975", "ascendpytorch43"])
def test_an_accelerators_runtime_errors_are_a_log_not_refused(stem):
    # Ascend NPUs (hiyouga/LLaMA-Factory#975, Ascend/pytorch#43): ``NPU error, error code is 107020``,
    # ``EI0002: The wait execution of the Notify register times out``; every line behind ``worker-1: ``
    # (a node's prefix, not a config's key)
    from labkit.logs import found_nothing

    (path,) = (LOGS / "heldout6t").glob(f"*{stem}.txt")
    parsed = parse_log(path)
    assert not found_nothing(parsed) and parsed.findings[0]["kind"] == "no_iteration"


def test_xla_dists_prefix_names_the_worker_and_its_traceback_is_read():
    # torch_xla's xla_dist on a TPU pod (Lightning-AI/pytorch-lightning#7197, 2021): ``2021-04-23 18:14:43
    # 10.164.0.29 [3]   File ".../device_parser.py", line 104, in parse_tpu_cores`` ... ``[3]
    # pytorch_lightning.utilities.exceptions.MisconfigurationException: No TPU devices were found.``
    (path,) = (LOGS / "heldout6t").glob("torch_xla_2021*.txt")
    failures = parse_log(path).failure_records
    assert [(f.kind, f.rank) for f in failures] == [("python_exception", 3)]
    assert failures[0].message.endswith("No TPU devices were found.")


def test_a_record_wrapped_after_a_named_value_and_its_comma_is_one_record():
    # CLIP4Clip (ArrowLuo/CLIP4Clip#4, 2021): ``... - INFO -   Epoch: 1/5, Step: 50/2812, Lr: 0.000000004,``
    # / ``Loss: nan, Time/step: 8.152810`` (seconds a step)
    (path,) = (LOGS / "heldout6r").glob("clip4clip*.txt")
    its = parse_log(path).iterations
    assert its["iteration"].tolist() == [50] and its["elapsed_ms"].tolist() == [8152.81]
    assert its["lm_loss"].isna().all() and its["lr"].tolist() == [4e-09]


def test_a_builtin_exceptions_line_without_its_traceback_is_an_exception():
    # pytest's report of a distributed test (huggingface/transformers#10188, 2021): ``FAILED ...`` then
    # ``RuntimeError: NCCL error in: ..., unhandled system error, NCCL version 2.7.8``, no traceback
    (path,) = (LOGS / "heldout6w").glob("*transformers10188.txt")
    assert [f.kind for f in parse_log(path).failure_records] == ["python_exception"]
    # and a Megatron fork's assertion after an iteration line, with a leading blank
    # (alibaba/Pai-Megatron-Patch#680): `` AssertionError: Rank 114: found NaN in local forward loss``
    (path,) = (LOGS / "heldout6n").glob("*pai680.txt")
    assert [f.kind for f in parse_log(path).failure_records] == ["python_exception"]


def test_determineds_task_prefix_without_a_rank_is_a_prefix():
    # Determined's trial log (determined-ai/determined#8915, 2024): ``[2024-02-27T21:35:34.295539Z]
    # fa88a9df || Traceback (most recent call last):`` and the launcher's frames, cut by the excerpt
    (path,) = (LOGS / "heldout6v").glob("torchrun_2024_determined*.txt")
    assert [f.kind for f in parse_log(path).failure_records] == ["python_exception"]


def test_deepspeeds_runner_on_localhost_is_a_host_prefix():
    # DeepSpeed's pdsh runner names the head host ``localhost`` (stark-sim's lock-clock runs, 2026):
    # ``localhost: [rank0]: Traceback ...``, its frames, and ``localhost: [rank0]:
    # torch.distributed.DistBackendError: NCCL error in: ..., unhandled cuda error``: one CUDA error of
    # rank 0 (the traceback ends in it), beside the launcher's exit -11
    (path,) = (LOGS / "heldout6u").glob("*dual32.txt")
    failures = parse_log(path).failure_records
    assert sorted(f.kind for f in failures) == ["child_failed", "cuda_error"]
    assert next(f for f in failures if f.kind == "cuda_error").rank == 0


def test_the_ddp_tutorials_epoch_lines_are_a_log_not_refused():
    # PyTorch's multinode DDP tutorial under srun (aws-samples/awsome-distributed-training PR 1039, 2026):
    # ``0: [RANK 3] Epoch 0 | Batchsize: 32 | Steps: 235 | Loss: 0.24456023513240382`` and ``Epoch 0 |
    # Training snapshot saved at ./snapshot.pt``: per-epoch summaries, no step records, no failure
    from labkit.logs import found_nothing

    (path,) = (LOGS / "heldout6y").glob("*awsome1039.txt")
    parsed = parse_log(path)
    assert not found_nothing(parsed) and parsed.iterations.empty and not parsed.failure_records
