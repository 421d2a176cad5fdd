"""Systems lines read by general rules, from real lines: Python logging and Ray prefixes (the
logger a prefix names), the world size stated by a key, torch elastic's JSON error records, a
traceback a log cuts before its exception line.

Each line is a line of a public log, its source named beside it (the corpus logs' sources are in
tests/fixtures/logs/real/README.md); the expected values are read from the lines by hand.
"""

from __future__ import annotations

import pytest

from labkit.logs import found_nothing, parse_lines
from labkit.logs.lines import clean_line
from labkit.logs.stated import stated_world_size

# torchrun_2021_elastic_worker_group_failed_restart_rendezvous_result_world_sizes_doc2edag24.txt
ELASTIC = ("INFO:torch.distributed.elastic.agent.server.api:[default] Worker group FAILED. 3/3 attempts "
           "left; will restart worker group")
# torchrun_2021_elastic_launch_configs_error_handler_json_rendezvous_connection_error_pytorch64926.txt
ELASTIC_OP = "[INFO] 2021-09-13 22:17:26,653 api: Starting elastic_operator with launch configs:"
RECORD = ["[ERROR] 2021-09-13 22:18:26,678 error_handler: {",
          '  "message": {',
          '    "message": "RendezvousConnectionError: The connection to the C10d store has failed. See inner '
          'exception for details.",']
# slurm_2021_submitit_step_cancelled_then_job_preemption_bypassing_signal_traceback_submitit1613.txt
SUBMITIT = "submitit WARNING (2021-03-15 17:50:23,701) - Bypassing signal 15"
CUT = ["submitit ERROR (2021-03-15 18:45:40,210) - Submitted job triggered an exception",
       "Traceback (most recent call last):",
       '  File "/private/home/sdascoli/.conda/envs/bert/lib/python3.7/runpy.py", line 193, in '
       '_run_module_as_main',
       '    "__main__", mod_spec)',
       '  File "/private/home/sdascoli/.conda/envs/bert/lib/python3.7/runpy.py", line 85, in _run_code',
       "    exec(code, run_globals)"]
# https://github.com/huggingface/accelerate/issues/157: a traceback ending in a CUDA error, then a second
# one the excerpt cuts before its exception line
TWO_TRACEBACKS = [
    'Traceback (most recent call last):',
    '  File "train.py", line 116, in <module>',
    '    args.bucket, args.batch_size, args.max_len, args.epochs)',
    '  File "train.py", line 81, in main',
    '    accelerator, step, batch_size * max_len)',
    '  File "train.py", line 28, in train',
    '    optimizer.step()',
    '  File "/opt/conda/lib/python3.7/site-packages/accelerate/optimizer.py", line 119, in step',
    '    self.optimizer.step(closure)',
    '  File "/opt/conda/lib/python3.7/site-packages/torch/optim/optimizer.py", line 88, in wrapper',
    '    return func(*args, **kwargs)',
    '  File "/home/hadaev99/stress_model/DemonRangerOptimizer/optimizers.py", line 471, in step',
    "    torch.ones_like(p.data) - group['dropout'])",
    'RuntimeError: CUDA error: unspecified launch failure',
    'CUDA kernel errors might be asynchronously reported at some other API call,so the stacktrace below '
    'might be incorrect.',
    'For debugging consider passing CUDA_LAUNCH_BLOCKING=1.',
    'Traceback (most recent call last):',
    '  File "train.py", line 116, in <module>',
    '    args.bucket, args.batch_size, args.max_len, args.epochs)',
    '  File "train.py", line 81, in main',
    '    accelerator, step, batch_size * max_len)',
    '  File "train.py", line 26, in train',
    '    accelerator.backward(loss)',
    '  File "/opt/conda/lib/python3.7/site-packages/accelerate/accelerator.py", line 401, in backward',
]
# torchelastic_2022_ray_commandactor_pid_prefix_rendezvous_result_world_size_2_torchx492.txt
RAY = ("ray/0 (CommandActor pid=494406) INFO:torch.distributed.elastic.agent.server.api:[] Starting worker "
       "group")
# torchrun_2025_glog_worker_group_restart_pytorch147064.txt
GLOG = ("I0213 12:07:20.086000 870572 torch/distributed/elastic/agent/server/api.py:699] [default] Stopping "
        "worker group")
# pytorch/pytorch pull request 64681's description (2021-09-08): the root-cause row's error record
TABLE_RECORD = ["[0]:", "  time: 2021-08-26_17:12:07", "  rank: 0 (local_rank: 0)",
                "  exitcode: 1 (pid: 8045)",
                "  error_file: /tmp/torchelastic_6cj9eppm/6d9d844a-6ce4-4838-93ed-1639a9525b00_rec9kuv3/"
                "attempt_0/0/error.json",
                "  msg:", "    {", '      "message": "ValueError: Test",', '      "extraInfo": {',
                '        "py_callstack": [']

