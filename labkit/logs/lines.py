"""Raw log lines -> clean text: launcher prefixes, ANSI escapes, carriage returns, bad bytes.

Clusters print the same training line in many wrappings. This module peels them off so the
record parsers (megatron.py, deepspeed.py, nccl.py, failures.py) only see what the training
process printed, plus the rank the wrapper told us about:

    torchrun --tee        ``[default3]:text``          (torchrun's worker index)
    TorchX                ``[trainer0|3]:text``        (role and replica, then the rank)
    torch >= 2.2 logging  ``[rank3]:text``
    srun --label          `` 3: text``
    pdsh                  ``node12: text``, ``10.0.0.2: text``, ``localhost: text`` (DeepSpeed's runner
                          on one host; indented where a page quotes it)
    NCCL                  ``node12:4242:4300 text``, ``1000123:4242:4300`` (host:pid:tid, any host)
    Open MPI --tag-output ``[1,4]<stdout>:text``       (job id, rank; SageMaker's
                          ``[1,mpirank:0,algo-1]<stdout>:``; horovodrun's rank alone,
                          ``Fri Sep 25 16:52:57 2020[1]<stderr>:``)
    harnesses, k8s        ``stdout: text``, ``[pod/train-worker-0/pytorch] text``
    torch_xla's xla_dist  ``10.164.0.29 [3] text`` (a TPU VM's address, its worker index)
    Ray                   ``(CommandActor pid=494406) text``, ``(Worker pid=7, ip=10.0.0.2) text``
                          (TorchX's ``ray/0 `` before it; the ip is the host; NeMo RL's
                          ``(MegatronPolicyWorker[rank=97] pid=.., ip=..)``); SkyPilot's
                          ``(head, rank=0, pid=3808) `` (the node's name is the host)
    loggers               time stamps (bare, in brackets or parentheses), ``[INFO]``,
                          ``INFO:torch.distributed.elastic.agent.server.api:``, ``ERROR:root:``,
                          `` - root - INFO - ``, ``[INFO] 2021-09-13 22:18:26,678 api: ``,
                          ``submitit WARNING (2021-03-15 17:50:23,701) - ``, vLLM's month-day
                          ``ERROR 04-07 00:57:46 ray_utils.py:45] ``, a month's name and day
                          (ColBERT's ``[Mar 29, 16:21:59] ``), glog and absl
                          (``I0213 12:07:20.086000 870572 torch/distributed/.../api.py:699] ``,
                          DINOv2's ``I20250104 12:12:42 90 dinov2 helpers.py:102] ``), a Markdown
                          inline code's opening backtick, a quote's ``> `` (Megatron's own
                          ``> building ...`` loses it, harmlessly),
                          a logger's name in brackets before a time stamp (``[titan] 2025-...``),
                          ``[NeMo I 2024-01-01 10:00:00 file:12] ``, NeMo-Run's task and
                          replica (``i.pretrain/0 [default1]:``), nanotron's
                          ``[INFO|DP=0|PP=0|TP=0]:``, OLMo's ``[olmo.train:816, rank=0]``,
                          ezpz's ``[I][ezpz/dist:772:setup]``; fairseq's and loguru's fields
                          between pipes (``| INFO | fairseq.trainer | ``), hydra's
                          ``[fairseq_cli.train][INFO] - ``, ``__main__    : INFO     ``, a Python
                          file's place (``[trainer.py:757] ``, ``log_hooks.py: 277: ``)

Prefixes can nest (``3: [default1]:[rank5]:text``); the innermost rank wins. torch's own ``[rank5]:``
is the process's global rank (``Line.global_rank``): a message's ``[Rank 1]`` behind it is the rank in
the collective's process group (failures.py). The logger names a
prefix states are kept (``Line.logger``): they say which tool printed a line whose own words do
not (``Sending process 33051 closing signal SIGTERM`` behind torch elastic's). A Megatron time
stamp right before ``iteration N`` is the record's own and stays. Colour codes (real, or copied as
text: ``^[[32m``, ``[0m``, or as a logging agent's octal ``#033[A``, ``#015``) and a progress bar a
message was printed onto are dropped. A line a carriage return redrew keeps, in turn, every part
that held a message (a Trainer's dict a bar's redraw followed); a row ``mpirun --tag-output`` tagged
piece by piece is one line, another process's tag inside a line starts a message of its own.
Reading is streaming: a file is iterated line by line in binary and never held whole.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

# ANSI CSI sequences (colours, cursor moves) and the two-character escapes. Linear: no nesting.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
# Colour codes whose ESC was lost or spelt out when the log was copied: ``^[[32m``, ``\033[0m``,
# ``\x1b[1;31m``, or a bare ``[0m`` / ``[1;32m`` (digits and ``;`` only, ending in ``m``).
_ANSI_TEXT = re.compile(r"(?:\^\[|\\033|\\x1[bB]|\\e|\\u001[bB])\[[0-9;?]{0,16}[A-Za-z]"
                        r"|\[(?:\d{1,3};){0,4}\d{1,3}m")
# A tab, carriage return or escape written as ``#011`` / ``#015`` / ``#033`` (rsyslog's, SageMaker's
# CloudWatch agent's: ``Train Epoch: 1 [0/60000 (0%)]#011Loss: 2.323947``)
_OCTAL = re.compile(r"#0(11|1[25]|33)")
# A progress bar (tqdm) another message was printed onto: `` 45%|####  | 9/20 [00:03<00:04, 2.5it/s]``
_BAR = re.compile(r"\s{0,8}\d{1,3}%\|[^|\n]{0,200}\|\s{0,4}\d{1,12}/\d{1,12}\s{0,4}\[[^\]\n]{0,100}\]")
_TS = (r"(?:\d{4}[-/]\d\d[-/]\d\d|\d\d/\d\d/\d{4})[ T_-]\d\d:\d\d(?::\d\d(?:[.,:]\d{1,9})?)?"
       r"(?: ?(?:Z|[+-]\d\d:?\d\d|UTC))?")
_LEVEL = r"(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL|FATAL|NOTICE|TRACE)"
# One prefix at the start of a line; each alternative is bounded, so no backtracking blow-up.
_PREFIX = re.compile(
    r"(?:[ \t]{0,8}\[rank[:=]? ?(?P<r2>\d{1,6})\]:? ?"  # [rank3]: (torch), [rank 3] (picotron), [rank: 0]
    #                                 (Lightning), [rank=0] (Determined's, after its container's id or an
    #                                 empty ``[] ``); indented where a page's code block holds the log
    r"|\[\] (?=\[rank=)"  # (an empty ``[] `` elsewhere is a message's: elastic's role ``[] Starting``)
    r"|\[(?P<role>[A-Za-z_]{1,32})(?P<r1>\d{1,6})\]: ?"         # torchrun --tee [default3]:
    r"|\[[A-Za-z_][\w-]{0,31}\|(?P<r6>\d{1,6})\]: ?"           # TorchX [trainer0|3]:
    r"|\[(?:\d{1,6},(?:mpirank:)?)?(?P<r3>\d{1,6})(?:,[\w.-]{1,80})?\]<std(?:out|err)>: ?"  # Open MPI,
    #                                 horovodrun's [1]<stderr>: (its rank), after its ctime stamp below
    r"|\s{0,6}(?P<r4>\d{1,6}): "                               # srun --label
    r"|(?:std(?:out|err)|STD(?:OUT|ERR))(?::|\s?\|) "           # a harness's stream name
    r"|\[pod/(?P<pod>[\w.-]{1,120})/[\w.-]{1,80}\] "           # kubectl logs --prefix
    r"|\s{0,8}(?![A-Za-z][A-Za-z0-9.-]{0,100}_[\w.-]{0,100}: )"  # (no ``_`` before pdsh's ": ": a metric's)
    r"(?P<host>localhost(?=: )|[A-Za-z](?=[\w.-]{0,80}\d)[\w.-]{0,100}"  # pdsh, NCCL: a host name with a
    r"|\d{1,3}(?:\.\d{1,3}){3}|\d{7,20}|(?!\d\d:\d\d:\d\d)\d{1,6}(?=:\d)"  # digit, IPv4, digits,
    r"|\[?[0-9a-fA-F]{0,4}(?::[0-9a-fA-F]{0,4}){2,7}\]?)"         # IPv6; then :pid:tid or ": "
    r"(?::\d{1,9}:\d{1,9} |: )"
    r"|(?>\s{0,4}[\[(]?" + _TS + r"[\])]?)(?!\s{0,4}iteration\s{1,40}\d)(?: [-|] |: | |:)?"  # a time stamp
    r"|(?>\[?(?:\d\d-\d\d )?\d\d:\d\d:\d\d(?:[.,]\d{1,9})?\]?) "   # a time of day (vLLM's: 04-07 00:57:46)
    r"|\[(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) {1,2}\d{1,2},? \d\d:\d\d:\d\d\] "  # ColBERT's
    r"|(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) {1,2}\d{1,2} \d\d:\d\d:\d\d "  # syslog's, CI's
    r"|(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) {1,2}\d{1,2}"
    r" \d\d:\d\d:\d\d \d{4} ?(?=\[\d)"                             # horovodrun's: Fri Sep 25 16:52:57 2020[1]
    r"|[IWEF](?:\d{8}|\d{4}) \d\d:\d\d:\d\d(?:\.\d{1,9})? {1,8}\d{1,9} (?:[\w.-]{1,80} )?"  # glog, absl;
    r"(?P<lg5>[\w./-]{1,160}):\d{1,7}\] "  # DINOv2's (I20250104 12:12:42 90 dinov2 helpers.py:102] )
    r"|[A-Za-z](?=[\w.-]{0,60}\d)[\w.-]{0,60} >> "                    # a log collector's node: master-0 >>
    r"|\[resource\.labels\.\w{1,40}: [\w.-]{1,80}\] "                 # Cloud Logging's task (Vertex AI)
    r"|`(?=[^`\s])"                                                   # a Markdown inline code's backtick
    r"|>(?: |$)"                                                      # a Markdown or e-mail quote's marker
    r"|\[" + _LEVEL + r"\|[^\]\n]{0,300}\]: "                       # nanotron [INFO|DP=0|PP=0|TP=0]:
    r"|\[" + _LEVEL + r"\] " + _TS + r" (?P<lg1>[\w.]{1,60}): "        # [INFO] 2021-09-13 22:18:26,678 api:
    r"|(?P<lg2>[\w.]{1,60}) " + _LEVEL + r" (?=[\[(]\d{4}-)"          # submitit WARNING (2021-03-15 ...) -
    r"|\s{0,4}" + _LEVEL + r"\s{0,8}\| (?:(?P<lg8>[\w.<>]{1,80}(?::[\w.<>]{1,60}){0,2})(?:\s{0,8}\| | - ))?"
    #                                 fairseq's INFO | fairseq.trainer | , loguru's INFO  | __main__:main:12 -
    r"|\[(?P<lg9>[\w.<>-]{1,80})\]\[" + _LEVEL + r"\](?: - |: | )"   # hydra's [fairseq_cli.train][INFO] -
    r"|(?P<lg10>[\w.<>]{1,80})\s{1,20}: " + _LEVEL + r"\s{1,8}"       # __main__    : INFO
    r"|\[?(?P<lg11>[\w-]{1,80}\.py):\s?\d{1,7}(?:\] |: )"          # [trainer.py:757] , log_hooks.py: 277:
    r"|\s{0,4}\[?" + _LEVEL + r"\]?(?::(?P<lg3>[\w.]{1,120}):| [-|] |: | )"  # [INFO] , INFO: , ERROR:root:
    r"|(?:- )?(?P<lg4>[\w.]{1,120}) - " + _LEVEL + r" - "          # Python logging: - root - INFO -
    r"|\[(?P<lg6>[\w.-]{1,40}) [IWEDC] [^\]\n]{0,160}\] "              # [NeMo I 2024-01-01 ... file:12]
    r"|\[(?P<lg7>[A-Za-z][\w.-]{0,39})\] (?=[\[(]?\d{4}[-/]\d\d[-/])"    # a logger's name: [titan] 2025-...
    r"|\[[DIWEC]\]\[[\w/.-]{1,80}:\d{1,7}(?::[\w.<>]{1,60})?\] "       # ezpz: [I][ezpz/dist:772:init]
    r"|\s{0,8}\[[\w.]{1,80}:\d{1,7}, rank=(?P<r5>\d{1,6})\] "          # OLMo: [olmo.train:816, rank=0]
    r"|[0-9a-f]{8} (?:\[rank=(?P<r7>\d{1,6})\] )?\|\| ?"          # Determined: 63e6f494 [rank=0] ||
    r"|(?P<xla>\d{1,3}(?:\.\d{1,3}){3}) \[(?P<r8>\d{1,6})\] "          # torch_xla's xla_dist: 10.164.0.29 [3]
    r"|rank: {1,3}(?P<r9>\d{1,6}) \| "                                  # ParlAI's: rank:  3 | 2022-04-03 ...
    r"|[A-Za-z_][\w.-]{0,60}/\d{1,6} (?=\[[A-Za-z_]{1,32}\d{1,6}\]:)"  # a job runner's task/replica before
    #                                       torchrun's tee (NeMo-Run's i.pretrain/0 [default1]:)
    r"|(?:[A-Za-z_][\w-]{0,31}/\d{1,6} )?\((?:[\w.-]{1,80}(?:\[rank=\d{1,7}\]|\([\w.-]{1,80}\))? )?"
    r"(?:(?P<sky>[\w.-]{1,80}), rank=\d{1,6}, )?"  # (NeMo RL's Worker[rank=97] pid=.., ROLL's
    #                                       ActorWorker(actor_train-1) pid=..)
    r"pid=(?P<rpid>\d{1,9})"  # Ray: (CommandActor pid=494406), SkyPilot: (head, rank=0, pid=3808) (a node's
    #                                       rank); without an ip, the process is the source (vLLM's workers)
    r"(?:, ip=(?P<ray>[\w.:-]{1,80}))?\)(?: |$)"                    # (RayTrainWorker pid=1, ip=10.0.0.2)
    r")"
)
_LOGGERS = ("lg1", "lg2", "lg3", "lg4", "lg6", "lg7", "lg8", "lg9", "lg10", "lg11")
# A TorchX prefix inside a line: a progress bar's redraw ended without a newline, and the next
# message's prefix was glued to it (``...| 26/101 [06:45<17:27, 13.96s/it][trainer0|0]:``).
_GLUED = re.compile(r"\[[A-Za-z_][\w-]{0,31}\|\d{1,6}\]:")
# Megatron's and DeepSpeed's ``[Rank N] `` right after another message's last character: two ranks
# wrote into one pipe at once (``... max reserved: 56362.0[Rank 34] (after 1 iterations) memory ...``)
_GLUED_RANK = re.compile(r"(?<=[\w.)\]])\[Rank \d{1,6}\] ")
# torch's ``[rank13]:`` right after another message's last character: a C++ frame cut by the next
# process's watchdog line (``frame #2: ... (0x7f2d in /usr/local/lib/p[rank13]:[E216 ...] [Rank 3]
# Watchdog caught ...``)
_GLUED_TORCH = re.compile(r"(?<=\S)\[rank\d{1,6}\]:")
_MAX_GLUED = 256  # messages split out of one line
# Open MPI's --tag-output tag; ``mpirun`` tags each piece a process wrote, so a row printed by
# several writes comes back as one line with the tag repeated inside it (nccl-tests:
# ``[1,0]<stdout>:   8   2   float   sum   -1[1,0]<stdout>:    85.70    0.00 ...``): the tag of the
# line's own process inside it is dropped (the pieces are one line); another process's starts a
# message of its own (split_glued).
_MPI_TAG = re.compile(r"\[\d{1,6},(?:mpirank:)?\d{1,6}(?:,[\w.-]{1,80})?\]<std(?:out|err)>:")
# The torchrun role is a word like "default" or "trainer"; these words are not launcher roles.
_NOT_ROLES = frozenset({"Rank", "E", "W", "I"})


@dataclass(frozen=True, slots=True)
class Line:
    """One cleaned line: its 1-based number in the file, the rank a prefix named, the text."""

    lineno: int
    rank: int | None
    text: str
    host: str | None = None
    width: int = 0  # the printed line's length, prefixes included (a hard wrap cuts at a width)
    logger: str | None = None  # the loggers logging prefixes named (torch.distributed.elastic.agent...)
    earlier: tuple[Line, ...] = ()  # messages a carriage return's redraw overwrote (clean_line)
    global_rank: bool = False  # the rank is torch's ``[rankN]:`` prefix's (the process's global rank)


def strip_prefixes(text: str) -> tuple[str, int | None, str | None]:
    """Remove launcher, logger and time-stamp prefixes; return (text, rank or None, host or None)."""
    return _strip(text)[:3]


def _strip(text: str) -> tuple[str, int | None, str | None, str | None, bool]:
    """strip_prefixes, the logger names logging prefixes gave (outermost first, blank-separated), and
    whether the rank is torch's ``[rankN]:`` (global)."""
    rank: int | None = None
    glob = False
    host: str | None = None
    logger: str | None = None
    for _ in range(16):  # prefixes nest several deep (srun label, tee, host:pid:tid, time stamp, level)
        m = _PREFIX.match(text)
        if m is None or m.end() == 0:
            break
        if m.group("role") in _NOT_ROLES:
            break
        for g in ("r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9"):
            if m.group(g) is not None:
                rank, glob, host = int(m.group(g)), g == "r2", m.group("xla") or host
                break
        else:
            host = m.group("host") or m.group("pod") or m.group("ray") or m.group("sky") \
                or (m.group("rpid") and "pid " + m.group("rpid")) or host
            name = next((m.group(g) for g in _LOGGERS if m.group(g)), None)
            if m.group("lg5"):  # a glog path: torch/distributed/elastic/agent/server/api.py
                name = m.group("lg5").removesuffix(".py").replace("/", ".")
            if name:
                logger = f"{logger} {name}" if logger else name
        text = text[m.end():]
    return text, rank, host, logger, glob


