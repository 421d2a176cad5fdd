"""The fifteenth session's readings, each checked on the real lines it came from (sources in each
folder's README.md): tracebacks whose frames hold no trigger word and whose header the log cut."""

from __future__ import annotations

from real_logs import failure_kinds, one

from labkit.cli import main
from labkit.logs import parse_log
from labkit.logs.scan import TRIGGERS


def test_frames_without_a_header_or_a_trigger_word_are_a_cut_traceback():
    # NeMo 2 (NVIDIA/NeMo#15219): ``[rank0]:   File "/opt/Run/nemo_run/cli/api.py", line 313, in main``
    # and its code lines, the header above and the exception below both outside the paste: the frame
    # lines reach the reader (a frame's ``File `` is a trigger), and the cut traceback is rank 0's
    assert "File " in TRIGGERS
    assert failure_kinds(one("heldout8c", "nemo15219")) == [("python_exception", 0)]


def test_a_frame_hard_wrapped_inside_its_line_number_goes_on_on_the_next_line():
    # torchtune 2676: ``  File ".../c10d_rendezvous_backend.py", line 11`` then ``9, in _call_store``
    # (a terminal's wrap at ~130 columns), four frames so cut, the paste ending at ``raise
    # RendezvousConnectionError(``: one cut traceback, not one closed by its own wrapped pieces
    assert failure_kinds(one("heldout8a", "torchtune2676")) == [("python_exception", None)]


def test_headless_frames_end_as_an_exception_only_at_an_exceptions_own_line():
    # Vertex AI's console, newest line first (heldout4z): the frames come after ``ValueError: Please
    # provide a TPU Name to connect to.``, each behind a ``2022-08-03 08:42:13.917 CEST`` stamp; the
    # stamp's leftover ``CEST`` after a frame is no exception of its own
    path = one("heldout4z", "vertex_ai_console_newest_first")
    assert [(f.kind, f.message) for f in parse_log(path).failure_records] == [
        ("python_exception", "ValueError: Please provide a TPU Name to connect to.")]


def test_submitits_preemption_notice_is_the_preemption_without_slurms_line():
    # submitit 1701: ``Caught signal SIGHUP on learnfair0293: this job is preempted.`` then ``Requeued
    # job 60601445``, no ``CANCELLED ... DUE TO JOB REQUEUE`` line in the log: one preemption
    assert failure_kinds(one("heldout8f", "submitit1701")) == [("preempted", None)]
    # with Slurm's line after it (submitit 1708, real/) the two are one event
    (f,) = parse_log(one("real", "submitit1708")).failure_records
    assert f.kind == "preempted"


def test_rccls_own_banner_gives_the_version_in_both_forms():
    # ``RCCL version 2.17.1+hip5.7 HEAD:cbbb3d8`` (heldout7w) and 2.21's block line ``RCCL version :
    # 2.21.5-HEAD:9a0e6a1`` (heldout8h's rccltests163), neither holding the word NCCL
    assert parse_log(one("heldout7w", "rccl_2.17.1")).nccl_version == "2.17.1"
    assert parse_log(one("heldout8h", "rccltests163")).nccl_version == "2.21.5"


def test_an_average_meters_time_is_seconds():
    # Swin-Transformer 183: ``Train: [14/300][250/1251]<TAB>eta 0:10:52 lr 0.000710<TAB>time 0.6408
    # (0.6516)<TAB>loss 6.5584 (6.3074)`` (PyTorch's ImageNet example's meters: the value, then its
    # running mean); no data-loading time beside it, as VMamba's lines (heldout3t) print
    first = parse_log(one("heldout8j", "swin_2022")).iterations.iloc[0]
    assert abs(first["elapsed_ms"] - 640.8) < 1e-6 and first["lm_loss"] == 6.5584