# torchtitan_2025_pp_loss_minus_one_shell_trace_torchtitan1232.txt: a logger's name in brackets, then
# Python logging's own header
TITAN = ("[rank0]:[titan] 2025-05-28 21:11:37,626 - root - INFO - Trainer is initialized with local batch "
         "size 2, global batch size 2, sequence length 4096, total steps 10 (warmup 2).")
# nemo_2023_srun_label_init_member_of_8_nemo5819.txt
NEMO = ("0: [NeMo E 2023-01-18 07:39:42 exp_manager:423] You are running multi-node training without SLURM "
        "handling the processes. Please note that this is not tested in NeMo and could result in errors.")

# Python logging headers of other loops: icefall_valle_2023_epoch_batch_train_loss_brackets_lr_valle110.txt,
# albert_tf2_2020_mpirun_tag_logging_train_step_loss_it_s_dlmodels45.txt,
# vissl_2021_log_hooks_rank_semicolon_iter_lr_loss_btime_peak_mem_vissl480.txt (corpus logs);
# https://github.com/XuezheMax/apollo/issues/4 (fairseq 2020, ``TS | LEVEL | name | ``) and
# https://github.com/facebookresearch/fairseq/issues/5382 (hydra's ``[TS][name][LEVEL] - ``); the icefall,
# fairseq and hydra lines are their starts
ICEFALL = ("2023-05-01 13:03:54,309 INFO [trainer.py:757] Epoch 1, batch 164100, train_loss[loss=2.413, "
           "ArTop10Accuracy=0.7735, over 4777.00 frames. ]")
ALBERT = ("[1,0]<stdout>:2020-12-23 23:07:21,094 __main__    : INFO     Train step 1040 -- Loss: 11.174, "
          "MLM: 10.479, SOP: 0.695, MLM_acc: 0.000, SOP_acc: 0.521 -- It/s: 1.69")
VISSL = ("INFO 2021-12-02 18:52:20,806 log_hooks.py: 277: Rank: 0; [ep: 0] iter: 57; lr: 0.71785; loss: "
         "2.94718; btime(ms): 192; eta: 0:00:08; peak_mem(M): 4176;")
FAIRSEQ = ("2020-10-18 02:33:50 | INFO | fairseq.distributed_utils | distributed init (rank 0): "
           "tcp://localhost:17289")
HYDRA = "[2023-11-20 19:55:49,758][fairseq_cli.train][INFO] - {'_name': None, 'common': {'_name': None,"


@pytest.mark.parametrize("line, text, logger", [
    (ELASTIC, "[default] Worker group FAILED. 3/3 attempts left; will restart worker group",
     "torch.distributed.elastic.agent.server.api"),
    (ELASTIC_OP, "Starting elastic_operator with launch configs:", "api"),  # [LEVEL] time module:
    (RECORD[0], "{", "error_handler"),
    (SUBMITIT, "Bypassing signal 15", "submitit"),  # name LEVEL (time) -
    (RAY, "[] Starting worker group", "torch.distributed.elastic.agent.server.api"),  # Ray, then logging
    (GLOG, "[default] Stopping worker group", "torch.distributed.elastic.agent.server.api"),  # glog's path
    (TITAN, TITAN.split(" - INFO - ")[1], "titan root"),  # every logger named, outermost first
    (NEMO, NEMO.split("] ")[1], "NeMo"),
    (ICEFALL, ICEFALL.split("] ", 1)[1], "trainer.py"),
    (ALBERT, ALBERT.split("INFO     ")[1], "__main__"),
    (VISSL, VISSL.split("277: ")[1], "log_hooks.py"),
    (FAIRSEQ, FAIRSEQ.split("utils | ")[1], "fairseq.distributed_utils"),
    (HYDRA, HYDRA.split("] - ")[1], "fairseq_cli.train"),
])
def test_a_logging_prefix_is_taken_off_and_names_its_logger(line, text, logger):
    got = clean_line(line)
    assert (got.text, got.logger) == (text, logger)


# torchrun_glog_sigterm_exitcode1_unsloth10.txt: a payload without a tool's word behind torch's logger
SIGTERM = ("W0801 13:23:17.366000 32974 torch/distributed/elastic/multiprocessing/api.py:900] Sending "
           "process 33051 closing signal SIGTERM")