def split_glued(line: Line) -> tuple[Line, ...]:
    """A line holding another message behind a glued prefix (TorchX's, Open MPI's, Megatron's ``[Rank
    N]``, torch's ``[rankN]:``) -> the two messages (the second with the rank its prefix names); any
    other line -> itself."""
    if line.earlier:  # the messages a terminal showed before this one, in turn
        return (*(p for e in line.earlier for p in split_glued(e)),
                *split_glued(Line(line.lineno, line.rank, line.text, line.host, line.width, line.logger,
                                  global_rank=line.global_rank)))
    out: list[Line] = []
    while len(out) < _MAX_GLUED:  # (a line of glued prefixes and nothing else is no log's: bounded)
        text = line.text
        m = _GLUED.search(text, 1) if "]:" in text and "|" in text else None
        if m is None and "]<std" in text:
            m = _MPI_TAG.search(text, 1)
        if m is None and "[Rank " in text:
            m = _GLUED_RANK.search(text, 1)
        if m is None and "[rank" in text:
            m = _GLUED_TORCH.search(text, 1)
        if m is None:
            break
        rest, rank, host, _, glob = _strip(text[m.start():])
        out.append(Line(line.lineno, line.rank, text[:m.start()], line.host, line.width))
        line = Line(line.lineno, rank, rest, host or line.host, line.width, global_rank=glob)
    return (*out, line)


