"""Systems lines of the eighth round: traceback tails behind a logger's prefix or with no frame line
kept, torch's global rank behind Ray's prefix, a program's count of its GPUs, an MLPerf run's own end,
NCCL's CUDA errors. Every line is copied from a real log: a held-out log (tests/fixtures/logs/heldoutXX,
its README names the issue thread) or the public source named beside it; the expected values were read
by hand."""

from __future__ import annotations

from labkit.logs import parse_lines
from labkit.logs.lines import clean_line, strip_prefixes

# heldout4o's ray44533 (ray-project/ray issue 44533): a traceback tail behind Ray's actor prefix and
# vLLM's logger prefix with a month-day stamp
VLLM_TAIL = [
    '(RayWorkerVllm pid=7602) ERROR 04-07 00:57:46 ray_utils.py:45]     return func(*args, **kwargs)',
    ('(RayWorkerVllm pid=7602) ERROR 04-07 00:57:46 ray_utils.py:45]   File "/root/miniconda3/lib'
     '/python3.10/site-packages/torch/distributed/distributed_c10d.py", line 2050, in all_reduce'),
    ('(RayWorkerVllm pid=7602) ERROR 04-07 00:57:46 ray_utils.py:45]     work = group.allreduce(['
     'tensor], opts)'),
    ('(RayWorkerVllm pid=7602) ERROR 04-07 00:57:46 ray_utils.py:45] torch.distributed.DistBacken'
     'dError: NCCL error in: /root/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1333,'
     ' internal error - please report this issue to the NCCL developers, NCCL version 2.18.6'),
    ('(RayWorkerVllm pid=7602) ERROR 04-07 00:57:46 ray_utils.py:45] ncclInternalError: Internal '
     'check failed.'),
    '(RayWorkerVllm pid=7602) ERROR 04-07 00:57:46 ray_utils.py:45] Last error:',
    '(RayWorkerVllm pid=7602) ERROR 04-07 00:57:46 ray_utils.py:45] Attribute busid of node nic not found',
]
# heldout4o's ray13480 (ray-project/ray issue 13480): a tail posted from a frame's ``File`` at the
# margin, between the user's rules
HEADLESS_TAIL = [
    '-------------------edite line----------------',
    ('File "/root/miniconda3/lib/python3.7/site-packages/ray/util/sgd/torch/training_operator.py"'
     ', line 165, in <listcomp>'),
    '    for model in models',
    ('  File "/root/miniconda3/lib/python3.7/site-packages/torch/nn/parallel/distributed.py", lin'
     'e 333, in __init__'),
    '    self.broadcast_bucket_size)',
    ('  File "/root/miniconda3/lib/python3.7/site-packages/torch/nn/parallel/distributed.py", lin'
     'e 549, in _distributed_broadcast_coalesced'),
    '    dist._broadcast_coalesced(self.process_group, tensors, buffer_size)',
    ('RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:518, unhandled sy'
     'stem error, NCCL version 2.4.8'),
    '-------------------edite line----------------',
]
# heldout4m's horovod1651 (horovod/horovod issue 1651): a TensorFlow traceback tail, two blanks after
# the exception's colon
TF_TAIL = [
    ('\t [[node HorovodBroadcast_conv1_bn_moving_mean_0 (defined at <string>:234) ]] [Op:__inferen'
     'ce_benchmark_step_15833]'),
    '',
    'Function call stack:',
    'benchmark_step',
    '',
    '    self.captured_inputs)',
    ('  File "/usr/local/lib/python3.6/dist-packages/tensorflow/python/eager/function.py", line 1'
     '746, in _call_flat'),
    '    ctx, args, cancellation_manager=cancellation_manager))',
    '  File "/usr/local/lib/python3.6/dist-packages/tensorflow/python/eager/function.py", line 598, in call',
    '    ctx=ctx)',
    ('  File "/usr/local/lib/python3.6/dist-packages/tensorflow/python/eager/execute.py", line 60'
     ', in quick_execute'),
    '    inputs, attrs, num_outputs)',
    'tensorflow.python.framework.errors_impl.UnknownError:  ncclCommInitRank failed: unhandled system error',
    ('\t [[node HorovodBroadcast_conv1_bn_moving_mean_0 (defined at <string>:234) ]] [Op:__inferen'
     'ce_benchmark_step_15833]'),
    '',
    'Function call stack:',
    'benchmark_step',
    '',
    'srun: error: jwc09n018: task 1: Exited with exit code 1',
    'srun: error: jwc09n012: task 0: Exited with exit code 1',
]
# heldout4b's ds2931 (deepspeedai/DeepSpeed issue 2931): C++'s terminate message, then NCCL's error
# string at the margin (no traceback)
CXX_WHAT = [
    "terminate called after throwing an instance of 'std::runtime_error'",
    '  what():  NCCL error: unhandled system error, NCCL version 2.14.3',
    'ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. ',
]


