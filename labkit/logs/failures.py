"""What killed a run: failure records with kind, rank, line number and a hint that names the fix.

The kinds are KINDS' (DESIGN.md section 5). The CPU allocator's out-of-memory (our CPU/gloo runs
under ``memory_limit_gb``) is reported as ``host_oom`` with a message that says so.

One event is often printed many times (by every rank, by torchrun's summary, by a C++
``what():`` that repeats the message); records with the same key are merged, so a watchdog
timeout and its follow-up lines count once. ``diagnose`` orders them most-likely-root-cause first.
torch.distributed's own lines (the NCCL watchdog, its heartbeat monitor, gloo) are read in c10d.py,
what launchers say about their workers (torchrun, DeepSpeed, mpirun) in launchers.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from labkit.logs import c10d, cuda, launchers, oom
from labkit.logs.exceptions import ErrorRecords, Tracebacks
from labkit.logs.hints import HINTS
from labkit.logs.lines import Line
from labkit.logs.oom import CPU_OOM, GPU_OOM, LABKIT_OOM, RAY_OOM, SHM, SHM_CALL, SLURM_OOM, oom_key, same_oom

KINDS = ("gpu_oom", "host_oom", "nccl_timeout", "cuda_error", "time_limit", "preempted", "node_failure",
         "child_failed", "python_exception", "cancelled", "hang", "disk_full", "bad_checkpoint")


@dataclass
class Failure:
    """One diagnosed failure; ``line`` is 1-based in the log (None when it came from job state)."""

    kind: str
    rank: int | None
    line: int | None
    message: str
    hint: str
    count: int = 1
    evidence: str = "log"  # "log" | "signal" (from exit -9) | "state" (Slurm) | "comm" | "cut" | "stopping"
    key: str = field(default="", repr=False)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("kind", "rank", "line", "message", "hint")}


# --- single-line rules ------------------------------------------------------------------------
_SLURM = re.compile(r"\*\*\* (?:JOB|STEP) (\d{1,12}(?:[._]\w{1,12})?) (?:ON (\S{1,100}) )?CANCELLED AT "
                    r"(\S{1,40})(?: DUE TO ([A-Z_ ]{1,40}?))?(?:, SEE SLURMCTLD LOG FOR DETAILS)?"
                    r"(?: on (\S{1,100}))? \*\*\*")
# srun's and salloc's "Node failure on NODE" (the allocation lost a node), a task launch on a node
# that failed, a job or step Slurm ended in state NODE_FAIL
_NODE_FAIL = re.compile(r"(?:srun|salloc|sbatch)(?:-[\w.-]{1,60})?: error: Node failure on (\S{1,100})"
                        r"|Task launch for \S{1,60} failed on node (\S{1,100})|NODE_FAIL")
# a root-cause row: "exitcode  : -6 (pid: 42)" (or, shortened by a user, "-9 (SIGKILL)"), or its field
# "traceback : Signal 9 (SIGKILL) received by PID 42" (torch elastic's words for a worker a signal ended)
_TABLE_EXIT = re.compile(r"-?\d{1,4} \((?:pid: \d{1,12}|SIG[A-Z]{2,8})\)")
_TABLE_SIGNAL = re.compile(r"(?i)signal (\d{1,2}) \(SIG[A-Z]{2,8}\) received by PID")
_ROOT_FIELD = re.compile(r"^\s{0,8}(rank|exitcode|host|traceback)\s{0,8}: (.{0,300})$")
# an excepthook's last word (OLMo: ``Uncaught OLMoThreadError: generator thread data thread 3 failed``);
# horovod.run's of what a worker's function raised: ``User function raise error: 2 root error(s) found.``
_UNCAUGHT = re.compile(r"(?:Uncaught (\w{1,80}(?:Error|Exception))|User function (raise error)): (.{1,500})")
_COMM_CONSEQUENCE = re.compile(r"Connection closed by peer|Connection reset|Broken pipe|DistBackendError"
                               r"|communicator was aborted|recvBytes|Socket Timeout|ProcessGroup"
                               r"|gloo/transport|NCCL error|DistNetworkError|DistStoreError")

_DISK_FULL = re.compile(r"No space left on device|\bENOSPC\b|Disk quota exceeded|\[Errno 28\]")
# ENOSPC is a disk's only where the call that failed writes to one: the kernel returns it too where
# a table of its own is full (inotify_add_watch, a watcher's add_watch or "directory watch": the
# user's inotify watches; epoll_ctl: epoll watches; semget, shmget, msgget, mq_open: System V and
# POSIX IPC limits). UCX prints ``inotify_add_watch(/tmp) failed: No space left on device`` on a
# disk with room to spare.
_KERNEL_TABLE = re.compile(r"inotify|fanotify|\b(?:add_)?watch\b"
                           r"|\b(?:epoll_ctl|semget|shmget|msgget|mq_open)\b")
_BAD_CKPT = re.compile(r"checkpoint \S{1,1000} is truncated or corrupt")
# torch's DataLoader on a worker's SIGBUS: ``ERROR: Unexpected bus error encountered in worker. This might
# be caused by insufficient shared memory (shm).`` and ``DataLoader worker (pid 3216) is killed by signal:
# Bus error. It is possible that dataloader's workers are out of shared memory.``
_SHM_SHORT = re.compile(r"insufficient shared memory|out of shared memory")
_SCHEDULER = ("time_limit", "preempted", "cancelled", "node_failure", "hang")  # no process's own failure
_FAILED_NODE = "Slurm: node "  # how a message naming the node that failed begins
# a step's cancellation (``*** STEP 272162.0 ON node CANCELLED ...``): srun relays it behind the
# label of the task it names, where the job's own line (the batch script's) carries an outer
# wrapper's label, if any
_STEP = re.compile(r"Slurm job \d{1,12}\.")
# submitit's handler of the signal Slurm sends a job it preempts: ``Caught signal SIGHUP on node1: this
# job is preempted.`` (then ``Requeued job N``); the scheduler's own CANCELLED line, where the log has it,
# is the same event
_PREEMPT_NOTICE = re.compile(r"Caught signal \w{1,12} on \S{1,200}: this job is preempted")
_SLURM_REASON = {"TIME LIMIT": "time_limit", "PREEMPTION": "preempted", "NODE FAILURE": "node_failure",
                 "NODE_FAIL": "node_failure"}


def _short(text: str, n: int = 300) -> str:
    text = text.strip()
    return text if len(text) <= n else text[: n - 3] + "..."


def _shm_full(text: str, rank: int | None) -> Failure:
    return Failure("host_oom", rank, None, "shared memory (/dev/shm) full: " + _short(text), HINTS["shm"],
                   key="shm")


def match_line(text: str, rank: int | None, global_rank: bool = False) -> Failure | None:
    """One line -> a Failure (line number filled in by the caller), or None. A rank that is the
    process's global one (``global_rank``: torch's ``[rank15]:``) beats the message's ``[Rank 1]``,
    the rank in the collective's process group; else the message names it (c10d.rank_in)."""
    if not global_rank:
        rank = c10d.rank_in(text, rank)  # the message names it: [E ...] [Rank 0]
    if "CUDA OOMs: " in text and oom.SUMMARY_OOMS.search(text):
        return Failure("gpu_oom", rank, None, "torch's memory summary counts out-of-memory errors: "
                       + _short(text), HINTS["gpu_oom"], key="oom:summary")
    if "memory" in text or "ALLOC" in text or "MemoryError" in text or "bad_alloc" in text \
            or "Out Of Memory" in text or "oom" in text:
        m = LABKIT_OOM.search(text)
        if m:
            r = int(m.group(1))
            cap = "memory_limit_gb" in text or "CUDA" not in text
            kind = "host_oom" if cap else "gpu_oom"
            msg = "CPU allocator cap exceeded: " + _short(text) if cap else _short(text)
            return Failure(kind, r, None, msg, HINTS["cpu_alloc" if cap else "gpu_oom"],
                           key=oom_key(text))  # the key of torch's own error that follows: one event
        if "killed due to" in text and RAY_OOM.search(text):  # before GPU_OOM: Ray's OutOfMemoryError
            return Failure("host_oom", rank, None, "Ray's memory monitor killed a worker: " + _short(text),
                           HINTS["host_oom"], key="ray-oom")
        if GPU_OOM.search(text):
            return Failure("gpu_oom", rank, None, _short(text), HINTS["gpu_oom"], key=oom_key(text))
        if CPU_OOM.search(text):
            return Failure("host_oom", rank, None, "CPU allocator out of memory: " + _short(text),
                           HINTS["cpu_alloc"], key=oom_key(text))
        if SLURM_OOM.search(text):
            return Failure("host_oom", rank, None, "Slurm/kernel OOM killer: " + _short(text),
                           HINTS["host_oom"], key="slurm-oom")
        if "shared memory" in text and _SHM_SHORT.search(text):
            return _shm_full(text, rank)
    if any(w in text for w in ("atchdog", "imeout", "imed out", "monitor", "stuck", " hung", "eadlock")):
        c = c10d.match(text, rank, global_rank)
        if c is not None:
            kind, r, msg, hint, key = c
            return Failure(kind, r, None, msg, HINTS[hint], key=key)
    c = cuda.cuda_error(text, rank)
    if c is not None:
        r, msg, hint, key = c
        return Failure("cuda_error", r, None, _short(msg), HINTS[hint], key=key)
    if "***" in text and "CANCELLED" in text:
        m = _SLURM.search(text)
        if m:
            reason = (m.group(4) or "").strip()
            kind = _SLURM_REASON.get(reason, "cancelled")
            hint = HINTS["task_failure" if reason == "TASK FAILURE" else kind]  # srun --kill-on-bad-exit
            node = m.group(2) or m.group(5)
            msg = f"Slurm job {m.group(1)} cancelled at {m.group(3)}" \
                + (f" due to {reason}" if reason else "") \
                + (f" (reported by {node})" if node else "")  # slurmstepd's node, not the failed one
            return Failure(kind, rank, None, msg, hint, key="slurm")
    if "Node failure" in text or "failed on node" in text or "NODE_FAIL" in text:
        m = _NODE_FAIL.search(text)
        if m:
            node = m.group(1) or m.group(2)
            msg = (f"{_FAILED_NODE}{node} failed under the job: " if node else "") + _short(text)
            return Failure("node_failure", rank, None, msg, HINTS["node_failure"], key="slurm")
    if "exitcode" in text and "local_rank" in text:
        m = launchers.TORCHRUN_FAIL.search(text)
        if m and m.group(1) == "-9":
            r = int(m.group(2))  # a local rank: the global one comes from the root-cause table
            return Failure("host_oom", None, None, f"worker local_rank {r} killed by SIGKILL (exit -9): "
                           + _short(text), HINTS["sigkill"], evidence="signal", key="sigkill")
    if "ENOSPC" in text or "No space" in text or "quota" in text or "Errno 28" in text:
        if _DISK_FULL.search(text) and _KERNEL_TABLE.search(text) is None:
            if SHM.search(text):
                return _shm_full(text, rank)
            return Failure("disk_full", rank, None, _short(text), HINTS["disk_full"], key="disk")
    if "failed to extend" in text and SHM.search(text):  # NCCL's shmutils.cc: /dev/shm could not grow
        return _shm_full(text, rank)
    if "Uncaught " in text or "function raise error" in text:
        m = _UNCAUGHT.search(text)
        if m:
            msg = f"{m.group(1) or m.group(2)}: {m.group(3)}"
            return Failure("python_exception", rank, None, _short(msg), HINTS["python_exception"],
                           key=f"exc:{msg[:120]}")
    if "truncated or corrupt" in text and _BAD_CKPT.search(text):
        return Failure("bad_checkpoint", rank, None, _short(text), HINTS["bad_checkpoint"], key="ckpt")
    return None


