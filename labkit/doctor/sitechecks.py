"""The doctor's checks of the site: its probe job, the data on every node, and (``--class``)
the per-user run roots and whether a class's jobs fit the partition at once."""

from __future__ import annotations

import grp
import math
import pwd
import stat
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from labkit.config import RunConfig
from labkit.doctor.fit import class_fit, node_slots, partition_nodes
from labkit.doctor.result import FAIL, PASS, SKIP, WARN, Result
from labkit.paths import NOTEBOOK_DIR

if TYPE_CHECKING:
    from labkit.doctor.context import Context

DATA_FILES = (("bin", "dataset .bin"), ("idx", "dataset .idx"), ("vocab", "tokenizer vocab.json"),
              ("merges", "tokenizer merges.txt"))


def node_name(rec: dict) -> str:
    """A node's name as Slurm knows it (the mini-cluster's nodes share one hostname)."""
    return rec.get("slurm_node") or f"{rec.get('hostname', '?')}#{rec['rank']}"


def check_probe_job(ctx: Context) -> Result:
    name = "probe job (as the site's jobs run)"
    if ctx.mode != "slurm":
        return Result(name, SKIP, "skipped: no Slurm; two local probe processes instead")
    run = ctx.probes()
    p = ctx.profile
    how = ", ".join(f"{k} {v}" for k, v in (("partition", p and p.partition),
                                            ("account", p and p.account),
                                            ("qos", p and p.qos)) if v)
    if p is not None:
        how += "".join(f", {o}" for o in p.sbatch_extra)
        how += ", modules " + " ".join(p.modules) if p.modules else ""
        how += f", container {p.container['image']}" if p.container else ""
        how += f", env {' '.join(sorted(p.env))}" if p.env else ""
    how = how.lstrip(", ") or "the generic defaults"
    if run.error and (not run.records or run.job_id is None):
        return Result(name, FAIL, run.error, run.fix)
    if run.timed_out:
        return Result(name, FAIL, run.error, run.fix)
    nodes = ", ".join(dict.fromkeys(node_name(r) for r in run.records))
    queued = f"queued {run.queued_s:.0f}s, " if run.queued_s is not None else ""
    return Result(name, PASS, f"job {run.job_id} ran on {run.expected} node(s) ({nodes}) with "
                  f"{how}: {queued}{run.seconds:.0f}s in all")


def _needs(ctx: Context) -> tuple[str, int, int]:
    profile = "gpu" if ctx.wants_cuda else "cpu"
    cfg = RunConfig.for_profile(profile, cluster=ctx.profile)
    return profile, cfg.seq_length, cfg.vocab_size


def check_data(ctx: Context) -> Result:
    name = "dataset and tokenizer on every node"
    run = ctx.probes()
    prefix, tok = ctx.data_location()
    recs = [r for r in run.records if "data" in r]
    if not recs:
        return Result(name, FAIL, f"no node reported on {prefix}.bin/.idx and {tok}: "
                      f"{run.error or 'the probe stopped before its first report'}", run.fix)
    problems = []
    for r in recs:
        for key, what in DATA_FILES:
            f = r["data"][key]
            if f.get("error"):
                problems.append(f"{node_name(r)}: {what} {f['path']} {f['error']}")
    for key, what in DATA_FILES:
        sizes = {node_name(r): r["data"][key].get("size") for r in recs
                 if r["data"][key].get("size") is not None}
        if len(set(sizes.values())) > 1:
            problems.append(f"{what} differs between nodes (a partial or stale copy): "
                            + ", ".join(f"{n} {s:,} bytes" for n, s in sizes.items()))
    profile, seq, vocab = _needs(ctx)
    first = recs[0]["data"]
    tokens, entries = first["bin"].get("tokens"), first["vocab"].get("entries")
    if tokens is not None and tokens < seq + 1:
        problems.append(f"{prefix}.bin holds {tokens} tokens, fewer than one sample of the "
                        f"{profile} profile (seq_length {seq} + 1)")
    if entries is not None and entries > vocab:
        problems.append(f"{tok}/vocab.json has {entries} tokens, more than the {profile} "
                        f"profile's vocab_size {vocab} (token ids beyond the embedding table)")
    nodes = ", ".join(node_name(r) for r in recs)
    if problems:
        return Result(name, FAIL, "; ".join(problems),
                      f"run `make data` once in the shared checkout (python code/prepare_data.py) "
                      f"so that {prefix.parent} is on a file system every node mounts, readable "
                      f"by every user (chmod -R a+rX {prefix.parent})")
    return Result(name, PASS, f"{prefix}.bin/.idx ({tokens:,} tokens, "
                  f"{first['idx'].get('sequences', '?')} documents) and {tok} "
                  f"(vocab.json {entries} tokens, merges.txt) present, readable and the same "
                  f"size on {nodes}; enough for the {profile} profile (seq_length {seq}, "
                  f"vocab_size {vocab})")