@pytest.mark.parametrize("line", [ELASTIC, SIGTERM])
def test_a_log_of_torch_elastic_lines_is_a_log(line):
    """A torch elastic line, by its words or by the logger its prefix names, makes a log; with no
    iteration the finding says where it stopped."""
    p = parse_lines([line])
    assert p.tools == ["torch"] and not found_nothing(p)
    assert [(f["kind"], f["line"]) for f in p.findings] == [("no_iteration", 1)]


@pytest.mark.parametrize("line, size", [
    ("  global_world_sizes=[4, 4, 4, 4]", 4),  # doc2edag24: every local worker's world size
    ("ray/0 (CommandActor pid=494406)   global_world_sizes=[2]", 2),  # torchx492
    ("  group_world_size=1", None),  # doc2edag24: agents (nodes), not ranks
    ("  role_world_sizes=[4, 4, 4, 4]", None),  # the role's, the world only with one role
    # deepspeed_mlprof_2023_mpi_32_ranks_quoted_indented_step_dt_batch_loss_lines_vault.txt
    ("[2023-01-11 16:20:40,393] [INFO] [comm.py:690:mpi_discovery] Discovered MPI settings of world_rank=6, "
     "local_rank=6, world_size=32, master_addr=10.140.57.110, master_port=29500", 32),
    ("[INFO] 2021-09-13 22:17:26,653 run: Using nproc_per_node=2.", None),  # pytorch64926: one node's
    # https://github.com/facebookresearch/fairseq/issues/940 (2019): the start of fairseq's Namespace line
    ("Namespace(adam_betas='(0.9, 0.997)', adam_eps=1e-08, adaptive_softmax_cutoff=None, "
     "adaptive_softmax_dropout=0, arch='transformer_wmt_en_de_big', attention_dropout=0.1, "
     "bucket_cap_mb=150, clip_norm=25, "
     "criterion='label_smoothed_cross_entropy', data=['./data/train_data'], ddp_backend='no_c10d', "
     "decoder_attention_heads=16, decoder_embed_dim=1024, decoder_embed_path=None, "
     "decoder_ffn_embed_dim=4096, "
     "decoder_input_dim=1024, decoder_layers=6, decoder_learned_pos=False, decoder_normalize_before=False, "
     "decoder_output_dim=1024, device_id=0, distributed_backend='nccl', distributed_init_host='localhost', "
     "distributed_init_method='tcp://localhost:12653', distributed_port=12654, distributed_rank=0, "
     "distributed_world_size=4, dropout=0.3,", 4),
    # https://github.com/facebookresearch/fairseq/issues/5382 (2023): a part of fairseq-hydra-train's config
    ("'distributed_training': {'_name': None, 'distributed_world_size': 4, 'distributed_num_procs': 4, "
     "'distributed_rank': 0, 'distributed_backend': 'nccl',", 4),
])
def test_the_world_size_is_read_by_what_its_key_counts(line, size):
    assert stated_world_size(line) == size


def test_a_json_error_record_is_the_exception_it_carries():
    """torch 1.9's error_handler record, cut after its message (pytorch64926's excerpt ends so)."""
    p = parse_lines([ELASTIC_OP, *RECORD])
    assert [(f.kind, f.line) for f in p.failure_records] == [("python_exception", 2)]
    assert p.failure_records[0].message.startswith("RendezvousConnectionError: The connection to the C10d")


def test_an_error_record_in_the_root_cause_row_is_the_workers_exception():
    p = parse_lines(["Root Cause:", *TABLE_RECORD])
    kinds = {f.kind: f.message for f in p.failure_records}
    assert kinds["python_exception"] == "ValueError: Test"


def test_a_traceback_cut_before_its_exception_line_is_an_exception():
    p = parse_lines(CUT)
    assert [(f.kind, f.line) for f in p.failure_records] == [("python_exception", 2)]
    assert "runpy.py\", line 85, in _run_code" in p.failure_records[0].message
    # told after what the log states: a scheduler's end above it comes first
    slurm = ["slurmstepd: error: *** JOB 37361369 ON learnfair5146 CANCELLED AT 2021-03-15T18:00:46 DUE TO "
             "PREEMPTION ***", *CUT]
    assert [f.kind for f in parse_lines(slurm).failure_records] == ["preempted", "python_exception"]
    # with its exception line the traceback is that exception
    whole = parse_lines([*CUT, "ValueError: x"])
    assert [(f.kind, f.message) for f in whole.failure_records] == [("python_exception", "ValueError: x")]


def test_a_cut_traceback_beside_a_reported_failure_is_that_failures():
    p = parse_lines(TWO_TRACEBACKS)
    assert [(f.kind, f.line) for f in p.failure_records] == [("cuda_error", 14)]
