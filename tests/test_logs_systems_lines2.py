"""More systems lines read by general rules, from real lines: an nccl-tests table whose rows NCCL's
own lines and an elision interrupt, the parallel sizes a config states by Megatron's key names, a
device mesh given by name=size, an exception that wraps one raised elsewhere (Ray's), a vendor's NCCL
version, a table's collective named on a command line above it, a program's count of its ranks, an
inference engine's sizes in a config, tracebacks glued by processes sharing a pipe.

Each line is a line of a public log, its source named beside it (the corpus logs' sources are in
tests/fixtures/logs/real/README.md); the expected values are read from the lines by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.logs import parse_lines
from labkit.logs.stated import launcher_flags

HEADER = ["#" + " " * 62 + "out-of-place" + " " * 23 + "in-place" + " " * 10,
          "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   "
          "algbw   busbw #wrong",
          "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  "
          "(GB/s)  (GB/s)       "]
# NERSC/nccl-ofi-plugin logs-regression/slurm-test-2.23-918499.out (nccl-tests, NCCL_DEBUG=INFO)
NERSC = HEADER + [
    "nid001049:626823:626937 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
    "nid001049:626824:626935 [1] NCCL INFO Channel 01/0 : 1[1] -> 2[2] via P2P/CUMEM/read",
    "nid001049:626823:626961 [0] NCCL INFO Connected all trees",
    "nid001052:1734314:1734434 [2] NCCL INFO Connected all trees",
    "           8             2     float     sum      -1    23.88    0.00    0.00      0    19.22    "
    "0.00    0.00      0",
    "nid001049:626823:626937 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
    "          16             4     float     sum      -1    18.91    0.00    0.00      0    18.78    "
    "0.00    0.00      0",
    "nid001049:626826:626826 [2] NCCL INFO comm 0x119e520 rank 2 nranks 8 cudaDev 2 busId 82000 - Destroy "
    "COMPLETE",
    "# Out of bounds values : 0 OK",
    "# Avg bus bandwidth    : 12.4743 "]
# NVIDIA/nccl issue 1184 (a user's table, rows left out as "...")
ELIDED = HEADER[1:] + [
    "           8             2     float     sum      -1    130.1    0.00    0.00      0    118.6    "
    "0.00    0.00      0",
    "...",
    "      262144         65536     float     sum      -1    325.1    0.81    0.81      0    325.3    "
    "0.81    0.81      0",
    "      524288        131072     float     sum      -1    663.1    0.79    0.79  237858    569.4    "
    "0.92    0.92  238038"]


@pytest.mark.parametrize(("lines", "sizes", "avg"), [(NERSC, [8, 16], 12.4743),
                                                      (ELIDED, [8, 262144, 524288], None)])
def test_a_table_is_every_row_after_its_header_whatever_nccl_prints_between(lines, sizes, avg):
    (t,) = parse_lines(lines).nccl_tests
    assert [r["size_bytes"] for r in t["rows"]] == sizes
    assert t["avg_busbw_gbps"] == avg


# nemo_2024_mlperf_llama2_lora (MLPerf Training 4.0, Lambda: srun --label, NeMo's YAML config)
MLPERF = [" 0:       tensor_model_parallel_size: 4", " 0:       pipeline_model_parallel_size: 1",
          " 0:       context_parallel_size: 2"]
# verl under Ray (Pai-Megatron-Patch examples/moonlight/patch_verl_demo_megatron.log): its pretty-printed
# config, and the model's TransformerConfig (the line's first fields)
VERL_DICT = ["\x1b[36m(TaskRunner pid=11874)\x1b[0m                                  'megatron': "
             "{'context_parallel_size': 1,",
             "\x1b[36m(TaskRunner pid=11874)\x1b[0m                                               "
             "'tensor_model_parallel_size': 2,"]
VERL_TF = ("TF config: TransformerConfig(tensor_model_parallel_size=2, "
           "pipeline_model_parallel_comm_backend=None, pipeline_model_parallel_size=1, "
           "virtual_pipeline_model_parallel_size=None, sequence_parallel=True, context_parallel_size=1,"
           " hierarchical_context_parallel_sizes=None, expert_model_parallel_size=1, "
           "expert_tensor_parallel_size=2, moe_extended_tp=False,")
# NeMo 2 on GKE (AI-Hypercomputer/gpu-recipes): model_parallel_size is NeMo's TP x PP, no number here
NEMO_GKE = ["|     model_parallel_size: ${multiply:${model.tensor_model_parallel_size}, "
            "${model.pipeline_model_parallel_size}}",
            "|   tensor_model_parallel_size: 2", "|   pipeline_model_parallel_size: 2"]
# torchtitan run log (outputs/autoresearch/may19-qwen3-14b/run51.../run.log), behind torchrun's --tee prefix
TITAN = ("[rank0]:[titan] 2026-05-19 15:14:36,056 - root - INFO - Building device mesh with parallelism: "
         "pp=1, dp_replicate=1, dp_shard=8, cp=1, tp=1, ep=1")


@pytest.mark.parametrize(("lines", "sizes"), [
    (MLPERF, {"tp": 4, "pp": 1, "cp": 2}),
    (VERL_DICT, {"tp": 2, "cp": 1}),
    ([VERL_TF], {"tp": 2, "pp": 1, "cp": 1}),
    (NEMO_GKE, {"tp": 2, "pp": 2}),
    ([TITAN], {"world_size": 8, "dp": 8, "tp": 1, "pp": 1, "cp": 1}),
])
def test_the_parallel_sizes_a_line_states_by_name(lines, sizes):
    assert launcher_flags(lines) == sizes


def test_the_parallel_sizes_of_a_config_give_the_layout():
    lay = parse_lines(["Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/16"] + MLPERF).layout
    assert lay == {"world_size": 16, "tp": 4, "pp": 1, "dp": 2, "cp": 2}


# the same verl log: the driver's traceback through Ray's RayTaskError(ImportError) (frames shortened)
RAY = ["Traceback (most recent call last):",
       '  File "/usr/local/lib/python3.10/dist-packages/ray/_private/worker.py", line 930, in get_objects',
       "    raise value.as_instanceof_cause()",
       "ray.exceptions.RayTaskError(ImportError): \x1b[36mray::TaskRunner.run()\x1b[39m (pid=11874, "
       "ip=172.23.224.85, actor_id=ceec4a405ceba3120ba2457301000000, "
       "repr=<verl_entrypoint.TaskRunner object at 0x7f7df4fa11e0>)",
       '  File "/mnt/data/jerry.lp/Pai-Megatron-Patch/verl_patch/models/mcore/registry.py", line 41, '
       'in <module>',
       "    from .model_initializer import (",
       "ImportError: cannot import name 'MoonlightModel' from 'verl_patch.models.mcore.model_initializer' "
       "(/mnt/data/jerry.lp/Pai-Megatron-Patch/verl_patch/models/mcore/model_initializer.py)"]


def test_an_exception_wrapping_one_raised_elsewhere_ends_at_the_wrapped_ones_line():
    (f,) = parse_lines(RAY).failures.to_dict("records")
    assert (f["kind"], f["line"]) == ("python_exception", 7)
    assert f["message"].startswith("ImportError: cannot import name 'MoonlightModel'")


# torchtitan run log (as above, tests/fixtures/logs/heldout3o/, README there): torchrun's ChildFailedError
# table after the line that raises it, each rank's entry with a traceback field (its frames left out here)
TITAN_LOG = (Path(__file__).parent / "fixtures" / "logs" / "heldout3o"
             / "torchtitan_2026_torchrun_tee_flex_oom_first_step_childfailed_table_tracebacks_8_ranks_"
               "autoresearch.txt")


def test_a_long_child_failed_table_names_its_root_cause_not_the_ranks_it_stopped():
    lines = TITAN_LOG.read_text(encoding="utf-8").splitlines()
    start = next(i for i, t in enumerate(lines) if t.startswith("torch.distributed.elastic.multiprocessing"
                                                                ".errors.ChildFailedError"))
    table = [t for t in lines[start:] if not t.startswith("    ")]
    assert len(table) == 80
    (f,) = [f for f in parse_lines(table).failures.to_dict("records") if f["kind"] == "child_failed"]
    assert f["rank"] == 0
    assert "root cause rank 0 (local_rank: 0)" in f["message"]
    assert "root cause rank 4" not in f["message"] and "root cause rank 5" not in f["message"]


# MLPerf Training v2.1, Azure NC96ads_A100_v4 (mlcommons/training_results_v2.1: rnnt result_0.txt and
# Mask R-CNN 221013184720346087694_1.log): a vendor's NCCL build names itself glued to the number
AZURE_BANNER = ["NCCL version 2.12.6azure3+cuda11.4"]


def test_a_vendor_build_tag_is_part_of_the_nccl_version():
    p = parse_lines(AZURE_BANNER)
    assert (p.nccl_version, p.nccl_build) == ("2.12.6azure3", "cuda11.4")


# nccl-tests under srun with PMIx (Oracle, MLPerf Training results): the program named on the command
# line, the PMIx client's start-up errors between it and nccl-tests' header (two of eight kept)
ORACLE = ["+ srun --mpi=pmix --ntasks=8 --ntasks-per-node=8 --container-name=image_classification_555 "
          "all_reduce_perf_mpi -b 51.2M -e 51.2M -d half -G 1",
          "[compute-hpc-node-73:348287] PMIX ERROR: ERROR in file gds_ds12_lock_pthread.c at line 168",
          "[compute-hpc-node-73:348289] PMIX ERROR: ERROR in file gds_ds12_lock_pthread.c at line 168",
          "# nThread 1 nGpus 1 minBytes 53687091 maxBytes 53687091 step: 1048576(bytes) warmup iters: 5 "
          "iters: 20 agg iters: 1 validation: 1 graph: 1",
          "#", *HEADER,
          "    53687090      26843545      half     sum      -1    287.0  187.07  327.37      0    287.6  "
          "186.67  326.68      0",
          "# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 327.025 "]


def test_a_table_takes_its_collective_from_the_program_named_above_it():
    p = parse_lines(ORACLE)
    (t,) = p.nccl_tests
    assert (t["op"], len(t["rows"]), t["avg_busbw_gbps"]) == ("all_reduce", 1, 327.025)
    (f,) = [f for f in p.findings if f["kind"] == "nccl_tests"]
    assert f["message"].startswith("nccl-tests all_reduce_perf:")


# A program's own count of its ranks: MLPerf Mask R-CNN (Azure, as above) per rank, MLPerf BERT
# (training_results_v1.1 Dell DSS8440x8A100-PCIE-40GB bert result_0.txt, v3.1 Clemson 36 ranks);
# LLaMA-Factory (ywhijn/moe-project-7101 sft.log, 8 ranks) prints Hugging Face's n_gpu: 1 per process
MASKRCNN = ("2 :: dedicated_evaluation_ranks = 0, num_training_ranks = 4, images_per_batch_train = 96, "
            "images_per_gpu_train = 24, rank_train = 2, rank_in_group_train = 0, "
            "spatial_group_size_train = 1, num_evaluation_ranks = 4, images_per_batch_test = 96, "
            "images_per_gpu_test = 24, rank_test = 2, rank_in_group_test = 0, spatial_group_size_test = 1\r")
BERT = "device: cuda:0 n_gpu: 8, distributed training: True, 16-bits training: True"
BERT_36 = "15: device: cuda:1 n_gpu: 36, distributed training: True, 16-bits training: True"
LLAMAFACTORY = ("[INFO|2024-12-04 06:01:59] llamafactory.hparams.parser:355 >> Process rank: 0, device: "
                "cuda:0, n_gpu: 1, distributed training: True, compute dtype: torch.bfloat16")


@pytest.mark.parametrize(("line", "world"), [(MASKRCNN, 4), (BERT, 8), (BERT_36, 36), (LLAMAFACTORY, None)])
def test_a_programs_count_of_its_ranks_is_the_world_size(line, world):
    assert launcher_flags([line]).get("world_size") == world


# verl (Foo1szz/verl train.out, GRPO on one GPU): the config's rollout section names vLLM's sizes by
# Megatron's key names; the section ends at a key as shallow as its own (lines between left out)
RAY_PREFIX = "\x1b[36m(TaskRunner pid=625502)\x1b[0m "
VERL_ROLLOUT = [RAY_PREFIX + " " * 23 + "'rollout': {'_target_': 'verl.workers.config.RolloutConfig',",
                RAY_PREFIX + " " * 35 + "'pipeline_model_parallel_size': 1,",
                RAY_PREFIX + " " * 35 + "'tensor_model_parallel_size': 1,",
                RAY_PREFIX + " 'algorithm': {'_target_': 'verl.trainer.config.AlgoConfig',"]


# the Pai-Megatron-Patch verl log above: its rollout section, then the critic's Megatron sizes
PAI_PREFIX = "\x1b[36m(TaskRunner pid=11874)\x1b[0m "
PAI = [PAI_PREFIX + " " * 23 + "'rollout': {'agent': {'custom_async_server': {'name': None,",
       PAI_PREFIX + " " * 35 + "'tensor_model_parallel_size': 2,",
       PAI_PREFIX + " 'critic': {'checkpoint': {'async_save': False,",
       PAI_PREFIX + " " * 12 + "'megatron': {'context_parallel_size': 1,",
       PAI_PREFIX + " " * 25 + "'tensor_model_parallel_size': 1,"]


def test_an_inference_engines_sizes_are_not_the_layout():
    assert launcher_flags(VERL_ROLLOUT) == {}
    assert launcher_flags(PAI) == {"cp": 1, "tp": 1}  # after the section: read


# torchrun's workers writing through one pipe with no prefix (MLPerf Training v3.0, Azure ND_H100_v5
# Mask R-CNN 230503232823702563316_1.log): tracebacks glued, a frame's code line at the margin; a
# subset of lines 1245-1402, in order
GLUED = ["Traceback (most recent call last):",
         '  File "maskrcnn/tools/train_mlperf.py", line 1139, in <module>',
         "Traceback (most recent call last):",
         '  File "maskrcnn/tools/train_mlperf.py", line 1139, in <module>',
         "    Traceback (most recent call last):",
         "main()",
         '  File "maskrcnn/tools/train_mlperf.py", line 1128, in main',
         "super().__init__(open(name, mode))",
         "FileNotFoundError",
         ": FileNotFoundErrorsuper().__init__(open(name, mode))",
         "FileNotFoundError: [Errno 2] No such file or directory: '/coco_train2017_pyt/"
         "coco_train2017_img_info.pyt'[Errno 2] No such file or directory: '/coco_train2017_pyt/"
         "coco_train2017_img_info.pyt': "]


def test_glued_tracebacks_end_at_the_exceptions_own_line():
    (f,) = parse_lines(GLUED).failures.to_dict("records")
    assert (f["kind"], f["line"]) == ("python_exception", 11)
    assert f["message"].startswith("FileNotFoundError: [Errno 2] No such file or directory")