# --- the instructor's checks (labkit doctor --class) -----------------------------------------
def _try_write(root: Path) -> str | None:
    """Create ``root`` (as labkit would) and a probe folder in it, then remove both (only what
    this made); None when that worked, else why not."""
    made, p = [], root
    while not p.exists() and p != p.parent:
        made.append(p)
        p = p.parent
    probe = root / f".doctor-write-{uuid.uuid4().hex[:6]}"
    try:
        probe.mkdir(parents=True)
        (probe / "x").write_text("x")
        (probe / "x").unlink()
        probe.rmdir()
        return None
    except OSError as e:
        return f"{e.strerror} ({e.filename})"
    finally:
        for d in made:  # deepest first; a folder someone else filled meanwhile stays
            try:
                d.rmdir()
            except OSError:
                break


def _others(parent: Path, students: int | None) -> tuple[str, str, str]:
    """(status, detail, fix) of whether other users get their own folder in ``parent``."""
    st = parent.stat()
    mode = stat.S_IMODE(st.st_mode)
    owner = pwd.getpwuid(st.st_uid).pw_name if _has_uid(st.st_uid) else str(st.st_uid)
    where = f"{parent} (mode {mode:04o}, owner {owner})"
    if mode & stat.S_IWOTH:
        if mode & stat.S_ISVTX:
            return PASS, f"{where} is world-writable and sticky: each user creates their own " \
                         f"folder, and none can remove another's", ""
        return WARN, f"{where} is world-writable without the sticky bit: a student can rename " \
                     f"or remove another's folder", f"chmod +t {parent}"
    if mode & stat.S_IWGRP:
        group = grp.getgrgid(st.st_gid).gr_name if _has_gid(st.st_gid) else str(st.st_gid)
        return PASS, f"{where} is writable by group {group}: students in that group create " \
                     f"their own folders (others cannot)", ""
    own = sorted(d.name for d in parent.iterdir() if d.is_dir() and _has_uid(d.stat().st_uid)
                 and pwd.getpwuid(d.stat().st_uid).pw_name == d.name)
    fix = (f"chmod 1777 {parent} (each user creates their own folder), or pre-create one "
           f"folder per student there, owned by that student")
    if not own:
        return FAIL, f"only {owner} can create folders in {where}, and no per-user folder is " \
                     f"there yet: students' runs cannot start", fix
    if students is not None and len(own) < students:
        return WARN, f"only {owner} can create folders in {where}; {len(own)} per-user folder(s) " \
                     f"pre-created ({', '.join(own[:10])}), fewer than {students} students", fix
    return PASS, f"per-user folders pre-created in {where}: {', '.join(own[:10])}" \
                 + (" ..." if len(own) > 10 else ""), ""


