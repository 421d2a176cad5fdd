"""The job record: ``RUN_DIR/job.json``, what makes a job labkit's own.

A submitted job is recorded in its run directory so that another process (a restarted notebook
kernel, ``labkit status``, an instructor's ``labkit class`` commands) can find it again, and so
that labkit only ever acts on jobs it submitted itself. The record holds::

    {"job_id": "local-12345" | "4711", "name": RUN_NAME, "run_dir": RUN_DIR,
     "backend": "local" | "slurm" | "hostfile", "submitted_at": UNIX_TIME,
     "info": {...what the backend needs to find the job again: a process group, start time and
              token on this machine; Slurm's SLURM_CONF and job name...}}

It is written whole or not at all (a temporary file renamed over it) and read through
``labkit.validate.read_small_file`` (a regular file of at most 1 MB, never through a symbolic
link, a FIFO or a device: anyone who can write the folder can plant one). Each field is checked;
a record that is there but cannot be read or is malformed raises ``BadRecord``, a folder
without one ``NoRecord`` (both LabkitError), never another exception. The job's directory is
the one the record is in, whatever ``run_dir`` says: a run moved aside keeps its own log and
exit code. Which records the caller may act on is ``labkit.backends.ownership``'s rule.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from labkit.errors import LabkitError
from labkit.rules import NAME_RE
from labkit.validate import read_small_file

JOB_FILE = "job.json"
MAX_RECORD_BYTES = 1_000_000
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")


class RecordError(LabkitError):
    """No job record can be read in a run directory."""


class NoRecord(RecordError):
    """The run directory holds no job record: no labkit job was submitted there."""


class BadRecord(RecordError):
    """A job record is there but cannot be read or is malformed: labkit cannot tell which job
    it was, nor whether that job still runs."""


def write_record(run_dir: Path, fields: dict[str, Any]) -> None:
    """Write ``run_dir/job.json`` whole (a full disk never leaves half a record)."""
    f = Path(run_dir) / JOB_FILE
    tmp = f.with_name(f".{f.name}.tmp")
    try:
        tmp.write_text(json.dumps(fields, indent=2) + "\n")
        os.replace(tmp, f)
    finally:
        tmp.unlink(missing_ok=True)


def read_record(run_dir: str | Path) -> dict[str, Any]:
    """The checked fields of ``run_dir/job.json`` (job_id, name, backend, submitted_at, info);
    NoRecord when there is none, BadRecord when it cannot be read or is malformed."""
    f = Path(run_dir) / JOB_FILE
    try:
        raw = read_small_file(f, MAX_RECORD_BYTES, follow=False)
    except FileNotFoundError:
        raise NoRecord(f"no labkit job recorded in {f} (no such file); labkit only knows the "
                       f"jobs it submitted (labkit status lists them)") from None
    except OSError as e:
        raise BadRecord(f"unreadable labkit job record {f} ({e.strerror or e}); labkit cannot "
                        f"tell which job it was nor whether it still runs, and leaves it "
                        f"alone") from None
    try:
        d = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise BadRecord(f"unreadable labkit job record {f} ({type(e).__name__}: {e}); labkit "
                        f"cannot tell which job it was nor whether it still runs, and leaves "
                        f"it alone") from None
    return record_fields(d, f)


def record_fields(d: Any, f: Path) -> dict[str, Any]:
    """The fields of a job record, checked; BadRecord naming the first bad one."""
    def bad(what: str) -> BadRecord:
        return BadRecord(f"malformed labkit job record {f}: {what}; labkit leaves it alone "
                         f"(move it away, or resubmit the run)")

    if not isinstance(d, dict):
        raise bad(f"a JSON object is expected, not {type(d).__name__}")
    job_id, name, backend = d.get("job_id"), d.get("name"), d.get("backend")
    if isinstance(job_id, int) and not isinstance(job_id, bool):
        job_id = str(job_id)
    if not isinstance(job_id, str) or not _ID_RE.fullmatch(job_id):
        raise bad(f"job_id={job_id!r:.60} is not a job id")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise bad(f"name={name!r:.60} is not a run name")
    if not isinstance(backend, str) or not re.fullmatch(r"[a-z]{1,20}", backend):
        raise bad(f"backend={backend!r:.60} is not a backend")
    when = d.get("submitted_at", 0.0)
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not 0 <= when < 1e11:
        raise bad(f"submitted_at={when!r:.60} is not a time")
    info = d.get("info", {})
    if not isinstance(info, dict):
        raise bad(f"info={info!r:.60} is not a mapping")
    return {"job_id": job_id, "name": name, "backend": backend, "submitted_at": float(when),
            "info": info}


def point_record_at(d: Path) -> None:
    """A moved run's ``job.json`` names its own directory (its log, its exit code)."""
    f = d / JOB_FILE
    try:
        rec = json.loads(read_small_file(f, MAX_RECORD_BYTES, follow=False))
        if isinstance(rec, dict) and rec.get("run_dir") != str(d):
            rec["run_dir"] = str(d)
            write_record(d, rec)
    except (OSError, ValueError, RecursionError):
        pass  # no record, or not ours to repair: a record is read from the directory it is in
