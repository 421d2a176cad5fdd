"""Stop cleanly on a signal: save a checkpoint at the next iteration boundary, on every rank.

Slurm warns a job before it ends it when the job asks (``sbatch --signal=B:USR1@120``: SIGUSR1
to the batch script 120 s before the time limit, and before a preemption with a grace time);
labkit's job script forwards it to the training processes. Any rank may be the one that got it,
so the ranks agree each iteration: a MAX all-reduce of the signal number (0: none), one int,
over gloo on the CPU (a GPU run gets its own gloo group, so the check never waits for the GPU).
Then every rank saves the same iteration together and the run exits with ``STOPPED_EXIT_CODE``;
the next start resumes from that checkpoint like after any other stop. Megatron-LM's
``--exit-signal-handler`` does the same with SIGTERM and an all-gather.
"""

from __future__ import annotations

import os
import signal

STOPPED_EXIT_CODE = 75
"""The exit code of a run that saved and stopped on a signal (BSD's EX_TEMPFAIL: try again)."""
SIGNALS = (signal.SIGUSR1,)
"""What asks for a save and stop (SIGTERM stays a plain stop: torchrun sends it to end ranks)."""


class StopOnSignal:
    """Remembers a stop signal and tells, at an iteration boundary, whether any rank got one
    (``agreed``). Made before torch is imported (this module imports it only when asked), so a
    warning that comes during the start-up is kept for the first iteration."""

    def __init__(self) -> None:
        self.received = 0
        self.group = None
        for s in SIGNALS:
            signal.signal(s, self._note)

    def _note(self, signum, frame) -> None:
        self.received = self.received or signum

    def attach(self, on_cuda: bool) -> None:
        """After ``init_process_group``, on every rank: the group the flag travels in."""
        import torch

        self.group = torch.distributed.new_group(backend="gloo") if on_cuda else None

    def agreed(self) -> int:
        """The signal any rank received (0: none); every rank must call it at the same point."""
        import torch

        flag = torch.tensor([self.received], dtype=torch.int64)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self.group)
        return int(flag.item())


SIGTERM = {"pid": 0, "seen": False}
"""The rank's own process (the one SIGTERM stops) and whether SIGTERM reached it."""


def catch_sigterm() -> None:
    """SIGTERM ends this rank with ``SystemExit(143)`` (128 + the signal), so that ``finally``
    blocks run. torchrun, Slurm and the local backend stop a job with SIGTERM to every process,
    so also to the helpers a rank forked to save checkpoints (the results queue's manager,
    dist-checkpointing's writers). A helper that died first broke its rank's save: a crash
    blamed on the rank, ranked above the cancel that caused it. A helper ignores it and ends
    with its rank (``end_process``; SIGKILL after the grace of a cancel)."""
    SIGTERM["pid"] = os.getpid()
    signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum, frame) -> None:
    if os.getpid() != SIGTERM["pid"]:
        return  # a helper process forked from the rank
    SIGTERM["seen"] = True
    raise SystemExit(128 + signum)


def stop_line(signum: int, iteration: int, train_iters: int, saved: str | None) -> str:
    """The one log line that says why the run stopped before train_iters."""
    what = f"saved checkpoint {saved}" if saved else "no checkpoint (LABKIT_SAVE_CHECKPOINTS=0)"
    return (f"[labkit] stopped on {signal.Signals(signum).name} at iteration {iteration} of "
            f"{train_iters} (Slurm's warning before a time limit or a preemption, forwarded by "
            f"the job script): {what}, exit code {STOPPED_EXIT_CODE}; the next start of this "
            f"run (a requeued job, or a resubmit with --resume) continues from iteration "
            f"{iteration if saved else 0}")


def end_process(exit_code: int) -> None:
    """End a rank: every labkit process that joined a gloo process group ends here (the
    engine, the doctor's probe, the all-reduce benchmark, the tests' distributed scripts;
    tests/test_house.py checks it). One that finished or stopped (0, ``STOPPED_EXIT_CODE``) has
    closed what it writes (log, TensorBoard, checkpoints, the process group) and skips the
    interpreter's teardown, for two reasons:

    - a gloo worker thread drops its reference to a finished collective's work (and so its
      tensors' Python objects) only after the caller's ``wait`` returned; on a loaded machine it
      can first run again once the main thread is in the interpreter's teardown, where taking the
      GIL ends the thread inside that destructor: ``terminate called without an active
      exception``, SIGABRT, exit -6 after a run that succeeded (a core dump of a 2-rank gloo
      script showed exactly these two threads; ``destroy_process_group`` does not join them);
    - the teardown of torch and megatron-core costs ~3 s of CPU per rank that nobody reads
      (benchmarks/README.md, "Engine (CPU)").

    First it does what that teardown must still do: end the processes dist-checkpointing started
    (a multiprocessing manager), which would otherwise outlive the rank and hold its stdout open,
    and flush stdout and stderr. They get SIGKILL: their work is done, and they ignore SIGTERM
    (``catch_sigterm``). A failing rank exits normally."""
    import sys

    if exit_code not in (0, STOPPED_EXIT_CODE):
        sys.exit(exit_code)
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()
        child.join(timeout=10)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
