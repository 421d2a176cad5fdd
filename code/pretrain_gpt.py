"""Pretrain a GPT with megatron-core: tensor, pipeline (and virtual), data parallel; CPU or GPU.

Runbook (from the repository root, after `make setup data`):

  One machine, 4 processes, TP=2 x PP=2 on CPU (gloo): write a run config, then train it:
    .venv/bin/labkit new tp2pp2 --preset tiny --tp 2 --pp 2 --nodes 1 --gpus-per-node 4
    OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node 4 \\
        code/pretrain_gpt.py --config runs/tp2pp2/config.json --no-resume

  The same with Megatron-LM flag names instead of a config file (labkit's job scripts pass the
  flags and name config.json in $LABKIT_CONFIG for the fields without one; code/engine_args.py):
    OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node 4 code/pretrain_gpt.py \\
        --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --num-layers 4 \\
        --hidden-size 128 --num-attention-heads 4 --seq-length 128 \\
        --max-position-embeddings 128 --micro-batch-size 2 --global-batch-size 8 \\
        --train-iters 30 --lr 1e-3 --run-dir runs/flags_demo --no-resume

  Two nodes (what labkit's job script runs on each node; NCCL on GPUs, gloo on CPU):
    torchrun --nnodes 2 --node_rank $SLURM_NODEID --nproc_per_node 2 \\
        --master_addr $HEAD_NODE --master_port 29500 code/pretrain_gpt.py --config runs/x/config.json
    sbatch runs/x/job.sh          # the same, rendered by `labkit submit`

  Start over instead of resuming from runs/x/checkpoints/: add --no-resume (or LABKIT_NO_RESUME=1).
  Stop early with a checkpoint: SIGUSR1 to any rank (Slurm's warning signal, which labkit's
  job script forwards): every rank saves at the next iteration boundary, exit code 75 (engine_stop.py).

Troubleshooting: on clusters without InfiniBand prepend NCCL_IB_DISABLE=1; when gloo resolves the
hostname to 127.0.0.1 across nodes, export GLOO_SOCKET_IFNAME=<the node's interface>.

Writes into the run directory (the config file's folder): log.txt (Megatron-LM-format lines,
unless LABKIT_LOG_CAPTURED=1), tb/ (TensorBoard), checkpoints/, profile/ (with torch_profiler=True),
timeline/ and memory/ (per-microbatch timings, tensor memory by component: engine_timing.py),
exit_code, and data_cache/ (megatron-core's GPTDataset sample index for this run's sizes).
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from contextlib import nullcontext
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from engine_stop import SIGTERM, STOPPED_EXIT_CODE, StopOnSignal, catch_sigterm, end_process  # noqa: E402

# Slurm's warning signal (SIGUSR1) may come while torch still imports: from here on it is kept
# for the first iteration boundary (engine_stop.py). It reaches every process of the job step,
# so the children this file is started again in under spawn (dist-checkpointing's writer) keep
# it too instead of dying of it.
STOP = StopOnSignal()

import warnings  # noqa: E402

# megatron-core and torch.distributed.checkpoint warn on every rank about optional GPU packages
# and deprecations we cannot act on; they would bury the training log.
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")
warnings.filterwarnings("ignore", message=".*Apex is not installed.*")

import cpu_compat  # noqa: E402
import torch  # noqa: E402
from engine_args import config_file, parse_args  # noqa: E402

from labkit.config import RunConfig  # noqa: E402

STATE = {"phase": "start-up", "iteration": 0, "rank": 0, "tp": 0, "pp": 0}
CUDA_CAP: list[str | None] = [None]  # the device memory cap's description, set in main()


# --- training -------------------------------------------------------------------------------
# forward_step (one micro batch through a model chunk), mean_loss and evaluate: code/engine_step.py


def train(cfg: RunConfig, run_dir: Path, ckpt_root: Path, resume: bool, on_cuda: bool,
          stop) -> int:
    """Train to cfg.train_iters; 0, or STOPPED_EXIT_CODE after a save on a signal."""
    import engine_ckpt
    import engine_data
    import engine_log as L
    import engine_model
    import engine_step
    import engine_timing
    from engine_attention import layer_spec
    from engine_memory import apply_memory_limit, run_switch, static_memory_line, workspace_line
    from engine_stop import stop_line
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    rank = torch.distributed.get_rank()
    log = L.RunLog(run_dir)
    # --- distributed init ------------------------------------------------------------------
    engine_model.init_model_parallel(cfg)  # with the same timeout as WORLD
    stop.attach(on_cuda)  # the group the ranks agree on a stop signal in (engine_stop.py)
    model_parallel_cuda_manual_seed(cfg.seed)
    tp_rank, pp_rank = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
    dp_rank = ps.get_data_parallel_rank()
    STATE.update(rank=rank, tp=tp_rank, pp=pp_rank)
    if rank == 0:
        log.emit(L.world_size_line(cfg.world_size, cfg.dp, cfg.tp, cfg.pp))
        log.emit(f"[labkit] backend {'nccl' if on_cuda else 'gloo'}, device "
                 f"{'cuda' if on_cuda else 'cpu'}, {cfg.num_microbatches} microbatch(es) of "
                 f"{cfg.micro_batch_size} per iteration, padded vocab {cfg.padded_vocab_size}")
        if not on_cuda:
            log.emit(f"[labkit] cpu_compat redirected: {', '.join(cpu_compat.applied())}")
        log.emit(f"[labkit] {layer_spec(cfg)[1]}")
        if on_cuda:
            log.emit(workspace_line())
        if cfg.tp > 1:
            log.emit("[labkit] data: TP rank 0 of each tensor-parallel group reads every micro "
                     "batch and broadcasts it to the group")
    # --- model -----------------------------------------------------------------------------
    STATE["phase"] = "model build"
    model, tcfg = engine_model.build_model(cfg, on_cuda)
    if dp_rank == 0:
        log.emit(L.params_line(tp_rank, pp_rank, engine_model.count_parameters(model)))
    STATE["phase"] = "optimizer build"
    optimizer, scheduler = engine_model.build_optimizer(cfg, model)
    engine_model.wire_schedule_hooks(tcfg, model, optimizer)
    if rank == 0:
        log.emit(f"[labkit] {engine_model.kernels_line(optimizer)}")
        log.emit(f"[labkit] {engine_model.overlap_line(cfg)}")
        log.emit(f"[labkit] {engine_model.fusions_line(tcfg)}")
    instrument, saves = run_switch("LABKIT_INSTRUMENT"), run_switch("LABKIT_SAVE_CHECKPOINTS")
    if rank == 0 and not instrument:
        log.emit("[labkit] throughput run (LABKIT_INSTRUMENT=0): no timeline/ or memory/ "
                 "accounting, losses read back at log iterations only")
    if rank == 0 and not saves:
        log.emit("[labkit] no checkpoints (LABKIT_SAVE_CHECKPOINTS=0)")
    # --- data ------------------------------------------------------------------------------
    STATE["phase"] = "data build"
    prefix, tok_dir = engine_data.resolve_data(cfg, REPO_ROOT / "data")
    tokenizer = engine_data.GPT2BPEFiles(tok_dir)
    train_ds, valid_ds = engine_data.build_datasets(cfg, prefix, tokenizer, run_dir / "data_cache")
    # --- resume ----------------------------------------------------------------------------
    iteration, consumed = 0, 0
    layout = (cfg.pp, cfg.tp, cfg.dp)
    if not resume and rank == 0:
        aside = engine_ckpt.set_aside(ckpt_root)
        if aside:
            log.emit(f"[labkit] --no-resume: moved the old checkpoints to {aside}")
    if resume and engine_ckpt.latest_iteration(ckpt_root) is not None:
        STATE["phase"] = "checkpoint load"
        iteration, consumed, d = engine_ckpt.load(ckpt_root, model, optimizer, scheduler, layout)
        if rank == 0:
            log.emit(f"[labkit] resumed from {d} at iteration {iteration} "
                     f"(consumed samples {consumed})")
    STATE["iteration"] = iteration
    # On CUDA the cap was set in main(), before the first allocation; on CPU it is a budget on
    # top of the process as it is now (model and optimizer built).
    limit = apply_memory_limit(cfg.memory_limit_gb, on_cuda) if not on_cuda else CUDA_CAP[0]
    if limit and rank == 0:
        log.emit(f"[labkit] {limit}")
    # --- loop ------------------------------------------------------------------------------
    logs_iterations = ps.is_pipeline_last_stage(ignore_virtual=True) and tp_rank == 0 and dp_rank == 0
    board = L.Board(run_dir / "tb" if logs_iterations else None)
    meter = L.MemoryMeter(on_cuda)
    flops = L.model_flops_per_iteration(cfg)
    timing = engine_timing.Recorder(cfg, run_dir, model, optimizer, on_cuda, iteration) \
        if instrument else None
    fwd_bwd = get_forward_backward_func()
    fwd_bwd = timing.wrap(fwd_bwd) if timing else fwd_bwd  # writes timeline/ and memory/
    n_chunks = len(model)
    engine_step.ON_CUDA["value"] = on_cuda
    train_iter = [engine_data.tp_batches(train_ds, consumed, cfg.micro_batch_size,
                                         cfg.seq_length, on_cuda) for _ in range(n_chunks)]
    prof = engine_timing.profiler(cfg, rank, run_dir, on_cuda)
    acc = {"loss": 0.0, "n": 0, "time": 0.0, "iters": 0, "skipped": 0, "nan": 0}
    memory_reported, losses_due = 0, []  # the iteration of the first memory report
    stopped = 0  # the signal the ranks agreed to stop on (engine_stop.py)
    with prof or nullcontext():
        while iteration < cfg.train_iters:
            if memory_reported and iteration == cfg.train_iters - 1:
                meter.reset_peak()  # the last iteration's own peak: the steady state
            t0 = time.perf_counter()
            STATE.update(phase="forward-backward", iteration=iteration + 1)
            for m in model:
                m.zero_grad_buffer()
            optimizer.zero_grad()
            losses = fwd_bwd(forward_step_func=engine_step.forward_step,
                             data_iterator=train_iter if n_chunks > 1 else train_iter[0],
                             model=model if n_chunks > 1 else model[0],
                             num_microbatches=cfg.num_microbatches, seq_length=cfg.seq_length,
                             micro_batch_size=cfg.micro_batch_size, forward_only=False)
            STATE["phase"] = "optimizer step"
            ok, grad_norm, _ = optimizer.step()
            if ok:
                scheduler.step(increment=1)
            iteration += 1
            consumed += cfg.global_batch_size
            loss = engine_step.mean_loss(losses, as_tensor=not instrument)
            logs_now = iteration % cfg.log_interval == 0 or iteration == cfg.train_iters
            if on_cuda and (instrument or logs_now):
                torch.cuda.synchronize()
            acc["time"] += time.perf_counter() - t0
            acc["iters"] += 1  # since the last log line (fewer right after a resume)
            if loss is not None:
                losses_due.append(loss)
            if instrument or logs_now:
                for value in losses_due:
                    value = float(value)
                    bad = value != value or value in (float("inf"), float("-inf"))
                    acc["nan"] += int(bad)
                    acc["loss"] += 0.0 if bad else value
                    acc["n"] += 0 if bad else 1
                losses_due.clear()
            acc["skipped"] += int(not ok)
            if prof is not None:
                prof.step()
            if logs_now:
                elapsed = acc["time"] / max(1, acc["iters"])
                if logs_iterations:
                    avg = acc["loss"] / acc["n"] if acc["n"] else float("nan")
                    tflops = flops / (elapsed * cfg.world_size) / 1e12
                    lr = optimizer.param_groups[0]["lr"]
                    scale = float(optimizer.get_loss_scale().item())
                    gn = float(grad_norm) if grad_norm is not None else None
                    log.emit(L.iteration_line(
                        iteration=iteration, train_iters=cfg.train_iters, consumed=consumed,
                        elapsed_ms=elapsed * 1000, tflops=tflops, lr=lr,
                        gbs=cfg.global_batch_size, loss=avg, loss_scale=scale, grad_norm=gn,
                        skipped=acc["skipped"], nan=acc["nan"]))
                    mem = meter.read()
                    board.scalars(iteration, {
                        "lm-loss": avg, "learning-rate": lr, "iteration-time": elapsed,
                        "throughput": tflops, "mem-max-allocated": mem["max allocated"],
                        "mem-allocated": mem["allocated"], "batch-size": cfg.global_batch_size,
                        "grad-norm": gn, "loss-scale": scale,
                        "tokens-per-sec": cfg.tokens_per_iteration / elapsed})
                if not memory_reported and dp_rank == 0:
                    if rank == 0 and not on_cuda:
                        log.emit(L.MemoryMeter.cpu_note())
                    log.emit(meter.line(rank, iteration))
                    log.emit(static_memory_line(cfg, tp_rank, pp_rank, iteration, on_cuda))
                elif memory_reported and iteration == cfg.train_iters and dp_rank == 0:
                    log.emit(meter.line(rank, iteration))  # peaks of the last iteration alone
                memory_reported = memory_reported or iteration
                acc.update(loss=0.0, n=0, time=0.0, iters=0, skipped=0, nan=0)
            if cfg.eval_interval and (iteration % cfg.eval_interval == 0
                                      or iteration == cfg.train_iters):
                STATE["phase"] = "evaluation"
                val = engine_step.evaluate(cfg, model, valid_ds, fwd_bwd)
                if logs_iterations and val is not None:
                    for line in L.validation_lines(iteration, val):
                        log.emit(line)
                    board.scalars(iteration, {"lm-loss-validation": val})
            if (saves and cfg.save_interval and iteration % cfg.save_interval == 0
                    and iteration < cfg.train_iters):
                STATE["phase"] = "checkpoint save"
                engine_model.sync_params(model)
                engine_ckpt.save(ckpt_root, iteration, consumed, model, optimizer, scheduler,
                                 layout)
            # Slurm's warning signal reached some rank: all save this iteration, then stop.
            if iteration < cfg.train_iters and (stopped := stop.agreed()):
                break
    if timing:
        timing.close()
    STATE["phase"] = "checkpoint save"
    if saves and engine_ckpt.latest_iteration(ckpt_root) != iteration:
        engine_model.sync_params(model)
        d = engine_ckpt.save(ckpt_root, iteration, consumed, model, optimizer, scheduler, layout)
        if rank == 0 and not stopped:
            log.emit(f"[labkit] saved checkpoint {d}")
    board.close()
    STATE["phase"] = "done"
    if stopped:
        if rank == 0:
            saved = engine_ckpt.iter_dir(ckpt_root, iteration) if saves else None
            log.emit(stop_line(stopped, iteration, cfg.train_iters, str(saved) if saved else None))
            _write_exit_code(run_dir, STOPPED_EXIT_CODE)
        torch.distributed.barrier()  # no rank ends (and torchrun stops the rest) before that
        return STOPPED_EXIT_CODE
    return 0


# --- entry point ----------------------------------------------------------------------------
def _write_exit_code(run_dir: Path, code: int) -> None:
    try:
        (run_dir / "exit_code").write_text(f"{code}\n")
    except OSError:
        pass


def _start_failed(argv: list[str] | None, exc: BaseException) -> int:
    """A config that cannot run: print why and leave exit_code beside config.json."""
    args = sys.argv[1:] if argv is None else argv
    msg = str(exc.code if isinstance(exc, SystemExit) else exc)
    msg = msg if msg.startswith("pretrain_gpt") else f"pretrain_gpt: {msg}"
    rank0 = int(os.environ.get("RANK", "0")) == 0
    if os.environ.get("TORCHELASTIC_ERROR_FILE"):
        # Under torchrun its closing failure table is the last thing on screen: rank 0 puts the
        # reason there (torchelastic's error-file format) and is the first to fail; the other
        # ranks wait to be stopped, so the reason is said once and last.
        if rank0:
            import json

            Path(os.environ["TORCHELASTIC_ERROR_FILE"]).write_text(json.dumps({"message": {
                "message": msg, "extraInfo": {"py_callstack": msg,
                                              "timestamp": str(int(time.time()))}}}))
        else:
            time.sleep(5)
    elif rank0 and not msg.endswith(("None", ": 2")):
        print(msg, file=sys.stderr, flush=True)
    where = config_file(list(args))
    if where is not None and rank0:
        _write_exit_code(where.parent, 2)
    return 2


def main(argv: list[str] | None = None) -> int:
    from labkit.errors import ConfigError

    try:
        cfg, run_dir, ckpt_root, resume = parse_args(argv)
    except (ConfigError, SystemExit) as exc:
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            raise  # --help
        return _start_failed(argv, exc)
    rank = int(os.environ.get("RANK", "0"))
    run_dir.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        (run_dir / "exit_code").unlink(missing_ok=True)
        if not (run_dir / "config.json").exists():
            cfg.to_json(run_dir / "config.json")
    catch_sigterm()
    on_cuda = cfg.device == "cuda"
    from engine_log import RunLog
    from engine_memory import (
        apply_memory_limit,
        cpu_env,
        cuda_env,
        dist_timeout,
        is_oom,
        measure_cuda_workspace,
        oom_line,
    )

    log = RunLog(run_dir)
    code = 0
    try:
        if not on_cuda:
            os.environ.update(cpu_env(on_cuda))  # a GPU on this host stays unused and unseen
            cpu_compat.apply()
        else:
            os.environ.update(cuda_env(cfg, on_cuda))  # before the CUDA context exists
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            CUDA_CAP[0] = apply_memory_limit(cfg.memory_limit_gb, on_cuda)  # before any tensor
            measure_cuda_workspace({"fp32": torch.float32, "bf16": torch.bfloat16,
                                    "fp16": torch.float16}[cfg.precision])
        # A peer that died (OOM, crash) ends the others' collectives within dist_timeout().
        torch.distributed.init_process_group(backend="nccl" if on_cuda else "gloo",
                                             timeout=dist_timeout())
        code = train(cfg, run_dir, ckpt_root, resume, on_cuda, STOP)
    except BaseException as exc:  # noqa: BLE001 - report, write exit_code, re-exit non-zero
        code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 1
        code = code or 1
        if SIGTERM["seen"]:
            pass  # what failed once SIGTERM arrived is the stop's consequence, not a cause
        elif is_oom(exc):
            log.emit(oom_line(rank=rank, tp_rank=STATE["tp"], pp_rank=STATE["pp"],
                              phase=STATE["phase"], iteration=STATE["iteration"], exc=exc,
                              limit_gb=cfg.memory_limit_gb, on_cuda=on_cuda), err=True)
            kind = type(exc).__name__ if type(exc).__module__ == "builtins" else \
                f"{type(exc).__module__}.{type(exc).__name__}"
            log.emit(f"{kind}: {exc}".strip(), err=True)
        elif isinstance(exc, getattr(sys.modules.get("engine_ckpt"), "CheckpointError", ())):
            # A checkpoint that cannot be written (full disk) or read (truncated): one message.
            log.emit(f"[labkit] rank {rank} failed during {STATE['phase']} at iteration "
                     f"{STATE['iteration']}: {exc}", err=True)
        elif "closed by peer" in str(exc) or "Connection reset" in str(exc):
            # Another rank died first (its own report says why); one line here is enough.
            log.emit(f"[labkit] rank {rank} stopped during {STATE['phase']} at iteration "
                     f"{STATE['iteration']}: a peer rank exited ({str(exc).splitlines()[0]})",
                     err=True)
        elif not isinstance(exc, SystemExit):
            log.emit(f"[labkit] rank {rank} failed during {STATE['phase']} at iteration "
                     f"{STATE['iteration']}:\n{traceback.format_exc().rstrip()}", err=True)
        _write_exit_code(run_dir, code)
    finally:
        if rank == 0 and code in (0, STOPPED_EXIT_CODE):
            _write_exit_code(run_dir, code)
        if torch.distributed.is_initialized() and code in (0, STOPPED_EXIT_CODE):
            torch.distributed.destroy_process_group()
    return code


if __name__ == "__main__":
    # The guard matters: dist-checkpointing's writer starts a spawn-context process that
    # re-imports this file; without it that child would start training again.
    end_process(main())
