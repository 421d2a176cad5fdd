"""torch.distributed's own failure lines (c10d): the NCCL watchdog, its heartbeat monitor, gloo.

What ProcessGroupNCCL prints, over torch 1.8 to 2.9 (ProcessGroupNCCL.cpp), read here:

- a collective past its timeout, ``nccl_timeout``: ``[Rank 3] Watchdog caught collective operation
  timeout: WorkNCCL(SeqNum=52, OpType=ALLREDUCE, ..., Timeout(ms)=240000) ran for 240077
  milliseconds before timing out.`` (1.8 on; 1.6-1.7's ``Caught collective operation timeout for
  work: WorkNCCL(...)``), a blocking wait's ``Work WorkNCCL(SeqNum=2521, ...) timed out in blocking
  wait.`` (NCCL_BLOCKING_WAIT=1); alone, the watchdog's ``Timeout at NCCL work: 151, last enqueued
  NCCL work: 152`` (2.3 on); gloo's ``Timed out waiting 1800000ms for recv operation``. The lines
  of one collective (its SeqNum, NCCL work N) on one rank are one event.
- the watchdog itself stuck, ``hang``: the heartbeat monitor's ``Heartbeat monitor timed out!
  Process will be terminated after dumping debug info.`` and its fatal ``ProcessGroupNCCL's watchdog
  got stuck for 600 seconds without making progress in monitoring enqueued collectives`` (2.3 on;
  PyTorch's words: "a NCCL/CUDA API hang blocking the watchdog ... please attempt to debug the
  hang"), 2.2's ``NCCL monitor thread timeout. Basically, this could be due to CUDA or NCCL calls
  being unexpectedly blocking``. No collective ran past its timeout (no SeqNum): the process is stuck.

Any other program's own word that it waits and is stuck is a ``hang`` too (XLA's rendezvous: ``This
thread has been waiting for `initialize clique ...` for 10 seconds and may be stuck``; Horovod's stall
inspector: ``... are waiting for remainder of ranks for more than 60 seconds. This may indicate ...
which will cause deadlock.``).

The watchdog's exception is printed again where it ends the process, without the launcher's prefix
or the logger's source file:
``terminate called after throwing an instance of 'c10::DistBackendError'`` / ``what():  [PG 3 Rank 2]
Process group watchdog thread terminated with exception: [Rank 2] Watchdog caught ...``; its ranks are
a process group's, so it is the event of any rank already read with its sequence number (a new one
where none was).

A rank's main thread raises the watchdog's reason again as its own exception (torch 1.13-2.0:
``RuntimeError: NCCL communicator was aborted on rank 0.  Original reason for failure was: [Rank 0]
Watchdog caught ...``): that line is the timeout and the rank's exception both (``RAISED_AGAIN``).

The rank a message names sits in its log prefix, which changed with the versions: ``[Rank 3]``
(to 2.2), ``[PG 0 Rank 1]`` (2.3), ``[PG 0 (default_pg) Rank 1]`` (2.4), ``[PG ID 0 PG GUID
0(default_pg) Rank 11]`` (2.5 on). A rank inside a process group other than 0 is that group's rank,
not the process's.
"""

from __future__ import annotations

import re

RAISED_AGAIN = "Original reason for failure was:"

_SAYS_STUCK = re.compile(r"(?i)\b(?:may|might|could|must) be (?:stuck|hung|hanging|deadlocked)\b"
                         r"|\b(?:is|are|seems?|appears?)(?: to be)? (?:stuck|hung|deadlocked)\b"
                         r"|\bdeadlock detected\b|\bwill (?:cause|lead to) (?:a )?deadlock\b")
WATCHDOG = "aught collective operation timeout"  # Watchdog caught / Caught (1.6-1.7)
_BLOCKING = "timed out in blocking wait"
_SEQ = re.compile(r"SeqNum=(\d{1,12})")
_OPTYPE = re.compile(r"OpType=(\w{1,40})")
_RAN_FOR = re.compile(r"Timeout\(ms\)=(\d{1,12})\) ran for (\d{1,12}) milliseconds")
_RANK_IN = re.compile(r"\[(?:PG (?:ID )?(\d{1,6})[^\]\[]{0,80}? )?Rank (\d{1,6})\]")
_SUBGROUP = re.compile(r"\[PG (?:ID )?(?!0\b)\d{1,6}\b")  # a process group other than 0 (the world)
_WORK_TIMEOUT = re.compile(r"Timeout at NCCL work: (\d{1,12})")
_GLOO_TIMEOUT = re.compile(r"[Tt]imed out waiting (\d{1,12})\s?ms for (\w{1,20}) operation")
# the heartbeat monitor's lines (module docstring); "stuck for N seconds" where the line says it
_HEARTBEAT = ("Heartbeat monitor timed out", "watchdog got stuck for", "NCCL monitor thread timeout")
_STUCK = re.compile(r"stuck for (\d{1,9}) seconds")