def test_a_layout_name_glued_to_the_value_before_it_is_read():
    # Megatron-LM 1554: ``... hierarchical context-parallel sizes: Nonetensor-model-parallel size: 1,
    # ..., pipeline-model-parallel size: 2`` (the release's format string lacks a comma there)
    layout = parse_log(one("heldout8i", "pp2_nsys")).layout
    assert (layout["world_size"], layout["tp"], layout["pp"], layout["dp"]) == (2, 1, 2, 1)


def test_open_mpis_fatal_error_handler_aborting_a_process_is_a_failed_worker():
    # DeepSpeed 935 under ``mpirun --tag-output``: ``*** An error occurred in MPI_Init_thread`` ...
    # ``*** MPI_ERRORS_ARE_FATAL (processes in this communicator will now abort,`` (rank 3's); read as
    # Open MPI's MPI_ABORT banner is (heldout7i)
    assert [k for k, _ in failure_kinds(one("heldout8k", "ds935"))] == ["child_failed"]


def test_a_qualified_wrapper_exception_and_an_indented_one_are_exception_lines():
    # Ray 31828: ``ray.exceptions.RayTaskError(RuntimeError): [36mray::TrainTrainable.train()[39m ...``,
    # the log's last line; LUMI's workshop page: ``    torch.distributed.DistBackendError: NCCL error
    # in:`` indented as the page's code block, its message wrapped over the lines after it
    for folder, words, name in (("heldout8p", "ray31828", "ray.exceptions.RayTaskError(RuntimeError)"),
                                ("heldout8o", "lumi_ai_workshop_ddp", "torch.distributed.DistBackendError")):
        (f,) = parse_log(one(folder, words)).failure_records
        assert f.kind == "python_exception" and f.message.startswith(name + ": ")


def test_a_traceback_field_alone_is_torchruns_table():
    # torchtitan 1789: the paste starts at the table's ``  traceback : Traceback (most recent call
    # last):`` (the rank's error file): the worker failed, and its own traceback is an exception
    found = [k for k, _ in failure_kinds(one("heldout8m", "torchtitan1789"))]
    assert found == ["child_failed", "python_exception"]


def test_launchers_say_a_child_ended_with_a_code_at_a_sentences_end():
    # Lightning under Ray Tune: ``(_train_tune pid=22946) [rank: 1] Child process with PID 23026
    # terminated with code 1. Forcefully terminating ...`` (the log's one line: read, not refused);
    # Composer's launcher: ``Rank 1 crashed with exit code 1.``
    assert failure_kinds(one("heldout8p", "neuralforecast1291")) == [("child_failed", None)]
    assert failure_kinds(one("heldout8p", "examples292")) == [("child_failed", 1)]
    # the raylet's ``Worker unexpectedly exits with a connection error code 2.`` is no exit code
    kinds = [k for k, _ in failure_kinds(one("real", "verl_2026_grpo"))]
    assert "child_failed" not in kinds


def test_llm_cs_step_time_and_its_cuda_check():
    # llm.c 114: ``step 0: train loss 4.367631 (took 59.288083 ms)`` (train_gpt2.cu times the step's
    # forward, backward and update), then its cudaCheck's ``[CUDA ERROR] at file train_gpt2.cu:1238:``
    path = one("heldout8m", "llmc114")
    first = parse_log(path).iterations.iloc[0]
    assert abs(first["elapsed_ms"] - 59.288083) < 1e-9 and first["lm_loss"] == 4.367631
    assert [k for k, _ in failure_kinds(path)] == ["cuda_error"]


def test_an_exception_python_ignored_stopped_no_process():
    # open-r1 658: ``Exception ignored in: <finalize object ...>`` then its traceback ending in
    # ``TimeoutError``, then two ranks' watchdog timeouts; bigyang (heldout5p): ``Exception ignored in
    # atexit callback: <function ...>`` (a cache rename's FileNotFoundError at exit)
    assert [k for k, _ in failure_kinds(one("heldout8q", "openr1_658"))] == ["nccl_timeout", "nccl_timeout"]
    bigyang = one("heldout5p", "atexit_exception_ignored_bigyang")
    assert "python_exception" not in [k for k, _ in failure_kinds(bigyang)]


