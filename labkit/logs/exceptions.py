"""Exceptions a log reports: Python tracebacks (per source, and one the log cuts before its last
line), and failures recorded as data, torch elastic's JSON error records.

A traceback ends at its first line that is not indented (the exception's own, ``Name: text``),
per source (rank and host from the line's prefixes: ranks interleave). One still open where the
log ends was cut before that line (an excerpt, a killed writer, a full disk): an exception was
raised, whose name the log does not show; its last frame is told instead.

torch.distributed.elastic writes an uncaught exception as a JSON record: into the worker's
``error.json`` (``{"message": {"message": "RuntimeError: ...", "extraInfo": {"py_callstack":
"Traceback ...", "timestamp": "..."}}}``), and into the log, through its ``error_handler`` logger,
indented (torch 1.9)::

    [ERROR] 2021-09-13 22:18:26,678 error_handler: {
      "message": {
        "message": "RendezvousConnectionError: The connection to the C10d store has failed. ...",
        "extraInfo": {
          "py_callstack": "Traceback (most recent call last):\\n  File ...",
          "timestamp": "1631571506"

or after ``child error file (...) contents:``; a newer record's ``"message"`` may be a string. The
record is read as JSON, not by its wording: its innermost string ``"message"`` is the exception
(``Name: text``), else the last line of its ``"py_callstack"``. A JSON string never spans lines, so
an indented record is read member by member and a record cut off (a page's excerpt, a killed
process) still gives what it printed; a record on one line is decoded whole.
"""

from __future__ import annotations

import json
import re

from labkit.logs.lines import Line

_MEMBER = re.compile(r'^\s{0,40}"(\w{1,40})"\s{0,4}:\s{0,4}(.{0,100000})$')
_CUT_MEMBER = re.compile(r'"(message|py_callstack)"\s{0,4}:\s{0,4}"')
_STRING = re.compile(r'"(?:[^"\\]|\\.){0,100000}"')
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]{0,200}(?:Error|Exception|Interrupt|Exit|Failure|Warning)\b")
_DECODER = json.JSONDecoder()
_MAX_LINES = 400  # a record this long is no error record (a config dump): closed
# A traceback the log cut before its header (an excerpt, interleaved writers) is still one: its
# frames (``  File "x.py", line 3, in f``: faulthandler's dumps print no comma before ``in``) open
# it, and the exception line after them ends it. An exception line with its module
# (``torch.distributed.DistBackendError: NCCL error in: ...``: Python names a class by its module
# where it is no builtin) is an uncaught exception's last line even where no frame is shown
# (TensorFlow's ``errors_impl.UnknownError:  ncclCommInitRank failed``: two blanks; Ray's wrapper
# ``ray.exceptions.RayTaskError(RuntimeError): ...``; indented as a page's code block). A tail with no
# frame line the log kept (posted from its middle, a frame's ``File`` at the margin, frames that hold
# no trigger word: only the code line before the exception reaches the scanner) is one too: an
# exception line (``RuntimeError: NCCL error in: ...``, a name of _EXCEPTION's form, not a warning)
# right after a frame's line of the same source (its code, indented 4, or ``File``; not C++'s
# ``  what():  ...``) ends a traceback whose header the log cut.
_FRAME = re.compile(r'^\s{1,8}File "[^"]{1,500}", line \d{1,7}, in ')
_MARGIN_FRAME = re.compile(r'^File "[^"]{1,500}", line \d{1,7}\b')
# A frame hard-wrapped by the terminal or the page (``  File "x.py", line 11`` then ``9, in f``): its
# next line is its rest, whatever it starts with.
_FRAME_CUT = re.compile(r'^\s{1,8}File "[^"]{1,500}", line \d{1,7}(?:, ?i?n?)?\s{0,200}$')
_QUALIFIED = re.compile(r"^ {0,4}[a-z_]\w{0,40}(?:\.\w{1,60}){1,8}\.[A-Z]\w{0,60}(?:Error|Exception)"
                        r"(?:\([A-Za-z_][\w.]{0,200}\))?:\s{1,4}\S")
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]{0,200})(\([A-Za-z_][\w.]{0,200}\))?(?::\s?(.{0,2000}))?$")
# An exception that wraps another's raised elsewhere names it in parentheses, and the frames and the
# exception line of where it was raised follow (Ray's ``ray.exceptions.RayTaskError(ImportError):
# ray::Actor.method() (pid=..)`` then the task's ``File`` lines and ``ImportError: ...``): the
# traceback goes on to the wrapped exception's line.


