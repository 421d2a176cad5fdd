"""Systems lines read by general rules, from real lines (a fourth set): which ENOSPC is a full disk,
a world size a script states by its ranks' ``Rank N size M`` lines, an nccl-tests row Open MPI's
``--tag-output`` tagged piece by piece, a record a carriage return's redraw followed on its line.

Each line is a line of a public log, its source named beside it (the corpus logs' sources are in
tests/fixtures/logs/real/README.md); the expected values are read from the lines by hand.
"""

from __future__ import annotations

import pytest

from labkit.logs import clean_line, parse_lines, parse_log
from labkit.logs.lines import split_glued
from labkit.logs.stated import launcher_flags


@pytest.mark.parametrize(("line", "kinds"), [
    # shifang99/Megatron-LM_core_v0.7.0_trace, my_test/4_gpt_tpx2_cpx4_epx1_dpx1_pp1/
    # pretrain_gpt_trace_cuda_memory.log: UCX's inotify watch limit, the run went on
    ("[1724683035.991952] [sse-lg-112-41:90964:f]        vfs_fuse.c:281  UCX  ERROR inotify_add_watch(/tmp) "
     "failed: No space left on device", []),
    # https://github.com/splitbrain/Watcher/issues/23 (pyinotify; the disk had 25 GB free)
    ("2017-10-19 08:54:02,971 pyinotify ERROR] add_watch: cannot watch /var/www/html/hu.myproject/database "
     "WD=-1, Errno=No space left on device (ENOSPC)", []),
    # https://github.com/Duet3D/DuetSoftwareFramework/issues/33 (systemd; df shows room)
    ("Failed to add /run/systemd/ask-password to directory watch: No space left on device", []),
    # https://github.com/databrickslabs/dolly/issues/139: torch.save's write on a full disk
    ("2023-04-29 06:01:12.977 [177/train/578 (pid 28936)] [09c561ee-a44c-4795-967c-7183a83b3160] OSError: "
     "[Errno 28] No space left on device", ["disk_full"]),
    # https://github.com/hiyouga/LlamaFactory/issues/5155: safetensors writing a checkpoint
    ('safetensors_rust.SafetensorError: Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
     'message: "No space left on device" })', ["disk_full"]),
])
def test_enospc_is_a_full_disk_only_where_the_call_that_failed_writes_to_one(line, kinds):
    """The kernel says ENOSPC where a table of its own is full too (inotify watches, IPC ids)."""
    assert [f.kind for f in parse_lines([line]).failure_records] == kinds


# sparticlesteve/pytorch-nccl-test, slurm-nccl-416593.out: the script's print of its rank and its
# process group's size, behind srun's label
NERSC = ["10: Rank 10 size 16 device cuda:2 count 8", " 0: Rank 0 size 16 device cuda:0 count 8",
         " 0: NCCL version 2.4.8+cuda10.1"]


def test_a_scripts_rank_and_size_lines_state_the_world_size():
    assert launcher_flags(NERSC[:1]) == {"world_size": 16}
    assert parse_lines(NERSC).layout == {"world_size": 16, "tp": None, "pp": None, "dp": None, "cp": None}


@pytest.mark.parametrize("line", [
    # wordplay_2024_ezpz_ddp_8_ranks_...: ezpz counts from 0 (rank=7/7 of 8 ranks)
    "[2024-04-02 01:59:25][INFO][dist:290] - [device='cuda'][rank=7/7][local_rank=3/3][node=1/1]",
    # fwyc0573/Megatron-LM, log/GPT__pretrain_WS8_TP1_PP4/node0.log: a rank of a group, no size word
    "[Layer Unknown] Rank 3/8 (TP=0/1, PP=1/4, DP=1/2, EP=1/2): Responsible for 3 local experts [ID 3-5] "
    "out of 6 total experts",
])
def test_a_rank_over_a_number_states_no_world_size(line):
    assert "world_size" not in launcher_flags([line])


# KeitaW/p5-nccl-test-2024-07-19, nccl-test-output-v2.22.3-1.log: each row written in three pieces,
# each tagged by mpirun --tag-output
TAG = "[1,0]<stdout>:"
P5 = [TAG + "#" + " " * 62 + "out-of-place" + " " * 23 + "in-place          ",
      TAG + "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   "
      "algbw   busbw #wrong",
      TAG + "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  "
      "(GB/s)  (GB/s)       ",
      TAG + "           8             2     float     sum      -1" + TAG + "    85.70    0.00    0.00      0"
      + TAG + "    74.97    0.00    0.00      0",
      TAG + " 17179869184    4294967296     float     sum      -1" + TAG + "    66023  260.21  487.90      0"
      + TAG + "    65990  260.34  488.14      0",
      TAG + "# Out of bounds values : 0 OK",
      TAG + "# Avg bus bandwidth    : 124.584 "]