def _unbar(m: re.Match) -> str:
    if "global_step=" in m.group(0):  # a Lightning bar whose postfix is the record (loops.py)
        return m.group(0)
    # a prefix before the bar ("host: ", "3: ", "host:pid:tid ") keeps the space that ends it
    return " " if m.start() else ""


def clean_text(raw: str) -> str:
    """Drop ANSI escapes, keep what a terminal would show after carriage returns, unescape HTML."""
    parts = _terminal_parts(raw)
    return parts[-1]


def _terminal_parts(raw: str) -> list[str]:
    """What a terminal showed of a raw line, in turn: the last part a carriage return left, and
    before it every part a redraw overwrote that holds a message (not a progress bar's redraw)."""
    if "#0" in raw:  # control characters a logging agent wrote as octal text (rsyslog: #015 is \r)
        raw = _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), raw)
    if "\x1b" in raw:
        raw = _ANSI.sub("", raw)
    raw = raw.rstrip("\r\n")
    if "\r" not in raw:
        return [_clean_part(raw)]
    # A progress bar rewrites the line with \r; the terminal shows each part in turn, the last
    # non-empty one at the end. A record printed before a redraw (a Trainer's dict, then the bar
    # again) was shown too: every earlier part that holds a message beside its bars is kept.
    parts = [p for p in raw.split("\r") if p.strip()]
    if not parts:
        return [""]
    kept = [t for t in (_clean_part(p) for p in parts[:-1]) if t.strip()]
    return [*kept, _clean_part(parts[-1])]