def _exception_of(key: str, value: str) -> str | None:
    """What a record's member says failed: its ``message``, or its call stack's last line."""
    value = value.strip()
    if key == "py_callstack":
        last = [ln.strip() for ln in value.splitlines() if ln.strip()]
        value = last[-1] if last else ""
    elif key != "message":
        return None
    return value if _EXCEPTION.match(value) else None


def _walk(obj: object, found: dict[str, str]) -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, str):
                msg = _exception_of(k, v)
                if msg is not None:
                    found.setdefault(k, msg)
            else:
                _walk(v, found)


class ErrorRecords:
    """Feed cleaned lines in order; ``feed`` returns the exception a record states, once per record
    (``start``: the line the record began on)."""

    def __init__(self) -> None:
        self.start = 0
        self.depth = 0  # braces open in the current record (0: none open)
        self.lines = 0
        self.said = False  # the open record already gave its exception

    @property
    def busy(self) -> bool:
        return self.depth > 0

    def feed(self, text: str, lineno: int = 0) -> str | None:
        if self.depth == 0:
            self.start = lineno
            return self._start(text)
        self.lines += 1
        stripped = text.strip()
        m = _MEMBER.match(text)
        if m is None and stripped[:1] not in ("}", "]", "{", '"') or self.lines > _MAX_LINES:
            self.depth = 0  # the record was cut off: an ordinary line follows
            return None
        self.depth += _braces(stripped)
        if m is None or self.said or not m.group(2).startswith('"'):
            return None
        try:
            value, _ = _DECODER.raw_decode(m.group(2))
        except ValueError:
            return None
        msg = _exception_of(m.group(1), value) if isinstance(value, str) else None
        self.said = msg is not None
        return msg

    def _start(self, text: str) -> str | None:
        stripped = text.rstrip()
        if not stripped.endswith("{") and '{"message"' not in stripped:
            return None
        at = stripped.find("{")
        head = stripped[:at].strip()
        if head and not head.endswith(":"):  # a line of code or prose, not a logged record
            return None
        if stripped.endswith("{") and at == len(stripped) - 1:
            self.depth, self.lines, self.said = 1, 0, False  # an indented record opens
            return None
        found: dict[str, str] = {}
        try:
            obj, _ = _DECODER.raw_decode(stripped[at:])
        except ValueError:  # a record cut off on its line: the members it printed
            for m in _CUT_MEMBER.finditer(stripped, at):
                try:
                    value, _ = _DECODER.raw_decode(stripped, m.end() - 1)
                except ValueError:
                    break
                obj = {m.group(1): value}
                _walk(obj, found)
        else:
            _walk(obj, found)
        return found.get("message") or found.get("py_callstack")


def _braces(text: str) -> int:
    """Braces opened minus closed on a line of JSON, outside its strings."""
    bare = _STRING.sub("", text)
    return bare.count("{") - bare.count("}")


# Processes that write through one pipe with no prefix glue their tracebacks: a second header while
# one is open, lines cut at any place (a frame's code line at the margin, its indentation on the
# line before). Until GLUED_LINES lines after the last header, such a traceback ends only at an
# exception's own line (``FileNotFoundError: [Errno 2] ...``): a name of _EXCEPTION's form then a
# colon; a bare name or a fragment of code at the margin is a piece of the glued frames.
GLUED_LINES = 400