Match = tuple[str, "int | None", str, str, str]
"""(kind, rank, message, hint name, merge key): failures.match_line makes it a Failure."""


def rank_in(text: str, rank: int | None) -> int | None:
    """The rank a message names: the first process group 0's (or a bare ``[Rank N]``), else another
    group's where no prefix named one."""
    if "Rank " not in text:
        return rank
    other = None
    for rm in _RANK_IN.finditer(text):
        if rm.group(1) in (None, "0"):
            return int(rm.group(2))
        other = other if other is not None else int(rm.group(2))
    return rank if rank is not None or other is None else other


def match(text: str, rank: int | None, own: bool = False) -> Match | None:
    """A c10d failure line (module docstring) -> Match, else None; ``rank`` is rank_in's (``own``: the
    process's global rank, from torch's ``[rankN]:`` prefix)."""
    if WATCHDOG in text or _BLOCKING in text:
        seq, op, ran = _SEQ.search(text), _OPTYPE.search(text), _RAN_FOR.search(text)
        desc = f"collective timeout on rank {rank}: {op.group(1) if op else '?'}"
        if seq:
            desc += f" (SeqNum={seq.group(1)})"
        if ran:
            desc += f", timeout {int(ran.group(1)) / 1000:g} s, ran for {int(ran.group(2)) / 1000:g} s"
        # C++'s repeat of the exception, its rank a process group's unless torch's prefix named the
        # process; the logger's own line of it (``[E ProcessGroupNCCL.cpp:915] [Rank 2] NCCL watchdog
        # thread terminated with exception: ...``, before 2.3) names its source file: an event
        what = not own and seq and ("what():" in text or "terminated with exception" in text
                                    and "ProcessGroupNCCL.cpp:" not in text)
        which = seq.group(1) if seq else (op.group(1) if op else "")
        tag = ("wd-what-pg" if _SUBGROUP.search(text) else "wd-what") if what else "wd"
        return ("nccl_timeout", rank, desc, "nccl_timeout", f"{tag}:{rank}:{which}")
    if "Timeout at NCCL work: " in text:
        m = _WORK_TIMEOUT.search(text)
        if m:  # the same event as its watchdog line (its SeqNum), where that is in the log
            return ("nccl_timeout", rank, f"collective timeout on rank {rank}: NCCL work {m.group(1)} "
                    "timed out", "nccl_timeout", f"wd:{rank}:{m.group(1)}")
    if "imed out waiting" in text:
        m = _GLOO_TIMEOUT.search(text)
        if m:
            return ("nccl_timeout", rank, f"gloo collective timed out after {int(m.group(1)) / 1000:g} s "
                    f"waiting for {m.group(2)}: {text.strip()[:240]}", "nccl_timeout", f"gloo:{rank}")
    if "monitor" in text or "stuck for" in text:
        if any(h in text for h in _HEARTBEAT):
            m = _STUCK.search(text)
            return ("hang", rank, f"rank {rank}: ProcessGroupNCCL's watchdog stuck"
                    + (f" for {m.group(1)} s" if m else "") + " (heartbeat monitor): a NCCL or CUDA "
                    "call blocks the process", "watchdog_stuck", "heartbeat")
    if _SAYS_STUCK.search(text):
        return ("hang", rank, "a process says it is stuck: " + text.strip()[:280], "hang", "stuck")
    return None


def repeated(key: str, rank: int | None, known: list[str]) -> tuple[str, int | None]:
    """The key and rank of a ``what():``'s repeat of a watchdog timeout (``wd-what:RANK:SEQ``): the event
    of its rank read with its sequence number; where its rank is a process group's other than the
    world's (``wd-what-pg:``, ``[PG 3 Rank 1]``) or unnamed, the event of any rank read with that number;
    else an event of its own (``[Rank 1]``'s, where only rank 0's timeout was logged)."""
    tag, _, seq = key.split(":")
    if tag == "wd-what-pg" or rank is None:
        same = next((k for k in known if k.startswith("wd:") and k.endswith(f":{seq}")), None)
    else:
        same = next((k for k in known if k == f"wd:{rank}:{seq}"), None)
    return (same, None) if same is not None else (f"wd:{rank}:{seq}", rank)
