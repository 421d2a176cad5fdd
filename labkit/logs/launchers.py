"""What a launcher says about the worker processes it ran: one of them failed, and how.

Each launcher's line (failures.FailureScanner feeds every line holding one of ``WORDS``):

- torchrun's agent: ``failed (exitcode: -9) local_rank: 0 (pid: 42) of binary: ...`` (a local rank:
  the global one comes from its ChildFailedError table); torch 1.9's launcher: ``Child process 42
  (local_rank 0) FAILED (exitcode -9)``;
- DeepSpeed's: ``[launch.py:434:sigkill_handler] ['python', ...] exits with return code = -9`` (no rank);
- Open MPI's (Horovod, nccl-tests, Megatron under mpirun; help-orterun.txt, prterun is Open MPI 5's):
  ``mpirun noticed that process rank 7 with PID 0 on node HOSTNAME exited on signal 9 (Killed).``
  (an MPI rank: the job's), and without a rank ``Primary job  terminated normally, but 1 process
  returned`` / ``mpirun detected that one or more processes exited with non-zero status``.

Each is a ``child_failed``; a worker killed by SIGKILL (exit -9 or 137, signal 9) is also the
SIGKILL guess ``host_oom`` (evidence "signal"), which ranking.py drops where a scheduler explains it.
"""

from __future__ import annotations

import re

WORDS = ("exitcode", "exits with return code", "noticed that", "terminated normally", "non-zero status")
TORCHRUN_FAIL = re.compile(r"failed \(exitcode: (-?\d{1,4})\) local_rank: (\d{1,6})")
_CHILD_19 = re.compile(r"Child process \d{1,12} \(local_rank (\d{1,6})\) FAILED \(exitcode (-?\d{1,4})\)")
_DS_EXIT = re.compile(r"exits with return code = (-?\d{1,4})\s{0,8}$")
_MPI_SIGNAL = re.compile(r"(?:mpirun|orterun|prterun|mpiexec)(?:\.real)? noticed that process rank (\d{1,7}) "
                         r"with PID \d{1,12} on node \S{0,255} ?exited on signal (\d{1,3})")
_MPI_EXIT = ("job  terminated normally, but", "job terminated normally, but",
             "processes exited with non-zero")

Report = tuple[str, "int | None", str, str, str, str]
"""(kind, rank, message, hint name, evidence, merge key): failures.py makes it a Failure."""


def _sigkill(rank: int | None, what: str) -> Report:
    return ("host_oom", rank, f"{'rank ' + str(rank) if rank is not None else 'a rank'} killed by SIGKILL "
            f"({what})", "sigkill", "signal", "sigkill")


def worker_failed(text: str) -> list[Report]:
    """The failed worker a launcher's line reports (module docstring), else []."""
    if "noticed that" in text or any(w in text for w in _MPI_EXIT):
        m = _MPI_SIGNAL.search(text)
        if m is None:
            if not any(w in text for w in _MPI_EXIT):
                return []
            return [("child_failed", None, "mpirun: a process exited with a non-zero code", "child_failed",
                     "log", "child")]
        r, sig = int(m.group(1)), m.group(2)
        out = [("child_failed", r, f"mpirun: rank {r} exited on signal {sig}", "child_failed", "log",
                "child")]
        return out + ([_sigkill(r, "signal 9")] if sig == "9" else [])
    m = _DS_EXIT.search(text)
    if m is not None:
        code = m.group(1)
        if code == "0":
            return []
        out = [("child_failed", None, f"DeepSpeed launcher: a rank's process exited with return code {code}",
                "child_failed", "log", "child")]
        return out + ([_sigkill(None, f"return code {code}")] if code in ("-9", "137") else [])
    m = TORCHRUN_FAIL.search(text)
    r, code = (m.group(2), m.group(1)) if m else (None, None)
    if m is None:
        m = _CHILD_19.search(text)
        r, code = (m.group(1), m.group(2)) if m else (None, None)
    if m is None:
        return []
    return [("child_failed", None, f"torchrun: a worker failed (local_rank {r}, exit code {code})",
             "child_failed", "log", "child")]