def _tail_end(text: str, code: str) -> bool:
    """An exception's own line (``Name: text``, not a warning's) ending a headless traceback's tail;
    a bare name too where the code line before raised it (``    raise EOFError`` then ``EOFError``)."""
    m = _EXC_LINE.match(text)
    if m is None or _EXCEPTION.match(text) is None or m.group(1).endswith("Warning"):
        return False
    return m.group(3) is not None or _RAISE.match(code) is not None and (
        _RAISE.match(code).group(1).rsplit(".", 1)[-1] == m.group(1).rsplit(".", 1)[-1])


# A builtin exception's line alone, no traceback above it (pytest's report, a launcher's summary, a
# blank before it: ``RuntimeError: NCCL error in: ...``) is an uncaught exception's last line. Only
# Python's own names: a tool's error class printed alone (conda's ``CondaError: Run 'conda init'
# ...`` from a shell profile, the job going on) is no exception of the run.
_BUILTIN = re.compile(r"^ ?(?:RuntimeError|AssertionError|ValueError|TypeError|KeyError|IndexError|OSError"
                      r"|AttributeError|ImportError|ModuleNotFoundError|FileNotFoundError|MemoryError"
                      r"|NotImplementedError|ZeroDivisionError|RecursionError|PermissionError): \S")
_RAISE = re.compile(r"^\s{1,40}raise\s{1,4}([A-Za-z_][\w.]{0,200})\s{0,4}(?:\(|$)")
# What a process raises when a signal stops it (torch elastic's ``SignalException: Process N got
# signal: 15``, an interrupt, a SIGTERM handler's ``SystemExit: 143``, 128 + the signal): the effect
# of a cancel, a time limit or a preemption, not its cause. An exception that a traceback chains
# after one ("During handling of the above exception, another exception occurred") was raised
# while the process stopped: a second signal that struck its handler (``KeyError: 30`` of
# logging's cache, in a real cancel), a consequence too.
TERMINATED = re.compile(r"SignalException|got signal:? *(?:15|2|SIGTERM|SIGINT)\b|KeyboardInterrupt"
                        r"|SystemExit: 1(?:43|30)\b")
_CHAINED = ("During handling", "The above exception")
# rich's traceback (accelerate, typer, kohya_ss): a box drawn round the frames, ``╭─── Traceback (most
# recent call last) ───╮``, ``│ ❱ 1013 │   raise RuntimeError(...)  │``, ``╰───╯``; the exception's own
# line follows the box
_BOX = "│╰┃┗"
# IPython's traceback (Jupyter, Colab): the exception's name in its header, ``ProcessExitedException
# Traceback (most recent call last)``; its frames at the margin, ``/tmp/ipykernel_11960/40.py in <module>``,
# ``<ipython-input-7-e3d9> in load_model(hparams)``, ``Cell In[27], line 3`` (IPython 8), code lines
# ``----> 3 notebook_launcher(...)``; the exception's own line ends it. IPython 8's frame, ``File
# /usr/lib/python3.8/site-packages/x.py:387, in f(a)``, opens one whose header the log cut
_IPYTHON = re.compile(r"^[A-Za-z_][\w.]{0,200} {2,}Traceback \(most recent call last\)")
_IPYTHON_FRAME = re.compile(r"^File \S{1,500}:\d{1,7}, in [A-Za-z_<]")
# threading's header before a thread's traceback: ``Exception in thread Thread-5:`` (its traceback follows)
_THREAD = re.compile(r"^Exception in thread .{1,200}:\s{0,4}$")