def test_a_row_open_mpi_tagged_piece_by_piece_is_one_row():
    (t,) = parse_lines(P5).nccl_tests
    first, last = t["rows"]
    assert (first["size_bytes"], first["time_us"], first["inplace_time_us"], first["inplace_wrong"]) == (
        8, 85.70, 74.97, 0)
    assert (last["count"], last["busbw_gbps"], last["inplace_busbw_gbps"]) == (4294967296, 487.90, 488.14)
    assert t["avg_busbw_gbps"] == 124.584


def test_another_process_tag_inside_a_line_starts_a_message_of_its_own():
    """Two real lines of that log, the second process's glued where the first left no newline."""
    line = clean_line("[1,0]<stdout>:           8             2     float     sum      -1"
                      "[1,8]<stdout>:test-nccl-worker-1:25:69 [0] NCCL INFO P2P Chunksize set to 524288")
    parts = split_glued(line)
    assert [(p.rank, p.text.strip()) for p in parts] == [
        (0, "8             2     float     sum      -1"), (8, "[0] NCCL INFO P2P Chunksize set to 524288")]
    assert parts[1].host == "test-nccl-worker-1"


# Ishihara-Masabumi/Llama_SFT, train_log.txt (TRL's SFTTrainer): a Trainer dict, then tqdm's redraws
# of its bar after a carriage return, on one physical line
DICT = ("{'loss': '0.7535', 'grad_norm': '0.1377', 'learning_rate': '0.0001798', 'entropy': '0.8505', "
        "'num_tokens': '8.709e+05', 'mean_token_accuracy': '0.8412', 'epoch': '0.8591'}")
REDRAWN = (DICT + "\r 29%|██▊       | 480/1677 [13:29<33:19,  1.67s/it]"
           "\r 29%|██▊       | 481/1677 [13:30<33:12,  1.67s/it]")


def test_a_record_a_redraw_followed_on_its_line_is_read(tmp_path):
    """A terminal showed the dict, then the bar over it: the record is kept, the bars add none."""
    assert clean_line(REDRAWN).text.strip() == DICT
    log = tmp_path / "train_log.txt"
    log.write_text(REDRAWN + "\n", encoding="utf-8")
    for p in (parse_lines([REDRAWN]), parse_log(log)):
        (rec,) = p.iterations.to_dict("records")
        assert (rec["lm_loss"], rec["grad_norm"], rec["lr"]) == (0.7535, 0.1377, 0.0001798)


def test_each_message_a_redraw_overwrote_is_kept_in_turn():
    """Two of that log's dicts, each followed by its bar's redraw: both records, in their order."""
    second = DICT.replace("0.7535", "0.7402").replace("0.8591", "0.877")
    line = clean_line(DICT + "\r 29%|██▊       | 480/1677 [13:29<33:19,  1.67s/it]\r" + second
                      + "\r 29%|██▊       | 481/1677 [13:30<33:12,  1.67s/it]")
    assert [p.text.strip() for p in split_glued(line)] == [DICT, second]


# slurm_2024_bert_srun_label_job_and_step_cancelled_clemson.txt: the job's line and the step's, the
# step's behind the label of the task srun relayed it for
JOB = "slurmstepd: error: *** JOB 272162 ON nodeai01 CANCELLED AT 2024-07-10T15:46:57 ***"
STEP = "0: slurmstepd: error: *** STEP 272162.0 ON nodeai01 CANCELLED AT 2024-07-10T15:46:57 ***"


@pytest.mark.parametrize("outer", ["", "3: "])
@pytest.mark.parametrize("lines", [[JOB, STEP], [STEP, JOB]])
def test_a_cancellation_takes_its_step_lines_rank_under_any_outer_label(outer, lines):
    """One event; the task the step's label names, whichever label an outer srun put before both."""
    (f,) = parse_lines([outer + line for line in lines]).failure_records
    assert (f.kind, f.rank, f.count) == ("cancelled", 0, 2)


# megatron_lm_2026_srun_label_tp2_world2_..._cscs_attnbench.txt: task 1's record, hard-wrapped at 80
# columns the way a terminal wraps it (srun's label on the first piece only)
RECORD = ("1:  [2026-06-24 13:38:40.076805] iteration        1/       2 | consumed samples:            2 | "
          "elapsed time per iteration (ms): 66218.9 | throughput per GPU (TFLOP/s/GPU): 0.0 | learning rate: "
          "1.000000E-03 | global batch size:     2 | lm loss: 1.181809E+01 | loss scale: 1.0 | grad norm: "
          "2.041 | params norm: 86.719 | number of skipped iterations:   0 | number of nan iterations:   0 |")


def test_a_labelled_record_hard_wrapped_goes_on_over_its_unlabelled_pieces():
    pieces = [RECORD[i:i + 80] for i in range(0, len(RECORD), 80)]
    (rec,) = parse_lines(pieces).iterations.to_dict("records")
    assert (rec["iteration"], rec["elapsed_ms"], rec["lm_loss"], rec["grad_norm"], rec["nan"]) == (
        1, 66218.9, 11.81809, 2.041, 0)