def _clean_part(raw: str) -> str:
    raw = _unescape(raw)
    if "%|" in raw:
        raw = _BAR.sub(_unbar, raw)  # a message printed onto a progress bar keeps only the message
    return raw


def _unescape(raw: str) -> str:
    if "&" in raw and ";" in raw:
        raw = html.unescape(raw)  # logs copied out of web pages / notebooks (&quot; &#39; &gt;)
    if "[" in raw and "m" in raw:
        raw = _ANSI_TEXT.sub("", raw)  # colour codes copied as text
    return raw


def _join_pieces(text: str) -> str:
    """A line whose Open MPI tag recurs inside it -> one line: each tag after its first copy is
    dropped (the same process's next piece; an outer wrapper's own tag may stand before it)."""
    seen: set[str] = set()
    out, end = [], 0
    for m in _MPI_TAG.finditer(text):
        if m.group(0) in seen:
            out.append(text[end:m.start()])
            end = m.end()
        seen.add(m.group(0))
    return "".join(out) + text[end:]


def clean_line(raw: str | bytes, lineno: int = 0) -> Line:
    """One raw line (str or bytes, any encoding damage) -> a :class:`Line`."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    parts = _terminal_parts(raw)
    lines = [line for line in (_line(p, lineno) for p in parts) if line.text.strip()]
    if len(parts) == 1 or len(lines) <= 1:
        return lines[0] if lines else _line(parts[-1], lineno)
    last = lines[-1]
    return Line(last.lineno, last.rank, last.text, last.host, last.width, last.logger, tuple(lines[:-1]),
                last.global_rank)


def _line(text: str, lineno: int) -> Line:
    if "]<std" in text and text.count("]<std") > 1:
        text = _join_pieces(text)
    width = len(text)
    text, rank, host, logger, glob = _strip(text)
    if "\x1b" in text:  # colour codes can sit after a prefix too
        text = _ANSI.sub("", text)
    return Line(lineno, rank, text, host, width, logger, global_rank=glob)


# A log line longer than this is cut (with a note): memory stays bounded on a line of
# hundreds of MB without a newline.
MAX_LINE_BYTES = 1 << 20
CUT_NOTE = b" [labkit: line cut at %d bytes of %d]\n"


def iter_file(path: str | Path) -> Iterator[bytes]:
    """The raw lines of a file, streamed in binary (invalid UTF-8 never raises; decoded per
    line); a line over MAX_LINE_BYTES is cut there, with a note saying how long it was."""
    with open(path, "rb") as f:
        while line := f.readline(MAX_LINE_BYTES):
            if len(line) < MAX_LINE_BYTES or line.endswith(b"\n"):
                yield line
                continue
            total = len(line)
            while rest := f.readline(MAX_LINE_BYTES):  # skip to the end of the long line
                total += len(rest)
                if rest.endswith(b"\n"):
                    break
            yield line + CUT_NOTE % (MAX_LINE_BYTES, total)


def iter_lines(source: str | Path | Iterable[str] | Iterable[bytes]) -> Iterator[Line]:
    """Every line of ``source`` cleaned (see module docstring): a str or Path is a file to read,
    anything else an iterable of lines."""
    raw = iter_file(source) if isinstance(source, (str, Path)) else source
    for lineno, line in enumerate(raw, 1):
        yield clean_line(line, lineno)