class Tracebacks:
    """Python tracebacks per source: ``feed`` returns the line that ends one (the exception's)."""

    def __init__(self) -> None:
        self.open: dict[tuple, int] = {}  # source -> line where its traceback began
        self.frame: dict[tuple, str] = {}  # source -> its last ``File "...", line N, in f`` line
        self.glued: dict[tuple, int] = {}  # source -> the line its glued tracebacks' last header is on
        self.indented: tuple[tuple, int] | None = None  # (source, line) of the last indented line
        self.code = ""  # the text of that line
        self.link: dict[tuple, int] = {}  # source -> its last chain line ("During handling ...")
        self.stopping: set[tuple] = set()  # sources whose traceback chain holds a stop's exception
        self.after_stop = False  # the exception feed returned was chained after a stop's
        self.margin: dict[tuple, int] = {}  # source -> the line of its last frame at the margin
        self.ipython: set[tuple] = set()  # sources whose open traceback is IPython's
        self.thread: set[tuple] = set()  # sources whose open traceback began at threading's header
        self.headless: set[tuple] = set()  # sources whose open traceback began at a frame (header cut)
        self.fed: dict[tuple, int] = {}  # source -> the last line it was fed
        self.code_fed: dict[tuple, int] = {}  # source -> the last indented line it was fed
        self.ignored: dict[tuple, int] = {}  # source -> its last ``Exception ignored in`` line, then -1
        # while the traceback after it is open: Python printed an exception it ignored (in a finalizer,
        # an atexit callback), which stopped no process
        self.wrapped: dict[tuple, int] = {}  # source -> the line of its last hard-wrapped frame

    @property
    def busy(self) -> bool:
        return bool(self.open)

    def rank_of(self, line: Line) -> int | None:
        """The rank of the traceback an unprefixed line goes on (a logger prefixes a message's first
        line only: ParlAI's ``rank:  3 | ... CRITICAL | Traceback ...``, then its frames bare): a
        frame's line, or the exception's right after one; else None."""
        text = line.text
        if line.rank is not None or not text or not (text[0].isspace() or _EXCEPTION.match(text)):
            return None
        return next((src[0] for src in self.open if src[0] is not None and src[1] == line.host
                     and self.fed.get(src) == line.lineno - 1
                     and (text[0].isspace() or self.code_fed.get(src) == line.lineno - 1)), None)

    def feed(self, line: Line) -> str | None:
        text = line.text
        src = (line.rank, line.host)
        self.fed[src] = line.lineno
        if text[:1].isspace():
            self.code_fed[src] = line.lineno
        self.after_stop = False
        if text.startswith(_CHAINED):
            self.link[src] = line.lineno
        if text.startswith("Exception ignored in"):
            self.ignored[src] = line.lineno
            return None
        if "Traceback (most recent call last)" in text or _THREAD.match(text):
            if self.ignored.get(src) == line.lineno - 1:
                self.ignored[src] = -1
            else:
                self.ignored.pop(src, None)
            if line.lineno - self.link.get(src, -9) > 2:
                self.stopping.discard(src)  # a traceback of its own, not a chain's next link
            after_thread = self.open.get(src) == line.lineno - 1 and src in self.thread
            indented = text[0].isspace() and text.lstrip().startswith("Traceback")
            if (src in self.open and not after_thread) or indented:
                self.glued[src] = line.lineno
            (self.thread.add if _THREAD.match(text) else self.thread.discard)(src)
            self.open[src] = self.open[src] if after_thread else line.lineno
            self.frame.pop(src, None)
            self.headless.discard(src)
            (self.ipython.add if _IPYTHON.match(text) else self.ipython.discard)(src)
            return None
        after_code, self.indented = self.indented == (src, line.lineno - 1), None
        if src not in self.open and text:
            code = self.code
            if text[:3].isspace() and text.strip() or _FRAME.match(text):  # a frame's code line (4
                self.indented, self.code = (src, line.lineno), text  # blanks, a prefix may take 1) or File
            if _FRAME.match(text) or _FRAME_CUT.match(text) or text[0] in _BOX and _FRAME.match(text[1:]):
                # a frame of a traceback whose header the log cut (or a rich box's top: ``│   File ...``):
                # it is open; or its header was printed the line before without the rank's prefix
                bare = (None, line.host)
                own = line.rank is not None and bare not in self.frame \
                    and self.open.get(bare) == line.lineno - 1
                header = self.open.pop(bare) if own else None
                self.open[src] = header or line.lineno
                if not header:
                    self.headless.add(src)
            elif _IPYTHON_FRAME.match(text):
                self.open[src] = line.lineno
                self.headless.add(src)
                self.ipython.add(src)
            elif text[0] in _BOX and "\u2771" in text:  # rich's ``❱`` at a frame's line, its box's top cut:
                self.open[src] = self.glued[src] = line.lineno  # open, ended by an exception's own line
                return None
            elif _QUALIFIED.match(text) or (after_code or line.lineno == 1) and _tail_end(text, code):
                return text.lstrip()  # an exception line whose traceback the log cut (all of it, or all
                # but the code line before it; an excerpt that starts at it: the log's first line)
            elif _BUILTIN.match(text):
                return text.lstrip()
        if src not in self.open or not text or text.startswith(_CHAINED):
            return None
        if _FRAME_CUT.match(text):
            self.wrapped[src] = line.lineno
        elif self.wrapped.get(src) == line.lineno - 1:
            return None  # the rest of a hard-wrapped frame
        if _MARGIN_FRAME.match(text) or (self.margin.get(src) == line.lineno - 1
                                         and _EXC_LINE.match(text) is None):
            if text.startswith("File "):  # a frame at the margin: a log collector stripped the blanks
                self.frame[src], self.margin[src] = text.strip(), line.lineno  # (Cloud Logging's)
            return None  # or that frame's code line
        if text[0].isspace() or text[0] in _BOX:  # a frame's line, or a rich box's (its frames drawn)
            if text.lstrip().startswith("File "):
                self.frame[src] = text.strip()
            elif src in self.frame and " | " not in self.frame[src]:  # the frame's code: its call
                self.frame[src] += " | " + text.strip()
            return None
        m = _EXC_LINE.match(text)
        if m is None and " " not in text.strip() and ":" not in text and any(c.isalnum() for c in text):
            # a console's mark between its lines (a pod's id: ``2855e530…vdumckda``); a table's ``[2]:``
            # or rule (``=====``) ends the traceback
            return None
        if m is None and src in self.ipython:  # IPython's frame or code line, at the margin
            if " in " in text or text.startswith("Cell In"):
                self.frame[src] = text.strip()
            return None
        if m is not None and m.group(2):
            return None  # a wrapper of an exception raised elsewhere: its frames follow
        if src in self.glued:
            if line.lineno - self.glued[src] <= GLUED_LINES and (
                    m is None or m.group(3) is None or not _EXCEPTION.match(text)):
                return None
            del self.glued[src]
        del self.open[src]
        frame = self.frame.pop(src, None) or ""
        self.ipython.discard(src)
        if src in self.headless:  # no header: only an exception's own line ends it as one
            self.headless.discard(src)
            if m is not None and not _tail_end(text, "    " + frame.partition(" | ")[2]):
                return None
        if m is None or self.ignored.pop(src, None) == -1:
            return None
        self.after_stop = src in self.stopping
        if TERMINATED.search(text):
            self.stopping.add(src)
        return text

    def cut(self) -> list[tuple[int | None, int, str | None]]:
        """The tracebacks the log ends inside, as (rank, first line, last frame); none open after."""
        out = [(src[0], start, self.frame.get(src)) for src, start in self.open.items()
               if self.ignored.get(src) != -1]
        self.open.clear()
        self.frame.clear()
        self.glued.clear()
        self.ipython.clear()
        self.thread.clear()
        self.headless.clear()
        self.wrapped.clear()
        self.ignored.clear()
        return out