def test_ipython_8s_frames_open_a_traceback_and_code_it_shows_is_no_report():
    # super-gradients 1204 (a Jupyter cell): ``File /usr/local/lib/python3.8/dist-packages/.../
    # distributed_training_utils.py:387, in restart_script_with_ddp(num_gpus)``, numbered source lines,
    # ``--> 387 elastic_launch(...)``, cut before the exception; the source line ``242  # ChildFailedError
    # is treated specially by @record`` is code, no torchrun report
    assert failure_kinds(one("heldout8s", "super_gradients1204")) == [("python_exception", None)]


def test_a_tracebacks_code_line_states_no_world_size():
    # pytorch 74146: the code line of the process-group call (``world_size=2`` among its arguments) under
    # its frame's ``File ".../index.py", line 10, in <module>``: source shown, not a run's statement
    assert parse_log(one("heldout8t", "pytorch74146")).layout["world_size"] is None


def test_a_scripts_called_process_error_on_a_launcher_is_the_launchers_failure():
    # omini-kontext 22 (Modal): torchrun's table (root cause rank 2, exit code 1), then the function's
    # ``subprocess.CalledProcessError: Command 'accelerate`` / ``launch`` / ... ``' returned non-zero
    # exit status 1.``: one failed launch, no exception of the script's own (as MSPN 31's launcher)
    assert failure_kinds(one("heldout8s", "omini_kontext22")) == [("child_failed", 2)]


def test_a_memory_summarys_count_of_ooms_is_the_event():
    # pytorch 35901: torch.cuda.memory_summary()'s ``|  CUDA OOMs: 1  |  cudaMalloc retries: 1  |`` alone;
    # fairseq 2442: the OOM warning (``Tried to allocate 246.00 MiB (GPU 0; ...)``), then the table:
    # one event (``CUDA OOMs: 0``, heldout7m, is none)
    assert [k for k, _ in failure_kinds(one("heldout8v", "pytorch35901"))] == ["gpu_oom"]
    assert [k for k, _ in failure_kinds(one("heldout8v", "fairseq2442"))] == ["gpu_oom"]


def test_a_loggers_prefix_on_a_tracebacks_first_line_names_its_rank():
    # ParlAI 4452: ``rank:  3 | 2022-04-03 18:44:26,615 CRITICAL | Traceback (most recent call last):``,
    # then the frames and ``RuntimeError: CUDA out of memory. ... (GPU 3; ...)`` bare (a logger
    # prefixes a message's first line only)
    assert failure_kinds(one("heldout8v", "parlai4452")) == [("gpu_oom", 3)]


def test_a_cuda_calls_failure_with_the_runtimes_words_is_a_cuda_error():
    # Horovod 2365 behind ``[1,25]<stderr>:``: ``what():  cudaEventQuery failed: an illegal memory access
    # was encountered``, then the abort's backtrace
    assert failure_kinds(one("heldout8u", "horovod2365")) == [("cuda_error", 25)]


def test_rays_mark_of_a_repeated_line_is_a_programs_output():
    # verl 1467: a Megatron-Core TransformerConfig printed as a dict over two lines, ending
    # ``[repeated 7x across cluster]`` (Ray's): a log (not refused), its sizes read
    layout = parse_log(one("heldout8y", "verl1467")).layout
    assert (layout["tp"], layout["pp"], layout["cp"]) == (2, 2, 1)
    assert main(["parse", str(one("heldout8y", "verl1467")), "--json"]) == 0


def test_an_optimizers_group_lr_and_a_printed_python_pair_are_read():
    # ESPnet 3170: ``2epoch:train:12009-12640batch: ..., loss=65.129, ..., optim0_lr0=1.485e-05, ...``;
    # FunASR (SenseVoice 264): ``(loss_avg_rank: 24.221), ..., [('loss_ctc', 24.181), ('loss_rich', 0.041),
    # ('loss', 24.221), ...]``: the loss is the pair's, not the averages'
    first = parse_log(one("heldout9f", "espnet3170")).iterations.iloc[0]
    assert (first["lm_loss"], first["lr"]) == (65.129, 1.485e-05)
    first = parse_log(one("heldout9f", "sensevoice264")).iterations.iloc[0]
    assert (first["iteration"], first["lm_loss"], first["lr"]) == (3, 24.221, 3e-07)