def is_comm_consequence(message: str) -> bool:
    return _COMM_CONSEQUENCE.search(message) is not None


def exception_failure(message: str, rank: int | None, line: int | None, stopping: bool = False) -> Failure:
    """An uncaught exception (``Name: text``): a python_exception; a communication error's, or one
    raised while a signal stopped the process (exceptions.TERMINATED), as such."""
    msg = _short(message)
    evidence = "stopping" if stopping else "comm" if is_comm_consequence(msg) else "log"
    hint = HINTS["python_exception" if evidence == "log" else f"{evidence}_exception"]
    return Failure("python_exception", rank, line, msg, hint, evidence=evidence, key=f"exc:{msg[:120]}")


_KILLS = ("sigkill", "slurm-oom", "ray-oom")  # host_oom keys of a process killed, not of an error it raised
_TORCH_DIST = re.compile(r"torch[/\\.]distributed[/\\.]")  # a frame's file, or its call's name


def _explains(f: Failure, frame: str) -> bool:
    """Whether a failure the log states is the one a cut traceback (its last frame) was raised for
    (FailureScanner.close)."""
    if f.kind == "nccl_timeout":
        return _TORCH_DIST.search(frame) is not None
    return f.kind not in _SCHEDULER and f.key not in _KILLS


_TABLE_ENTRY = re.compile(r"^\s{0,4}\[\d{1,6}\]:\s*$")  # a rank's entry in the ChildFailedError table