def _has_uid(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def _has_gid(gid: int) -> bool:
    try:
        grp.getgrgid(gid)
        return True
    except KeyError:
        return False


def check_class_run_root(ctx: Context) -> Result:
    name = "class: run root per user"
    p = ctx.profile
    if p is None or not p.run_root:
        return Result(name, WARN, "the site profile sets no run_root: every student's runs go to "
                      "the default run root of their own checkout", "set run_root: "
                      "/shared/labkit/{user}/runs in the site profile (a file system every "
                      "node mounts)")
    mine = p.run_root_path()
    why = _try_write(mine)
    if why:
        return Result(name, FAIL, f"cannot create a folder in my run root {mine}: {why}",
                      f"make {mine.parent} writable for the students (chmod 1777), or create "
                      f"{mine} for each user")
    if "{user}" not in p.run_root:
        return Result(name, WARN, f"{mine} writable, but run_root {p.run_root!r} has no {{user}}: "
                      f"the whole class shares one run root", "run_root: "
                      "/shared/labkit/{user}/runs (one root per student)")
    prefix = p.run_root[:p.run_root.index("{user}")]
    parent = Path(prefix) if prefix.endswith("/") else Path(prefix).parent
    try:
        status, detail, fix = _others(parent, ctx.students)
    except OSError as e:
        return Result(name, FAIL, f"{parent}, where each user's run root is created, cannot be "
                      f"read: {e.strerror}", f"mkdir -p {parent} && chmod 1777 {parent}")
    return Result(name, status, f"created and removed a folder in my run root {mine}; for other "
                  f"users only the folder their run roots go in can be checked: {detail}", fix)


def _world_readable(path: Path) -> bool:
    """Anyone may read ``path``: it and every folder above it are open to others."""
    need = 0o005 if path.is_dir() else 0o004  # a folder: list and enter; a file: read
    if path.stat().st_mode & need != need:
        return False
    return all(p.stat().st_mode & 0o001 for p in path.resolve().parents)


def check_class_solutions(ctx: Context) -> Result:
    """The shared checkout's notebooks/solutions/ must not be readable by the students."""
    name = "class: solutions kept from students"
    p = ctx.profile
    base = Path(p.code_dir).parent if p is not None and p.code_dir else NOTEBOOK_DIR.parent
    sol = base / "notebooks" / "solutions"
    if not sol.is_dir():
        return Result(name, PASS, f"no {sol} in the shared checkout")
    try:
        open_files = [f.name for f in sorted(sol.glob("*.ipynb")) if _world_readable(f)]
        listable = _world_readable(sol)
    except OSError as e:
        return Result(name, WARN, f"cannot read the modes of {sol}: {e.strerror}",
                      f"check by hand that students cannot read {sol}")
    if not open_files and not listable:
        return Result(name, PASS, f"{sol} is not readable by other users")
    return Result(name, WARN, f"{sol} is readable by every user ({len(open_files)} notebook(s)"
                  f"{', and listable' if listable else ''}): the students can open the answers",
                  f"chmod -R o-rwx {sol} (or chgrp -R instructors and chmod -R g+rX,o-rwx); the "
                  f"hand-out (labkit class handout) never copies it")


def check_class_fit(ctx: Context) -> Result:
    name = "class: jobs at once in the partition"
    if ctx.mode != "slurm":
        return Result(name, SKIP, "skipped: no Slurm partition (local backend)")
    p = ctx.profile
    part = p.partition if p else None
    k, procs = ctx.series_shape()
    cpus = (p.cpus_per_task if p and p.cpus_per_task else procs)
    gpus = procs if ctx.wants_cuda else 0
    nodes, show = partition_nodes(part, ctx.slurm_conf)
    label = f"partition {part}" if part else "the default partition"
    if not nodes:
        return Result(name, FAIL, f"{label} lists no nodes (sinfo -N)", "set partition in the "
                      "site profile to one `sinfo -s` lists")
    job = f"{k} node(s) x {cpus} CPU(s)" + (f" x {gpus} GPU(s)" if gpus else "")
    has = ", ".join(f"{n.name} {n.cpus} CPUs" + (f" {n.gpus} GPUs" if gpus else "")
                    + f" {n.state}" for n in nodes[:8]) + (" ..." if len(nodes) > 8 else "")
    fit = class_fit(nodes, ctx.students, k, cpus, gpus, bool(p and p.exclusive))
    state = next((t.split("=", 1)[1] for t in show.split() if t.startswith("State=")), "UP")
    if state != "UP":
        return Result(name, FAIL, f"{label} is {state} ({has})", f"ask the admins to bring "
                      f"{label} up (scontrol update PartitionName={part} State=UP)")
    if fit.at_once == 0:
        return Result(name, FAIL, f"not even one job of the series ({job}) fits {label}: {has}",
                      "use a partition with more nodes, or fewer nodes / processes per job")
    if ctx.students is None:
        return Result(name, PASS, f"{fit.at_once} job(s) of the series ({job} each) run at once "
                      f"in {label} ({has}); pass --students N to check a class")
    if fit.fits:
        return Result(name, PASS, f"{ctx.students} students x {job} fit {label} at once "
                      f"(room for {fit.at_once}; {has})")
    per_node = max(node_slots(n, cpus, gpus, bool(p and p.exclusive)) for n in nodes)
    need = max(k, math.ceil(ctx.students * k / per_node))
    return Result(name, WARN, f"only {fit.at_once} of {ctx.students} students' jobs ({job} each) "
                  f"run at once in {label} ({has}); the others wait in the queue, about "
                  f"{math.ceil(ctx.students / fit.at_once)} rounds",
                  f"book a reservation of about {need} such nodes for the class (sbatch_extra: "
                  f"--reservation=NAME), or give each job fewer nodes or CPUs (cpus_per_task)")
