"""The hand-out: each student's own, writable copy of the student notebooks.

``handout(dest)`` copies ``notebooks/NN_*.ipynb`` of the shared checkout (never
``notebooks/solutions/``) into ``dest``, as the user running it.
A notebook the student has not changed since it was handed out is replaced by a newer version;
one they edited is never touched: the newer version goes beside it as
``NN_name.handout-YYYYMMDD.ipynb`` (``-2``, ``-3``... on a second one the same day), once per
version. What was handed out (a hash per file) is recorded in ``dest/.labkit-handout.json``.

``handout_for(users, ...)`` (root) runs the same as each student (a child process with the
student's uid), so nothing is written into a student's home with root's rights. The hub's
server jobs run it at every start.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import time
from dataclasses import dataclass
from pathlib import Path

from labkit.errors import LabkitError
from labkit.paths import NOTEBOOK_DIR

MANIFEST = ".labkit-handout.json"
DEFAULT_DEST = "~/labkit-notebooks"


@dataclass(frozen=True)
class Copied:
    """One file of the hand-out: what happened to it: new, updated (not edited, replaced by
    the newer version), beside (edited; the newer version written beside it), edited (kept,
    nothing newer), same."""

    name: str
    action: str
    path: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "action": self.action, "path": self.path}


def student_notebooks(source: Path = NOTEBOOK_DIR) -> list[Path]:
    """The student notebooks of a checkout: ``NN_*.ipynb`` at the top of ``notebooks/``."""
    return sorted(p for p in Path(source).glob("[0-9][0-9]_*.ipynb") if p.is_file())


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _load_manifest(dest: Path) -> dict[str, str]:
    try:
        data = json.loads((dest / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(data, dict) else {}


def _beside(dest: Path, src: Path, digest: str) -> tuple[Path, bool]:
    """(where the newer version goes beside the edited one, whether it is there already)."""
    stem = src.stem
    for p in sorted(dest.glob(f"{stem}.handout-*.ipynb")):
        if not p.is_symlink() and p.is_file() and _digest(p) == digest:
            return p, True
    day = time.strftime("%Y%m%d")
    n, cand = 1, dest / f"{stem}.handout-{day}.ipynb"
    while cand.exists() or cand.is_symlink():
        n += 1
        cand = dest / f"{stem}.handout-{day}-{n}.ipynb"
    return cand, False


def _copy(src: Path, dst: Path) -> None:
    """Write a new file (never through a symlink), readable by its owner only."""
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(src.read_bytes())
    tmp.replace(dst)


def handout(dest: str | Path = DEFAULT_DEST, source: Path = NOTEBOOK_DIR) -> list[Copied]:
    """Copy the student notebooks into ``dest`` (the caller's own folder); see the module doc."""
    dest = Path(os.path.expanduser(str(dest)))
    notebooks = student_notebooks(source)
    if not notebooks:
        raise LabkitError(f"no student notebooks (NN_*.ipynb) in {source}: is this labkit's "
                          f"checkout?")
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise LabkitError(f"hand-out folder {dest} is a {'symlink' if dest.is_symlink() else 'file'}"
                          f"; give a folder of yours (--to DIR) or move it away")
    if Path(source).resolve() in (dest.resolve(), *dest.resolve().parents):
        raise LabkitError(f"hand-out folder {dest} is inside the checkout's notebooks {source}; "
                          f"give a folder of the student's own, e.g. {DEFAULT_DEST}")
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    if dest.stat().st_uid != os.geteuid():
        raise LabkitError(f"hand-out folder {dest} belongs to someone else; hand out as its "
                          f"owner (root: `labkit class handout --students USER`)")
    given = _load_manifest(dest)
    out = []
    for src in notebooks:
        digest, dst = _digest(src), dest / src.name
        if dst.is_symlink() or (dst.exists() and not dst.is_file()):
            out.append(Copied(src.name, "skipped: not a regular file", str(dst)))
            continue
        if not dst.exists():
            _copy(src, dst)
            action = "new"
        elif (now := _digest(dst)) == digest:
            action = "same"
        elif given.get(src.name) == digest:  # edited by the student; no newer version
            action = "edited"
        elif now == given.get(src.name):  # as handed out, not edited: the newer version
            _copy(src, dst)
            action = "updated"
        else:  # the student's edited copy stays; the newer version goes beside it
            dst, there = _beside(dest, src, digest)
            if not there:
                _copy(src, dst)
            action = "beside" if not there else "same"
        if action not in ("beside", "edited"):
            given[src.name] = digest
        out.append(Copied(src.name, action, str(dst)))
    tmp = dest / f".{MANIFEST}.tmp"
    tmp.unlink(missing_ok=True)
    tmp.write_text(json.dumps(given, indent=1, sort_keys=True))
    tmp.replace(dest / MANIFEST)
    return out


def handout_for(users: list[str], dest: str = DEFAULT_DEST) -> dict[str, list[dict[str, str]]]:
    """Root: ``handout`` as each of ``users`` (a child process that has dropped to the
    student's uid and groups first: nothing is written with root's rights); {user: copied}."""
    if os.geteuid() != 0:
        raise LabkitError("handing out to other students needs root (it runs the hand-out as "
                          "each of them); a student runs `labkit class handout` alone")
    out = {}
    for user in users:
        try:
            pw = pwd.getpwnam(user)
        except KeyError:
            raise LabkitError(f"no Unix user {user!r}; --students takes the students' user "
                              f"names") from None
        out[user] = _as_user(pw, dest)
    return out


def _as_user(pw: pwd.struct_passwd, dest: str) -> list[dict[str, str]]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the student's identity, then the hand-out
        code = 1
        try:
            os.close(read)
            os.initgroups(pw.pw_name, pw.pw_gid)
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            os.environ["HOME"] = pw.pw_dir
            dst = dest.replace("~", pw.pw_dir, 1) if dest.startswith("~") else dest
            doc = {"ok": [c.to_dict() for c in handout(dst)]}
            code = 0
        except Exception as e:  # noqa: BLE001 - reported to the parent, which raises it
            doc = {"error": str(e)}
        with os.fdopen(write, "w") as f:
            json.dump(doc, f)
        os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        raw = f.read()
    os.waitpid(pid, 0)
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = {"error": f"the hand-out process said nothing readable: {raw[:200]!r}"}
    if "error" in doc:
        raise LabkitError(f"the hand-out as {pw.pw_name} failed: {doc['error']}")
    return doc["ok"]


__all__ = ["Copied", "handout", "handout_for", "student_notebooks"]
