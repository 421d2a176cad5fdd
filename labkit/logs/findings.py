"""What a log shows beyond its records: which tools printed it, how far the job got, and the
findings no record or failure states.

A log with nothing but NCCL's start-up lines is a job that stopped or hung after (or during)
NCCL's initialisation: the most important log there is, so it is read, never refused, and the
finding says where it stopped::

    NCCL initialised on IB (4 HCAs), no iteration logged: the job stopped or hung after
    initialisation (last line 212)

NCCL's network lines over the versions (2.4 to today)::

    NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ; OOB eth0:10.0.0.1<0>     (HCAs, IB or RoCE)
    NET/Socket : Using [0]eth0:10.0.0.1<0> [1]eth1:...                       (socket interfaces)
    Using network IB | Socket | AWS Libfabric, Using internal Network Socket (the chosen network)
    NET/OFI Selected Provider is efa                                         (libfabric provider)
    comm 0x55d0 rank 0 nranks 16 cudaDev 0 busId 1b000 - Init COMPLETE       (init finished)

fp16 loss scaling (DeepSpeed, apex, fairseq) prints one line per skipped step (a terminal's hard wrap
pasted into it, a run of blanks inside a word, is taken out first)::

    [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768
    [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, but hysteresis is 2...
    [deepspeed] fp16 dynamic loss scale overflow! Skipping step. Attempted loss scale: 4096, ...
    Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0
    Reducing dynamic loss scale from 4096.0 to 2048.0 / NOTE: overflow detected, setting loss
    scale to: 64.0 / Current loss scale already at minimum - cannot decrease scale anymore
    Skipped batch, new scale: 512.0                        (MLPerf GNMT's fp16 optimizer)

A run that states its own end did not hang, whatever else its log lacks: MLPerf's ``run_stop`` event
(``:::MLLOG {..., "key": "run_stop", ..., "metadata": {..., "status": "success"}}``, v0.6's ``:::MLL
1561427911.996 run_stop: {"value": null, "metadata": {"status": "success", ...}}``) with its status.
A log with no iteration that ends so is said to have ended (``run_ended``), not to have stopped or hung.

Each is a skipped step and the scale after it (DeepSpeed's next ``step=`` record takes it as its
``loss_scale``; the finding counts the skipped steps, per process (a line naming none that repeats the
last one's fall of the scale is another process's), and names the scale; where a log
prints ``Skipping step`` lines, those count the steps, and a scale line beside them is the same
step's); a scale that falls to 1 or its minimum is a finding (the loss diverged or the gradients
hold inf/nan).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

from labkit.logs.lines import Line

# A line of a known tool: (tool, words that only it prints). Checked on the lines that reach the
# parsers (scan.TRIGGERS picks them the same way on every path); a word too common in chatter
# to be a trigger ("torch.distributed", "megatron") counts only on a line picked for another.
TOOL_WORDS = (
    ("NCCL", ("NCCL", "nThread ", "algbw", "Avg bus bandwidth",  # nccl-tests; a page may eat "#"
              " INFO init.cu:", " INFO bootstrap.cu:", "include/socket.h:", "include/net.h:")),  # 2018
    ("torch", ("torchrun", "torch.distributed", "ProcessGroup", "ChildFailedError", "exitcode",
               "Traceback", "torchelastic", "elastic_operator", "Rendezvous", "orker group",  # elastic
               "FSDP",  # PyTorch's fully sharded data parallel (open_lm's After FSDP ... on rank 6)
               "DDP",  # its DistributedDataParallel (a script's own ``DDP: Hi from rank 0 of 2``)
               "c10d", "TCPStore",  # the store and its sockets: [c10d] The client socket has failed ...
               "DataLoader worker")),
    ("DeepSpeed", ("eepSpeed", "eepspeed", "OVERFLOW", "sigkill_handler", ":log_dist]", "STAGE_PARAMS=",
                   "Partitioning pipeline stages")),  # its PipelineModule's split of the layers
    ("Megatron", ("egatron", "NeMo", "neox", "iteration", "- arguments -")),
    ("HF", ("{'loss': ", '{"loss": ', "transformers", "ccelerate")),
    ("MPI", ("mpirun", "orterun", "prterun", "job  terminated normally")),  # Open MPI's launcher
    ("Slurm", ("slurm", "srun", "salloc", "sbatch", "SLURM", "CANCELLED", "NODE_FAIL")),
    ("CUDA", ("CUDA", "cuda", "Xid", "NVRM", "CUDNN_STATUS")),  # NVRM: the kernel driver's dmesg lines
    ("trainer", ("Lightning", "v_num=", "torchtitan", "nanotron", "picotron", "nanoGPT", "fairseq",
                 '{"epoch": ', "olmo.train", "orovod", "MaxText", "nanochat", ":::MLLOG",
                 "levanter", "paxml", "t5x", "jax.")),  # JAX's stacks (XLA's own lines name no trainer)
)
_TOOLS = re.compile("|".join(f"(?P<{tool}>{'|'.join(re.escape(w) for w in words)})"
                             for tool, words in TOOL_WORDS))
_HCA = re.compile(r"\[\d{1,3}\]\s?([\w.-]{1,40}):\d{1,3}/(IB|RoCE)")
_SOCKET = re.compile(r"\[\d{1,3}\]([\w.-]{1,40}):")
_NETWORK = re.compile(r"Using (?:internal )?[Nn]etwork ([\w-]{1,40}(?: [A-Z][\w-]{1,40})?)")
_VIA_NET = re.compile(r" via (?:NET/([\w-]{1,40})|P2P|SHM)")
_OFI = re.compile(r"NET/OFI Selected [Pp]rovider is (\w{1,40})")
_SCALE = re.compile(
    r"[Aa]ttempted loss scale: ([0-9.eE+-]{1,30}), (?:reducing to ([0-9.eE+-]{1,30})|but hysteresis)"
    r"|[Rr]educing (?:dynamic )?loss scale (?:from ([0-9.eE+-]{1,30}) )?to ([0-9.eE+-]{1,30})"
    r"|setting loss scale to: ([0-9.eE+-]{1,30})"
    r"|[Ss]kipped (?:batch|step|iteration),? new (?:loss )?scale:? ([0-9.eE+-]{1,30})")  # MLPerf's GNMT
# the run's own end (module docstring); its words hold no trigger: loops.add_lines offers the lines of
# a log without iterations that hold one of UNTRIGGERED (the first pass saw only those beside a trigger)
_RUN_STOP = re.compile(r'run_stop\b.{0,4000}?"status":\s{0,2}"(\w{1,40})"')
UNTRIGGERED = ("scale to", "run_stop", "new scale")
_SCALE_FLOOR = re.compile(r"loss scale already at minimum|[Mm]inimum loss scale reached")
# the process an overflow line names (``OVERFLOW! Rank 0``, ZeRO-2's ``loss scale overflow! Rank 6``): each
# process skips the step, so the lines of several at one step are one skipped step
_DS_RANK = re.compile(r"(?:OVERFLOW|overflow)! Rank (\d{1,6})")
# A program's output, by the shape of a line, where no line names a tool labkit knows (XLA's, Paddle's,
# TensorFlow's, a script's own prints): a time of day, a log level, glog/absl's ``I1205 17:47:11``,
# a process's ``(pid=N)``, an exception, the shell's word for a crash; a status that goes on (MaxText's
# ``Starting multihost runner...``), a count of work done (``Completed 0/2``, ``100%``), a training
# loop's counter (``[GPU0] Epoch 0 | Batchsize: 32``), Open MPI's tag of a rank's output, Ray's mark of
# a line its workers printed again (``[repeated 7x across cluster]``).
_OUTPUT = re.compile(r"\d\d:\d\d:\d\d|\b(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL|FATAL)\b"
                     r"|(?:^|\s)[IWEF]\d{4} |\(pid=\d|\w(?:Error|Exception)\b|Traceback|\b[Ee]rror code\b"
                     r"|\b[Ll]oss:? [-+]?\d"  # a loss: the DDP tutorial's ``Epoch 0 | ... | Loss: 0.24``
                     r"|\b(?:[Ee]poch|EPOCH|[Ss]tep|[Ii]ter|[Ii]teration)[ :=#]{1,3}\d"  # a loop's counter
                     r"|\[\d{1,6},\d{1,6}\]<std(?:out|err)>:"  # Open MPI's tag: a program mpirun ran
                     r"|\[repeated \d{1,9}x across cluster\]"
                     r"|Killed|Aborted|Segmentation fault|core dumped|\w\.\.\.\s*$|\b[Cc]ompleted \d{1,9}/\d"
                     r"|\b\d{1,3}%\s")
# A config's line (YAML, INI, TOML): ``key: value``, ``- item``, ``key = value``, a section, a comment
_CONFIG_LINE = re.compile(r"\s*(?:#|;|- |[\w.\"'-]{1,80}(?::(?:\s|$)|\s{0,4}=)|\[[\w. -]{1,80}\]\s*$)")
_OUTPUT_BYTES = 8 << 20  # what program_output looks at, from the start
_LOG_ENTRY = {"severity", "levelname", "logName", "textPayload", "jsonPayload"}  # a log service's keys
# A terminal's hard wrap pasted as text: the rest of the row filled with blanks, mid-word
# (``Attempted loss scal                                 e: 8192``).
_WRAP = re.compile(r" {8,200}")


def _num(s: str | None) -> float | None:
    """A finite number, else None: "inf", "nan" or 400 digits in a damaged line are no reading
    (and JSON has no word for them)."""
    try:
        x = float(s) if s else None
    except ValueError:
        return None
    return x if x is not None and math.isfinite(x) else None


def _unwrap(text: str) -> str:
    """An fp16 loss-scale line with a hard wrap's blanks in it, whole again: blanks between two
    letters or digits were inside a word (dropped), elsewhere they stand for one space."""
    return _WRAP.sub(lambda m: "" if (m.start() and m.end() < len(text) and text[m.start() - 1].isalnum()
                                      and text[m.end()].isalnum()) else " ", text)


class Seen:
    """Facts gathered line by line (``observe``); ``findings`` says them at the end."""

    def __init__(self) -> None:
        self.tools: dict[str, int] = {}  # tool -> first line
        self.last_line = 0  # the last line of any known tool
        self.nccl_lines = 0
        self.hcas: dict[str, str] = {}  # device -> IB | RoCE
        self.sockets: set[str] = set()
        self.network: str | None = None
        self.init_complete = 0
        self.overflows: dict[Any, int] = {}  # skipped steps per process (its "Skipping step" lines)
        self.reductions: dict[Any, int] = {}  # scale changes per process, on lines that say no skip
        self.scale: float | None = None  # the loss scale after the last change
        self.scale_start: float | None = None
        self.scale_min: float | None = None
        self.floor_line: int | None = None
        self.scale_line = 0
        self._start_line = 0
        self._scales: set[tuple[int, str]] = set()  # the scale lines counted (a line read twice counts once)
        self.ended: tuple[int, str] | None = None  # (line, status) of the run's own end (run_stop)
        self.output_line = 0  # a log of no known tool: its last line of a program's output
        self._fall: tuple | None = None  # the last fall of the scale a line naming no process told
        self._copies = 0  # the lines that told it again since

    def mark(self, tool: str, lineno: int) -> None:
        self.tools.setdefault(tool, lineno)
        self.last_line = max(self.last_line, lineno)

    def observe(self, line: Line) -> None:
        text = line.text
        for m in _TOOLS.finditer(text):
            self.mark(m.lastgroup or "", line.lineno)
        if line.logger is not None:  # the logger a prefix named: INFO:torch.distributed.elastic...:
            for m in _TOOLS.finditer(line.logger):
                self.mark(m.lastgroup or "", line.lineno)
        if "NCCL" in text or "NET/" in text:
            self._nccl(text)
        if "        " in text and ("OVERFLOW" in text or "oss sca" in text):
            text = _unwrap(text)
            line = Line(line.lineno, line.rank, text, line.host, line.width)
        if "scale" in text:
            self._scale(line)
        if "run_stop" in text:
            m = _RUN_STOP.search(text)
            if m:
                self.ended = (line.lineno, m.group(1))

    def _nccl(self, text: str) -> None:
        self.nccl_lines += 1
        if "NET/IB" in text and "Using" in text:
            for dev, kind in _HCA.findall(text):
                self.hcas.setdefault(dev, kind)
        elif "NET/Socket" in text and "Using" in text:
            self.sockets.update(_SOCKET.findall(text.split("Using", 1)[1]))
        if "etwork" in text:
            m = _NETWORK.search(text)
            if m:
                self.network = m.group(1)
        elif "NET/OFI" in text:
            m = _OFI.search(text)
            if m:
                self.network = f"OFI ({m.group(1)})"
        if "Init COMPLETE" in text or "Connected all" in text:
            self.init_complete += 1
        elif " via " in text:
            m = _VIA_NET.search(text)
            if m:
                self.init_complete += 1  # a channel connected: initialisation got that far
                self.network = self.network or m.group(1)

    def _scale(self, line: Line) -> None:
        text = line.text
        m = _SCALE.search(text)
        if m is None:
            if _SCALE_FLOOR.search(text) and self.floor_line is None:
                self.floor_line = line.lineno
            return
        if (line.lineno, text) in self._scales:  # read again by the loop-line pass (loops.add_lines)
            return
        self._scales.add((line.lineno, text))
        before = _num(m.group(1) or m.group(3))
        after = _num(m.group(2) or m.group(4) or m.group(5) or m.group(6)) or before  # hysteresis: kept
        if after is None:
            return
        r = _DS_RANK.search(text)
        src: tuple = (int(r.group(1)) if r else line.rank, line.host)
        if src[0] is None and before is not None and after < before:
            # one process's scale falls at each change, so the same fall again, from a line naming no
            # process, is the next process's copy of it (DeepSpeed 0.3's ZeRO-1 logs it on every rank)
            self._copies = self._copies + 1 if (before, after, line.host) == self._fall else 0
            self._fall, src = (before, after, line.host), (*src, self._copies)
        count = self.overflows if "kipping step" in text or "kipped" in text else self.reductions
        count[src] = count.get(src, 0) + 1
        if self.scale_start is None or line.lineno < self._start_line:  # in the log's order, though
            self.scale_start = before if before is not None else after  # a later pass reads a line
            self._start_line = line.lineno  # the first pass left out
        if line.lineno >= self.scale_line:
            self.scale, self.scale_line = after, line.lineno
        self.scale_min = after if self.scale_min is None else min(self.scale_min, after)

    @property
    def skipped_steps(self) -> int:
        """fp16 overflow steps skipped (the most any one process reported: every rank skips the same).
        Where a log prints ``Skipping step`` lines, each is one; the scale changes printed beside them
        (FP16_Optimizer's ``Reducing dynamic loss scale from 1 to 1`` on every process) count only
        in a log that prints none."""
        return max((self.overflows or self.reductions).values(), default=0)

    def network_words(self) -> str | None:
        if self.hcas:
            kinds = sorted(set(self.hcas.values()))
            n = len(self.hcas)
            return f"{'/'.join(kinds)} ({n} HCA{'s' if n != 1 else ''})"
        if self.sockets:
            return f"sockets ({', '.join(sorted(self.sockets)[:4])})"
        return self.network

    def findings(self, iterations: int, failures: int) -> list[dict[str, Any]]:
        """What to say about the log as a whole: ``[{"kind", "line", "message"}]``."""
        out: list[dict[str, Any]] = []
        if iterations == 0 and failures == 0 and self.output_line and not self.tools \
                and not self.skipped_steps and self.floor_line is None:
            out.append({"kind": "no_iteration", "line": self.output_line,
                        "message": f"a program's output (time stamps, log levels, errors, progress) "
                                   f"with no line of a tool labkit reads (NCCL, torch, DeepSpeed, "
                                   f"Megatron/NeMo, HF, Slurm, CUDA, the training loops it knows): no "
                                   f"iteration or failure found (last line {self.output_line})"})
        if iterations == 0 and failures == 0 and self.tools and not self.skipped_steps:
            out.append(self._stopped())
        if self.skipped_steps:
            collapsed = (self.floor_line is not None
                         or (self.scale_min is not None and self.scale_min <= 1.0))
            scale = f"{self.scale_start:g} -> {self.scale:g}" if self.scale is not None else "?"
            if collapsed:
                out.append({"kind": "loss_scale_collapse", "line": self.floor_line or self.scale_line,
                            "skipped_steps": self.skipped_steps, "loss_scale": self.scale,
                            "message": f"fp16 loss scale collapsed ({scale}, {self.skipped_steps} "
                                       f"overflow steps skipped): the loss diverged or the gradients "
                                       f"hold inf/nan - lower the learning rate, check the data, or "
                                       f"train in bf16"})
            else:
                out.append({"kind": "fp16_overflow", "line": self.scale_line,
                            "skipped_steps": self.skipped_steps, "loss_scale": self.scale,
                            "message": f"{self.skipped_steps} fp16 overflow steps skipped, loss scale "
                                       f"{scale}"})
        elif self.floor_line is not None:
            out.append({"kind": "loss_scale_collapse", "line": self.floor_line,
                        "message": "fp16 loss scale at its minimum: the loss diverged or the "
                                   "gradients hold inf/nan"})
        return out

    def _stopped(self) -> dict[str, Any]:
        where = f" (last line {self.last_line})"
        if self.ended is not None:
            line, status = self.ended
            net = self.network_words() if self.nccl_lines else None
            return {"kind": "run_ended", "line": line,
                    "message": (f"NCCL initialised on {net}; " if net else "")
                    + f"the run reports its own end (MLPerf run_stop, status {status}, line {line}): it "
                    f"did not hang; no iteration is logged in a form labkit reads"}
        if self.nccl_lines:
            net = self.network_words()
            on = f" on {net}" if net else ""
            if self.init_complete:
                msg = (f"NCCL initialised{on}, no iteration logged: the job stopped or hung after "
                       f"initialisation{where}")
            else:
                msg = (f"NCCL initialising{on} (no communicator reported Init COMPLETE), no iteration "
                       f"logged: the job stopped or hung during NCCL initialisation{where}")
            return {"kind": "stopped_after_init", "line": self.last_line, "message": msg}
        tools = ", ".join(sorted(self.tools, key=self.tools.__getitem__))
        return {"kind": "no_iteration", "line": self.last_line,
                "message": f"{tools} lines, no iteration logged: the job stopped or hung before "
                           f"training began{where}"}


def program_output(lines: Iterable[str] | Iterable[bytes]) -> int:
    """The last line (1-based) of the first _OUTPUT_BYTES of ``lines`` shaped as a program's output
    (``_OUTPUT``); 0 where none is, or where the text is a run's config: JSON, or YAML / INI / TOML
    lines (``_CONFIG_LINE``) on nine lines in ten. A log of tools labkit does not know is still a
    log, read as one with nothing in it (the finding says so); a config passed by mistake is refused."""
    head: list[str] = []
    size = last = 0
    for n, raw in enumerate(lines, 1):
        line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        size += len(line)
        if size > _OUTPUT_BYTES:
            break
        head.append(line)
        if _OUTPUT.search(line):
            last = n
    text = "".join(head) if head and head[0].endswith("\n") else "\n".join(head)
    if not last or text.lstrip()[:1] in ("{", "["):  # JSON is a config, or a record parse.py reads,
        try:  # unless it is a log service's entry (Cloud Logging's ``"severity": "ERROR"``, ``jsonPayload``)
            doc = json.loads(text)
            entries = doc if isinstance(doc, list) else [doc]
            return len(head) if any(isinstance(e, dict) and _LOG_ENTRY & set(e) for e in entries) else 0
        except ValueError:
            pass
    kept = [ln for ln in head if ln.strip()]
    keys = Counter(m.group(0) for ln in kept if (m := _CONFIG_LINE.match(ln)))
    # (one "key" before most lines is a prefix, a node's or a logger's: ``worker-1: EH9999: ...``)
    prefix = next((k for k, n in keys.most_common(1)  # (a comment's ``#``, a list's ``- ``: none)
                   if n > max(3, len(kept) // 2) and k.rstrip().endswith(":")), None)
    if sum(n for k, n in keys.items() if k != prefix) >= 0.9 * len(kept):
        return 0
    return last


def found_nothing(parsed) -> bool:  # noqa: ANN001 - a ParsedLog (parse.py imports this module)
    """No line of any tool labkit reads (NCCL, torch, DeepSpeed, Megatron/NeMo, HF, Slurm, CUDA,
    the other training loops): ``labkit parse`` refuses such a file as no training log. Parallel
    sizes alone (``tensor_model_parallel_size: 2``) are a config's, which is no log."""
    frames = (parsed.iterations, parsed.memory, parsed.validation, parsed.params, parsed.nccl)
    return (all(f.empty for f in frames) and not parsed.failure_records and not parsed.args
            and parsed.nccl_version is None and parsed.layout.get("world_size") is None
            and not parsed.tools and not parsed.findings)