def test_group_sizes_in_words_and_the_one_size_they_leave():
    # PiPPy 806: ``[PiPPy] World size: 5, DP group size: 1, PP group size: 5`` (TP 5 / (1 x 5) = 1), and
    # its ``CUDA warning: device-side assert triggered`` glued to a progress bar
    path = one("heldout9c", "pippy806")
    layout = parse_log(path).layout
    assert (layout["world_size"], layout["tp"], layout["pp"], layout["dp"]) == (5, 1, 5, 1)
    assert [k for k, _ in failure_kinds(path)] == ["cuda_error"]


def test_deepspeeds_stage_partition_and_a_ray_actors_name_with_its_argument():
    # MPP-LLaVA 13: ``[...] [INFO] [module.py:375:_partition_layers] Partitioning pipeline stages with
    # method uniform`` and the layer listing (DeepSpeed's: read, not refused); ROLL 193:
    # ``(ActorWorker(actor_train-1) pid=18175, ip=...)`` before every line of a cut traceback
    assert main(["parse", str(one("heldout9c", "mppllava13")), "--json"]) == 0
    assert [k for k, _ in failure_kinds(one("heldout9f", "roll193"))] == ["python_exception"]


def test_a_ray_workers_pid_is_its_source_where_no_ip_is_printed():
    # vLLM on WSL (microsoft/WSL 12467): two workers' lines interleaved, ``(VllmWorkerProcess pid=3985)
    # ERROR ... torch.distributed.DistBackendError: NCCL error in: ..., unhandled cuda error ...`` then
    # its own ``ncclUnhandledCudaError: Call to CUDA function failed.`` between pid 3984's frames: one
    # CUDA error, the NCCL line its message's rest
    assert [k for k, _ in failure_kinds(one("heldout9j", "wsl12467"))] == ["cuda_error"]


def test_accelerates_notice_of_its_process_count_is_the_world():
    # Lora-Training-in-Comfy 27: accelerate's defaults, "`--num_processes` was set to a value of `2`"
    assert parse_log(one("heldout9j", "lora_comfy27")).layout["world_size"] == 2


def test_rich_boxed_frames_and_build_nanogpts_log_file_are_read_not_refused():
    # KubeRay (ray 43265): ``│   File ".../backend_executor.py", line 190, in start`` in rich's box, the
    # box's top and the exception cut; build-nanoGPT's log.txt: ``0 train 11.027695`` / ``0 val 11.0213``
    assert failure_kinds(one("heldout9h", "ray43265")) == [("python_exception", None)]
    its = parse_log(one("heldout9e", "build_nanogpt")).iterations
    assert len(its) == 1992 and its.iloc[0]["lm_loss"] == 11.027695


def test_an_evaluations_epoch_and_batch_line_is_no_step():
    # LAVIS's MetricLogger (SALMONN): ``Eval: data epoch: [0]  [4253/4254]  eta: 0:00:00    time: 0.2819
    # data: 0.0002  max mem: 26527`` beside its ``Train: data epoch: [0]  [2999/3000] ... loss: 3.5553``
    its = parse_log(one("heldout9e", "lavis_salmonn_2025_torchrun_metriclogger")).iterations
    assert len(its) == 2 and its["lm_loss"].notna().all()


def test_a_logging_agents_octal_tab_is_a_tab():
    # SageMaker data parallel (CloudWatch's agent): ``[1,mpirank:0,algo-1]<stdout>:Train Epoch: 1
    # [0/60000 (0%)]#011Loss: 2.323947`` (#011 is the tab, as #015 the carriage return): 84 records
    its = parse_log(one("heldout9p", "smddp_2024")).iterations
    assert len(its) == 84 and its.iloc[0]["lm_loss"] == 2.323947
