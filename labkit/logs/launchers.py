"""What a launcher says about the worker processes it ran: one of them failed, and how.

Each launcher's line (failures.FailureScanner feeds every line holding one of ``WORDS``):

- torchrun's agent: ``failed (exitcode: -9) local_rank: 0 (pid: 42) of binary: ...`` (a local rank:
  the global one comes from its ChildFailedError table); torch 1.9's launcher: ``Child process 42
  (local_rank 0) FAILED (exitcode -9)``;
- DeepSpeed's: ``[launch.py:434:sigkill_handler] ['python', ...] exits with return code = -9`` (no rank);
- Open MPI's (Horovod, nccl-tests, Megatron under mpirun; help-orterun.txt, prterun is Open MPI 5's):
  ``mpirun noticed that process rank 7 with PID 0 on node HOSTNAME exited on signal 9 (Killed).``
  (an MPI rank: the job's), and without a rank ``Primary job  terminated normally, but 1 process
  returned`` / ``mpirun detected that one or more processes exited with non-zero status``; a rank
  that called ``MPI_Abort`` (Horovod's, SageMaker's): `` MPI_ABORT was invoked on rank 2 in communicator
  MPI COMMUNICATOR 5 DUP FROM 0`` / ``with errorcode 1.``; a process that MPI's default error handler
  aborts (``*** An error occurred in MPI_Init_thread`` ... ``*** MPI_ERRORS_ARE_FATAL (processes in this
  communicator will now abort,``);
- MPICH's hydra (``mpiexec``; Intel MPI's is hydra too): a banner ``=   BAD TERMINATION OF ONE OF YOUR
  APPLICATION PROCESSES`` (``=   EXIT CODE: 9`` in it: a signal's number or an exit code, so not read),
  then, for a process a signal ended, ``YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed
  (signal 9)`` (no rank);
- Composer's launcher: ``Rank 1 crashed with exit code 1.`` (a global rank);
- HPE's PALS (``mpiexec`` on Cray EX: Polaris, Aurora), behind the host: ``x3200c0s7b0n0: rank 2 died
  from signal 6 and dumped core``, ``rank 0 exited with code 134`` (an MPI rank; ``rank 1 died from
  signal 15`` is a rank PALS itself stopped once another failed);
- the pre-elastic ``torch.distributed.launch`` (torch <= 1.8; DeepSpeed's early launcher), whose own
  traceback ends ``subprocess.CalledProcessError: Command '[..., '--local_rank=0']' returned non-zero
  exit status 1.`` (Python's words: ``died with <Signals.SIGKILL: 9>.`` for a signal): a worker's
  command, as the launcher passes each worker its ``--local_rank``; a script's
  ``CalledProcessError`` on a launcher's command (``accelerate launch ...``, ``torchrun ...``) is that
  launcher's failure; any other command is any subprocess, no launcher's report.

- any other launcher or orchestrator, by the shape they share: a worker (container, pod, trainer,
  replica, a launcher's child process) that failed, exited or died, then its non-zero code (Paddle's
  ``Container rank 0 status failed cmd [...] code 1 log log/workerlog.0``, a job runner's ``Worker 3
  exited with exit code 1``, Lightning's ``Child process with PID 23026 terminated with code 1``).
  A "process" that failed is any program's word (a script's own ``Process 1 failed with return code
  1``), srun's ``task 1: Exited with exit code 1`` Slurm's report of its tasks, not of a launcher's
  workers (the readings of the held-out sets), and code 0 no failure;
- ``torch.multiprocessing.spawn``'s parent, of a process it started: ``process 1 terminated with signal
  SIGKILL`` (an index, no rank; the exception it raises is the traceback's, so no ``child_failed``:
  the SIGKILL guess only);
- the shell, of a job it ran that SIGKILL ended: bash's ``launch.sh: line 149: 190869 Killed
  torchrun ...`` or ``Killed`` alone (no launcher's word: the SIGKILL guess only).

Each is a ``child_failed``; a worker killed by SIGKILL (exit -9 or 137, signal 9) is also the
SIGKILL guess ``host_oom`` (evidence "signal"), which ranking.py drops where a scheduler explains it.
"""