def _kinds(lines: list[str]) -> list[tuple[str, int | None]]:
    return [(f.kind, f.rank) for f in parse_lines(lines).failure_records]


def test_a_traceback_tail_behind_a_loggers_month_day_prefix_is_an_exception() -> None:
    assert clean_line(VLLM_TAIL[1]).text.startswith('  File "/root/miniconda3/')
    # the same prefix in vLLM 2025 (a file's place in brackets): NVIDIA/nccl issue 2101
    assert strip_prefixes("(Worker pid=509) ERROR 04-13 19:52:24 [multiproc_executor.py:800] Traceback "
                          "(most recent call last):")[0] == "Traceback (most recent call last):"
    (f,) = parse_lines(VLLM_TAIL).failure_records
    assert (f.kind, f.line) == ("python_exception", 4)
    assert f.message.startswith("torch.distributed.DistBackendError: NCCL error in:")


def test_an_exception_line_after_a_frames_code_line_ends_a_headless_tail() -> None:
    (f,) = parse_lines(HEADLESS_TAIL).failure_records
    assert (f.kind, f.line) == ("python_exception", 8)
    assert f.message.startswith("RuntimeError: NCCL error in:")
    (g,) = parse_lines(TF_TAIL).failure_records
    assert g.kind == "python_exception" and "ncclCommInitRank failed" in g.message
    assert _kinds(CXX_WHAT) == []  # C++'s ``  what():`` is no frame's code line


def test_torchs_global_rank_prefix_beats_the_process_groups_rank_of_the_message() -> None:
    # heldout4m's verl1309 (verl-project/verl issue 1309): ``[rank15]:`` behind Ray's prefix, ``[Rank 1]``
    # of the mesh_tp group
    line = ('`[2025-05-10 00:18:21] (WorkerDict pid=1230, ip=train-1316148307689748608-9zzm714v3bpc-work'
            'er-0) [rank15]:[E510 00:18:19.328053719 ProcessGroupNCCL.cpp:629] [Rank 1] Watchdog caught '
            'collective operation timeout: WorkNCCL(SeqNum=3, OpType=BROADCAST, NumelIn=1, NumelOut=1, T'
            'imeout(ms)=1800000) ran for 1800041 milliseconds before timing out.')
    assert _kinds([line]) == [("nccl_timeout", 15)]


def test_a_programs_count_of_its_gpus_is_the_world_size() -> None:
    for line, n in (("2023-10-17 00:37:57,247 semantic_segmentation INFO: Using 2 GPUs", 2),  # heldout4i's
                    #                                                  (aaryangrg/CIRKD, outs/train.out)
                    ("[0]<stdout>:Number of GPUs: 1", 1),  # heldout4m's (horovod/horovod issue 2686)
                    # fairseq 0.4: facebookresearch/fairseq issue 103
                    ("| using 3 GPUs (with max tokens per GPU = 2000 and max sentences per GPU = None)", 3),
                    # fairseq 1.x: facebookresearch/fairseq examples/fully_sharded_data_parallel/README.md
                    ("2021-03-08 18:04:09 | INFO | fairseq_cli.train | training on 8 devices (GPUs/TPUs)",
                     8)):
        assert parse_lines([line]).layout["world_size"] == n, line


def test_a_run_that_reports_its_own_end_did_not_hang() -> None:
    # heldout4d's jax_2021 MLPerf ResNet (mlcommons/training_results_v1.0): its last line
    line = ('I0518 21:43:27.300133 431419 mllog.py:168] :::MLLOG {"namespace": 22, "time_ms": 1621399407'
            '300, "event_type": "INTERVAL_END", "key": "run_stop", "value": null, "metadata": {"file": "'
            '/export/hda3/borglet/local_ram_fs_dirs/0.prod.resnet_jax.4x4x8.exp0.emizan.180106664431.8f4'
            'f9f98cb7a3055/imagenet_par_0/imagenet.par/google3/third_party/mlperf/submissions/training/v'
            '1_0/models/resnet_jax/train.py", "lineno": 450, "status": "success"}}')
    (f,) = parse_lines([line]).findings
    assert (f["kind"], f["line"]) == ("run_ended", 1) and "status success" in f["message"]
    assert "hung" not in f["message"]


def test_nvls_failing_to_bind_multicast_memory_is_a_cuda_error() -> None:
    # pytorch/pytorch pull request 177472 (its description quotes the error, NCCL 2.29.3)
    line = ("Failed to bind NVLink SHARP (NVLS) Multicast memory of size 2097152 : CUDA error 401 'the "
            "operation cannot be performed in the present state'. ")
    assert _kinds([line]) == [("cuda_error", None)]