class FailureScanner:
    """Feed cleaned lines in order; ``failures`` holds the merged records.

    Stateful for what spans lines: Python tracebacks (per rank) and torch elastic's JSON error
    records (exceptions.py), torchrun's ChildFailedError root-cause table, and messages
    hard-wrapped over two lines. ``close`` at the end of a log.
    """

    def __init__(self) -> None:
        self.failures: list[Failure] = []
        self._by_key: dict[tuple[str, str], Failure] = {}
        self._tb = Tracebacks()
        self._records = ErrorRecords()
        self._child: Failure | None = None  # the open ChildFailedError record
        self._own_tb: set[int] = set()  # lines of its table's ``traceback :`` fields that hold a traceback
        self._child_left = 0
        self._victims = False  # inside the table's "Failures:" part (ranks stopped by the root cause)
        self._prev: Line | None = None
        self._preempt = False  # a preemption notice seen (submitit: "... this job is preempted.")

    @property
    def busy(self) -> bool:
        """True while a multi-line record is open (the caller must then feed every line)."""
        return self._tb.busy or self._records.busy or self._child_left > 0

    def add(self, f: Failure) -> Failure:
        if f.key.startswith("wd-what"):  # a what():'s repeat of a watchdog's timeout
            f.key, f.rank = c10d.repeated(f.key, f.rank, [k for kind, k in self._by_key if kind == f.kind])
        elif f.key.startswith("oom:"):  # torch's error naming its device, the engine's line none
            f.key = same_oom(f.key, [k for kind, k in self._by_key if kind == f.kind])
        k = (f.kind, f.key)
        old = self._by_key.get(k)
        # a Slurm cancellation is the job's, whichever task's label it carries: one event
        if old is not None and (old.rank == f.rank or f.rank is None or old.rank is None or f.key == "slurm"):
            old.count += 1
            if old.rank is None or f.rank is not None and _STEP.match(f.message):
                old.rank = f.rank  # a step's line names the task srun relayed it for: its label wins
            # slurmstepd's "JOB .. ON node1 CANCELLED .. DUE TO NODE FAILURE" names the node that
            # reported it; srun's "Node failure on node2", in either order, names the one that failed
            if f.message.startswith(_FAILED_NODE) and not old.message.startswith(_FAILED_NODE):
                old.message, old.line = f.message, f.line
            return old
        self._by_key[k] = f
        self.failures.append(f)
        return f

    def feed(self, line: Line) -> None:
        r = self._tb.rank_of(line) if self._tb.busy else None
        if r is not None:  # a traceback's bare line after its prefixed header: that rank's
            line = replace(line, rank=r)
        text = line.text
        f = match_line(text, line.rank, line.global_rank)
        prev = self._prev
        wide = prev is not None and max(prev.width, len(prev.text)) >= 60  # printed width, prefixes in
        if (f is None or f.rank is None and prev is not None and prev.rank is not None) and prev is not None \
                and prev.lineno == line.lineno - 1 and wide and not prev.text.rstrip().endswith("|"):
            # a message hard-wrapped over two lines (its rank, too, may be on the first): try the join
            for joined in (prev.text + text, prev.text + " " + text):  # (with and without the space)
                g = match_line(joined, line.rank if line.rank is not None else prev.rank) \
                    if match_line(prev.text, prev.rank) is None else None
                if g is not None and (f is None or g.kind == f.kind):
                    f, g.line = g, prev.lineno
                    break
        if f is not None and f.kind == "disk_full" and prev is not None and (
                prev.lineno == line.lineno - 1 and SHM_CALL.search(prev.text)
                or ("host_oom", "shm") in self._by_key and "/" not in text):
            f = _shm_full(text, line.rank)  # the frame's call above, or the same error again unnamed
        self._preempt = self._preempt or "preempted" in text
        if f is None and _PREEMPT_NOTICE.search(text):  # the job's own notice, before Slurm requeues it
            f = Failure("preempted", None, line.lineno, text.strip(), HINTS["preempted"], key="slurm")
        said = self._records.feed(text, line.lineno)  # a JSON error record's exception (read as data)
        if said is not None and f is None:
            f = match_line(said, line.rank) or exception_failure(said, line.rank, None)
            f.line = self._records.start
        if f is not None:
            if f.line is None:
                f.line = line.lineno
            if f.kind == "cancelled" and self._preempt and "due to JOB REQUEUE" in f.message:
                f.kind, f.hint, f.message = "preempted", HINTS["preempted"], f.message + " (preempted)"
            f = self.add(f)
        self._prev = line
        said = any(w in text for w in launchers.WORDS) and self._worker_failed(line, text)
        self._child_table(line, text, prev)
        again = f is not None and c10d.RAISED_AGAIN in text  # the timeout raised again: an exception too
        self._traceback(line, text, (f is not None or said) and not again)

    def _worker_failed(self, line: Line, text: str) -> bool:
        reports = launchers.worker_failed(text)
        for kind, rank, msg, hint, evidence, key in reports:
            self.add(Failure(kind, rank, line.lineno, msg, HINTS[hint], evidence=evidence, key=key))
        return any(evidence != "signal" for *_, evidence, _key in reports)  # a guess explains no exception

    def _child_table(self, line: Line, text: str, prev: Line | None = None) -> None:
        if "ChildFailedError" in text and "raise " not in text and "import" not in text \
                and "# ChildFailedError" not in text:  # (code a traceback shows: its comment)
            self._child = self.add(Failure("child_failed", line.rank, line.lineno,
                                           "torchrun: a worker failed (ChildFailedError)",
                                           HINTS["child_failed"], key="child"))
            self._child_left, self._victims = 40, False
            return
        m = _ROOT_FIELD.match(text)
        if (self._child_left <= 0 or self._child is None) and m and (
                m.group(1) == "exitcode" and _TABLE_EXIT.match(m.group(2).strip())
                or m.group(1) == "traceback" and (_TABLE_SIGNAL.match(m.group(2).strip())
                                                  or m.group(2).startswith("Traceback (most recent"))):
            # a root-cause row without its header (a pasted part of the table; a ``traceback :`` field
            # holding a traceback, the rank's error file, is printed by that table alone)
            self._child = self.add(Failure("child_failed", line.rank, line.lineno,
                                           "torchrun: a worker failed (ChildFailedError table)",
                                           HINTS["child_failed"], key="child"))
            self._child_left, self._victims = 8, False
            pm = _ROOT_FIELD.match(prev.text) if prev is not None else None
            if pm and pm.group(1) == "rank" and prev is not None and prev.lineno == line.lineno - 1:
                self._child_table(prev, prev.text)
        if self._child_left <= 0 or self._child is None:
            return
        if _TABLE_ENTRY.match(text):
            self._child_left = 16  # each rank's entry ([N]:, then its fields) has lines of its own
        elif not text.startswith("    "):  # a field's value over several lines (a traceback : ...)
            self._child_left -= 1
        if text.strip().startswith(("Failures:", "Other Failures:", "Root Cause")):
            self._victims = not text.strip().startswith("Root Cause")
        if not m:
            return
        name, value = m.group(1), m.group(2).strip()
        if name == "traceback" and value.startswith("Traceback"):  # the rank's own, from its error file
            self._own_tb.add(line.lineno)
        c = self._child
        if self._victims:  # a rank stopped because another one failed first: not a cause
            if name == "rank" and "stopped by the root cause" not in c.message:
                c.message += f"; rank {value} stopped by the root cause"
            return
        if name == "rank":  # the table's global rank beats whatever prefix the agent line had
            rm = re.match(r"(\d{1,6})", value)
            c.rank = int(rm.group(1)) if rm else c.rank
            c.message += f"; root cause rank {value}"
        elif name == "exitcode" and "exitcode " not in c.message:
            c.message += f", exitcode {value}"
            if value.startswith("-9") or value.startswith("137"):
                self.add(Failure("host_oom", c.rank, line.lineno, f"rank {c.rank} killed by SIGKILL "
                                 f"(exitcode {value})", HINTS["sigkill"], evidence="signal", key="sigkill"))
        elif name == "host":
            c.message += f", host {value}"
        elif name == "traceback" and (sig := _TABLE_SIGNAL.match(value)):
            c.message += f" ({value})"
            if sig.group(1) == "9":
                self.add(Failure("host_oom", c.rank, line.lineno, f"rank {c.rank} killed by SIGKILL "
                                 f"({value})", HINTS["sigkill"], evidence="signal", key="sigkill"))

    def _traceback(self, line: Line, text: str, matched: bool) -> None:
        exc = self._tb.feed(line)
        if exc is not None and not matched and "ChildFailedError" not in text:
            self.add(exception_failure(exc, line.rank, line.lineno, self._tb.after_stop))  # no rule says more

    def close(self) -> None:
        """The end of the log: a traceback still open was cut before its exception line, which the
        log does not show. Where the log reports a process's failure elsewhere that a traceback ends
        in (an exception, a CUDA error, an OOM error, a launcher's failed worker), the cut traceback
        is taken for that failure's (ranks and launchers print one failure more than once); so is
        one whose last frame is a torch.distributed call, where a collective timed out (the
        watchdog's line is that call's failure). A process something killed (SIGKILL, an OOM
        killer) or a watchdog reported prints no traceback of that failure: beside those, and alone,
        the cut traceback is an exception of its own (its last frame is told), ranked after what
        the log states (a scheduler's end). A rank's traceback in torchrun's table (its ``traceback :``
        field, from the rank's error file) is that rank's exception, which the table reports."""
        for rank, start, frame in self._tb.cut():
            if start not in self._own_tb and any(_explains(f, frame or "") for f in self.failures):
                continue
            msg = "a traceback the log cuts before its exception line" + (f" (last frame: {frame})"
                                                                           if frame else "")
            self.add(Failure("python_exception", rank, start, _short(msg), HINTS["python_exception"],
                             evidence="cut", key=f"exc:cut:{start}"))
        self._records = ErrorRecords()