from __future__ import annotations

import re

# ("code": exitcode, return code, ...)
WORDS = ("code", "Killed", "noticed that", "terminated normally", "non-zero status", "BAD TERMINATION",
         "EXIT STRING", "died from signal", "CalledProcessError", "with signal SIGKILL", "MPI_ABORT",
         "occurred in MPI_")
TORCHRUN_FAIL = re.compile(r"failed \(exitcode: (-?\d{1,4})\) local_rank: (\d{1,6})")
_CHILD_19 = re.compile(r"Child process \d{1,12} \(local_rank (\d{1,6})\) FAILED \(exitcode (-?\d{1,4})\)")
_DS_EXIT = re.compile(r"exits with return code = (-?\d{1,4})\s{0,8}$")
# (a PID a user hid in a post: ``with PID xxxxxx``)
_MPI_SIGNAL = re.compile(r"(?:mpirun|orterun|prterun|mpiexec)(?:\.real)? noticed that process rank (\d{1,7}) "
                         r"with PID \S{1,20} on node \S{0,255} ?exited on signal (\d{1,3})")
_MPI_ABORT = re.compile(r"MPI_ABORT was invoked on rank (\d{1,7})\b")
_MPI_FATAL = re.compile(r"\*\*\* An error occurred in (MPI_\w{1,40})")
_MPI_EXIT = ("job  terminated normally, but", "job terminated normally, but",
             "processes exited with non-zero")

_HYDRA_SIGNAL = re.compile(r"EXIT STRING: .{0,80}\(signal (\d{1,3})\)")
_PALS = re.compile(r"^rank (\d{1,7}) (?:exited with code (\d{1,4})|died from signal (\d{1,3}))")
_COMPOSER = re.compile(r"^Rank (\d{1,7}) crashed with exit code (-?\d{1,4})\b")
# ... or a script's report of a launcher it ran (Modal's function running ``accelerate launch``):
# the launcher's failure, which its own lines report (torchrun's table)
_LAUNCHER_RUN = re.compile(r"CalledProcessError: Command '\[?'?(?:[^'\s]{0,300}/)?"
                           r"(?:accelerate|torchrun|deepspeed)\b")
_CALLED = re.compile(r"CalledProcessError: Command '(.{0,20000}?)' (?:returned non-zero exit status "
                     r"(-?\d{1,4})|died with <Signals\.\w{1,12}: (\d{1,3})>)")

# (a sentence's full stop may follow the code; an error code, Ray's ``connection error code 2``, is no
# exit code)
_ANY_WORKER = re.compile(
    r"(?i)\b(?:worker|container|pod|trainer|replica|child process)s?\b.{0,80}?"
    r"\b(?:failed|exited|terminated|died|crashed|aborted)\b.{0,2000}?"
    r"\b(?:exit ?code|exit status|return ?code|returncode|(?<!error )code)\b\s{0,2}[:=]?\s{0,2}(-?\d{1,4})"
    r"(?!\d|\.\d)")
# the shell's own word for a job it ran that SIGKILL ended: bash's job-control report ``launch.sh: line
# 149: 190869 Killed   torchrun ...`` (its pid and command), or ``Killed`` alone on its line
_SHELL_KILLED = re.compile(r"^(?:\S{1,400}: line \d{1,7}: {1,4}\d{1,10} )?Killed"
                           r"(?: {2,40}\S.{0,4000})?\s{0,4}$")
_SPAWN_KILLED = re.compile(r"\bprocess \d{1,6} terminated with signal SIGKILL\b")
_SRUN_TASK = re.compile(r"\btask \d{1,7}: Exited with exit code")
Report = tuple[str, "int | None", str, str, str, str]
"""(kind, rank, message, hint name, evidence, merge key): failures.py makes it a Failure."""


