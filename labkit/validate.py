"""One door for every input labkit reads: config JSON, site YAML, environment values, job records.

Each reader here turns whatever a careless or hostile file holds into a value or a
``ConfigError`` that names the field and the fix, never another exception, and never works
long on it: files are read up to a size limit, JSON refuses duplicate keys, ``NaN``/``Infinity``
and integers too long to be a setting, YAML refuses anchors and aliases (the "billion laughs"
bomb), deep nesting is refused, and text that reaches a shell script or a ``#SBATCH`` line
may hold no newline or other control character.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from labkit.errors import ConfigError

# Inputs are small: a config is a few kB, a site profile a few dozen lines.
MAX_INPUT_BYTES = 1_000_000
MAX_DEPTH = 64
MAX_INT_DIGITS = 30
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029\x85]")


def text_problem(field: str, value: Any, *, allow_empty: bool = False) -> str | None:
    """Why ``value`` cannot be a text setting (a string without control characters), or None."""
    if not isinstance(value, str):
        return f"{field}={value!r} must be a string"
    if not value and not allow_empty:
        return f"{field} is empty; give a value or leave the field out"
    m = _CONTROL.search(value)
    if m:
        return (f"{field}={value!r} holds a control character ({m.group()!r} at position "
                f"{m.start()}); a setting is one line of text, and a newline in a job script "
                f"would start a new command")
    return None


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")


def script_text_problems(layout: Any, megatron_flags: Any) -> list[str]:
    """Why a job's header line or its Megatron-LM flags cannot reach a job script: the layout
    and every flag word is one line of text, a group name is a plain word (it becomes a bash
    array's name, ``<GROUP>_ARGS``)."""
    out = [w for w in [text_problem("layout", layout, allow_empty=True)] if w]
    try:
        groups = [(g, [list(it) for it in items]) for g, items in megatron_flags]
    except (TypeError, ValueError):
        return out + [f"megatron_flags={megatron_flags!r:.80} must be ((group, ((flag, value), "
                      f"...)), ...) as labkit.megatron_args.flag_groups makes it"]
    for g, items in groups:
        if not isinstance(g, str) or not _WORD.fullmatch(g):
            out.append(f"megatron_flags group {g!r:.80} must be a plain word (letters, digits, "
                       f"'_'): it names a bash array in the job script")
        out += [w for it in items for x in it
                if (w := text_problem(f"megatron_flags[{g!r:.40}] word", x, allow_empty=True))]
    return out


class NotAFileError(OSError):
    """What ``read_small_file`` found is not a regular file, or is larger than its limit."""


def read_small_file(path: str | Path, limit: int = MAX_INPUT_BYTES, *,
                    follow: bool = True) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes: the one door for a file that
    someone else may have written (a job record, a run's log or metrics, a config).

    The file is opened without blocking (a FIFO never hangs the reader), checked on the open
    descriptor to be a regular file (not a FIFO, a device such as /dev/zero, a directory), and
    read to ``limit + 1`` bytes at most, whatever its size said. ``follow=False`` also refuses
    a symbolic link as the last part of the path (``O_NOFOLLOW``). Raises OSError
    (NotAFileError for a file of the wrong kind or size, naming it).
    """
    fd = _open_regular(path, follow)
    try:
        chunks, n = [], 0
        while n <= limit:
            b = os.read(fd, min(1 << 20, limit + 1 - n))
            if not b:
                break
            chunks.append(b)
            n += len(b)
    finally:
        os.close(fd)
    if n > limit:
        raise NotAFileError(errno.EFBIG, f"more than {limit:,} bytes", str(path))
    return b"".join(chunks)


def _open_regular(path: str | Path, follow: bool) -> int:
    """A read-only descriptor of a regular file, opened without blocking (a FIFO never hangs)
    and checked on the descriptor itself; NotAFileError for anything else."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if not follow and e.errno == errno.ELOOP:
            raise NotAFileError(errno.ELOOP, "a symbolic link, not a file", str(path)) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise NotAFileError(errno.EINVAL, kind, str(path))
    return fd


def read_file_tail(path: str | Path, nbytes: int, *, follow: bool = False) -> bytes:
    """The last ``nbytes`` bytes (at most) of a regular file, by the same door as
    ``read_small_file``: for the end of a log someone else may have replaced."""
    fd = _open_regular(path, follow)
    try:
        end = os.lseek(fd, 0, os.SEEK_END)
        os.lseek(fd, max(0, end - nbytes), os.SEEK_SET)
        chunks, n = [], 0
        while n < nbytes and (b := os.read(fd, min(1 << 20, nbytes - n))):
            chunks.append(b)
            n += len(b)
    finally:
        os.close(fd)
    return b"".join(chunks)


def regular_file(path: str | Path, *, follow: bool = False) -> bool:
    """True when ``path`` opens as a regular file (not a FIFO, a device, a folder or, unless
    ``follow``, a symbolic link)."""
    try:
        os.close(_open_regular(path, follow))
    except OSError:
        return False
    return True


def read_input(path: str | Path, what: str) -> str:
    """The UTF-8 text of a small regular file (a config or a site profile)."""
    p = Path(path)
    if len(str(p)) > 4096:
        raise ConfigError(f"{what} path {str(p)[:60]!r}... is {len(str(p)):,} characters long; "
                          f"pass the path of a file")
    try:
        raw = read_small_file(p)
    except NotAFileError as e:
        if e.errno == errno.EFBIG:
            raise ConfigError(f"{what} {p} is {e.strerror}; a {what} is a few kB (limit "
                              f"{MAX_INPUT_BYTES:,}): is it the right file?") from None
        raise ConfigError(f"{what} {p} is {e.strerror}; pass the path of a file") from None
    except OSError as e:
        raise ConfigError(f"cannot read {what} {p}: {e.strerror}") from None
    return decode(raw, f"{what} {p}")


def read_json(path: str | Path, what: str) -> Any:
    """The strict JSON of a small regular file (``read_input``, ``loads_json``)."""
    return loads_json(read_input(path, what), f"{what} {path}")


def decode(raw: bytes, what: str) -> str:
    """UTF-8 text (a UTF-8 byte-order mark is allowed), or a ConfigError saying where it is not."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        hint = " (it looks like UTF-16)" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise ConfigError(f"{what} is not UTF-8 text{hint}: byte {raw[e.start]:#04x} at offset "
                          f"{e.start}; save it as UTF-8") from None


class _Bad:
    """A JSON value labkit refuses, kept until its key is known (for the message)."""

    def __init__(self, why: str):
        self.why = why


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ConfigError(f"key {k!r} appears twice; keep one (JSON readers disagree on "
                              f"which one wins)")
        out[k] = v
    return out


def _constant(name: str) -> _Bad:
    return _Bad(f"{name} is not a number JSON allows; use a finite number")


def _int(text: str) -> int | _Bad:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        return _Bad(f"an integer of {digits} digits is not a setting; use a realistic value")
    return int(text)


def _float(text: str) -> float | _Bad:
    v = float(text)
    return v if math.isfinite(v) else _Bad(f"{text} is too large for a number; use a finite one")


def loads_json(text: str, what: str) -> Any:
    """Strict JSON: no duplicate keys, no NaN/Infinity, no huge integers, bounded nesting."""
    if len(text) > MAX_INPUT_BYTES:
        raise ConfigError(f"{what} is {len(text):,} characters; the limit is {MAX_INPUT_BYTES:,}")
    if _depth(text) > MAX_DEPTH:
        raise ConfigError(f"{what} nests deeper than {MAX_DEPTH} levels; a setting is flat")
    try:
        data = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant,
                          parse_int=_int, parse_float=_float)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{what} is not valid JSON ({e.msg} at line {e.lineno}, column "
                          f"{e.colno})") from None
    except ConfigError as e:
        raise ConfigError(f"{what}: {e.violations[0]}") from None
    except (RecursionError, ValueError) as e:
        raise ConfigError(f"{what} cannot be read as JSON ({type(e).__name__}: {e})") from None
    _find_bad(data, what)
    return data


def _depth(text: str) -> int:
    """Nesting depth of brackets, counted without recursion (strings are skipped)."""
    depth = best = 0
    in_str = esc = False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth -= 1
    return best


def _find_bad(data: Any, what: str) -> None:
    todo: list[tuple[str, Any]] = [("", data)]
    while todo:
        path, v = todo.pop()
        if isinstance(v, _Bad):
            raise ConfigError(f"{what}: {path or 'the document'}: {v.why}")
        if isinstance(v, dict):
            todo.extend((f"{path}.{k}" if path else k, x) for k, x in v.items())
        elif isinstance(v, list):
            todo.extend((f"{path}[{i}]", x) for i, x in enumerate(v))


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader without anchors and aliases (a few lines can expand to billions)."""

    def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: ANN401 - PyYAML's API
        if self.check_event(yaml.AliasEvent):
            ev = self.peek_event()
            raise ConfigError(f"YAML alias *{ev.anchor} at line {ev.start_mark.line + 1}: "
                              f"anchors and aliases are not allowed in a site profile; write "
                              f"the value out")
        if self.check_event(yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent):
            ev = self.peek_event()
            if ev.anchor is not None:
                raise ConfigError(f"YAML anchor &{ev.anchor} at line {ev.start_mark.line + 1}: "
                                  f"anchors and aliases are not allowed in a site profile; "
                                  f"write the value out")
        return super().compose_node(parent, index)


def loads_yaml(text: str, what: str) -> Any:
    """Safe YAML without aliases or deep nesting; ConfigError for anything else."""
    if len(text) > MAX_INPUT_BYTES:
        raise ConfigError(f"{what} is {len(text):,} characters; the limit is {MAX_INPUT_BYTES:,}")
    if _depth(text.replace('"', "")) > MAX_DEPTH:
        raise ConfigError(f"{what} nests deeper than {MAX_DEPTH} levels")
    try:
        return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a safe loader
    except yaml.YAMLError as e:
        raise ConfigError(f"{what} is not valid YAML: {e}") from None
    except ConfigError as e:
        raise ConfigError(f"{what}: {e.violations[0]}") from None
    except (RecursionError, ValueError, TypeError, OverflowError) as e:
        raise ConfigError(f"{what} cannot be read as YAML ({type(e).__name__}: {e})") from None


def env_path(var: str) -> Path | None:
    """A path from the environment (``~`` expanded, as a shell would): None when unset;
    ConfigError when empty or not one line."""
    value = os.environ.get(var)
    if value is None:
        return None
    if not value.strip():
        raise ConfigError(f"${var} is set but empty; unset it for the default, or set it to a "
                          f"folder (an empty value would put files in the current directory)")
    why = text_problem(f"${var}", value)
    if why:
        raise ConfigError(f"{why}; fix or unset ${var}")
    try:
        return Path(value).expanduser()
    except RuntimeError:  # ~someone who does not exist
        raise ConfigError(f"${var}={value!r}: {value.split('/')[0]} names no user here; give "
                          f"the folder's full path") from None