def _sigkill(rank: int | None, what: str) -> Report:
    return ("host_oom", rank, f"{'rank ' + str(rank) if rank is not None else 'a rank'} killed by SIGKILL "
            f"({what})", "sigkill", "signal", "sigkill")


_SIGKILL_HOW = ("signal 9", "exit code 137", "exit status -9", "exit status 137")


def _child(rank: int | None, who: str, how: str) -> list[Report]:
    out = [("child_failed", rank, f"{who}: {how}", "child_failed", "log", "child")]
    return out + ([_sigkill(rank, how)] if how in _SIGKILL_HOW else [])


def _other_launchers(text: str) -> list[Report]:
    """hydra's, PALS's and torch.distributed.launch's reports (module docstring), else []."""
    if "BAD TERMINATION" in text or "EXIT STRING" in text:
        m = _HYDRA_SIGNAL.search(text)
        return _child(None, "mpiexec (hydra): a process ended", f"signal {m.group(1)}" if m else "badly")
    m = _COMPOSER.match(text) if "crashed" in text else None
    if m is not None and m.group(2) != "0":
        return _child(int(m.group(1)), f"Composer's launcher: rank {m.group(1)} crashed",
                      f"exit code {m.group(2)}")
    m = _PALS.match(text) if "rank" in text else None
    if m is not None:
        code, sig = m.group(2), m.group(3)
        if code == "0" or sig == "15":  # SIGTERM: the launcher stopping the others once one failed
            return []
        how = f"signal {sig}" if sig else f"exit code {code}"
        return _child(int(m.group(1)), f"PALS: rank {m.group(1)} ended", how)
    m = _CALLED.search(text) if "CalledProcessError" in text else None
    launcher = "CalledProcessError" in text and _LAUNCHER_RUN.search(text) is not None
    if not launcher and (m is None or "local_rank" not in m.group(1) and "local-rank" not in m.group(1)):
        return []
    if m is None:  # the command printed over several lines (one word a line), its status after them
        return _child(None, "a launcher a script ran failed", "a non-zero exit status")
    how = f"signal {m.group(3)}" if m.group(3) else f"exit status {m.group(2)}"
    return _child(None, "a launcher failed" if launcher else "torch.distributed.launch: a worker failed", how)


def _any_worker(text: str) -> list[Report]:
    """Any other launcher's report of a worker that failed with a non-zero code (docstring), or the
    shell's of a job SIGKILL ended (a ``host_oom`` guess: no launcher said why), else []."""
    if "SIGKILL" in text and _SPAWN_KILLED.search(text):
        return [_sigkill(None, "torch.multiprocessing.spawn: a process terminated with signal SIGKILL")]
    if "Killed" in text and _SHELL_KILLED.match(text):
        return [_sigkill(None, "the shell reports the job it ran Killed")]
    m = _ANY_WORKER.search(text) if "code" in text and not _SRUN_TASK.search(text) else None
    if m is None or m.group(1) == "0":
        return []
    code = m.group(1)
    return _child(None, "a launcher: a worker failed", f"exit code {code}" if code not in ("-9", "137")
                  else "exit code 137" if code == "137" else "signal 9")


def worker_failed(text: str) -> list[Report]:
    """The failed worker a launcher's line reports (module docstring), else []."""
    other = _other_launchers(text)
    if other:
        return other
    m = _MPI_ABORT.search(text) if "MPI_ABORT" in text else None
    if m is not None:
        return [("child_failed", int(m.group(1)), f"Open MPI: rank {m.group(1)} called MPI_Abort",
                 "child_failed", "log", "child")]
    m = _MPI_FATAL.search(text) if "occurred in MPI_" in text else None
    if m is not None:  # the banner names no rank
        return [("child_failed", None, f"Open MPI: a process aborted on an error in {m.group(1)}",
                 "child_failed", "log", "child")]
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
        return _any_worker(text)
    return [("child_failed", None, f"torchrun: a worker failed (local_rank {r}, exit code {code})",
             "child_failed", "log", "child")]
