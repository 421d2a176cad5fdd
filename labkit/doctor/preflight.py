"""Running the doctor: the shared context, the per-node probe job, the checks, the table."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit._logging import log
from labkit.doctor.checks import CHECKS, FAIL, PASS, SKIP, WARN, CheckFn, Result
from labkit.paths import CODE_DIR, run_root
from labkit.site import ClusterProfile, load_cluster

__all__ = ["Context", "ProbeRun", "Result", "run_doctor", "render_table", "doctor_json", "CHECKS"]


@dataclass
class ProbeRun:
    """What the per-node probes reported (one record per rank that wrote anything)."""

    mode: str
    expected: int
    out: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    timed_out: bool = False
    error: str = ""
    fix: str = ""
    seconds: float = 0.0


@dataclass
class Context:
    """What the checks share: the profile, limits, and the probe job (run once, lazily)."""

    profile: ClusterProfile | None = None
    wants_slurm: bool = False
    hostfile: Path | None = None
    nodes: int | None = None
    timeout_s: float = 30.0
    _probe: ProbeRun | None = None
    _mode: str | None = None

    @property
    def wants_cuda(self) -> bool:
        return self.profile is not None and self.wants_slurm and self.profile.gpu_request != "none"

    def slurm_env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.profile is not None and self.profile.slurm_conf:
            env["SLURM_CONF"] = self.profile.slurm_conf
        return env

    @property
    def mode(self) -> str:
        """``slurm`` when sinfo answers, else ``local``."""
        if self._mode is None:
            self._mode = "local"
            if shutil.which("sinfo"):
                try:
                    r = subprocess.run(["sinfo", "-h", "-o", "%D"], capture_output=True,
                                       text=True, timeout=15, env=self.slurm_env())
                    if r.returncode == 0 and r.stdout.strip():
                        self._mode = "slurm"
                except (OSError, subprocess.TimeoutExpired):
                    pass
        return self._mode

    def probes(self) -> ProbeRun:
        if self._probe is None:
            self._probe = run_probes(self)
        return self._probe


def _probe_root(ctx: Context) -> Path:
    root = (ctx.profile.run_root_path() if ctx.profile else None) or run_root()
    return root / ".doctor" / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def _slurm_nodes(ctx: Context) -> int:
    if ctx.nodes:
        return ctx.nodes
    cmd = ["sinfo", "-h", "-o", "%D", "-t", "idle,mix,alloc"]
    if ctx.profile and ctx.profile.partition:
        cmd += ["-p", ctx.profile.partition]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=15,
                             env=ctx.slurm_env()).stdout.split()
        n = sum(int(x) for x in out if x.isdigit())
    except (OSError, subprocess.TimeoutExpired):
        n = 0
    return max(1, min(n or 2, 8))  # every node of a lab-sized partition, at most 8


def run_probes(ctx: Context) -> ProbeRun:
    """Start one probe per node (srun) or two local ones; collect their records."""
    out = _probe_root(ctx)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return ProbeRun(ctx.mode, 0, out, error=f"cannot create {out}: {e.strerror}",
                        fix="point the run root at a writable shared folder (LABKIT_RUN_ROOT "
                            "or the profile's run_root)")
    probe = [sys.executable, str(CODE_DIR / "doctor_probe.py"), "--out", str(out),
             "--timeout", str(ctx.timeout_s)]
    port = os.environ.get("MASTER_PORT")
    if port and port.isdigit():
        probe += ["--port", port]
    env = ctx.slurm_env()
    if ctx.mode == "slurm" and ctx.profile is not None:
        env.update(ctx.profile.env)  # what the profile's job scripts export (GLOO_SOCKET_IFNAME)
    env.setdefault("OMP_NUM_THREADS", "1")
    wall = 2 * ctx.timeout_s + 40  # two phases of timeout_s, plus start-up and allocation
    t0 = time.time()
    if ctx.mode == "slurm":
        n = _slurm_nodes(ctx)
        run = ProbeRun("slurm", n, out)
        env.pop("MASTER_ADDR", None)  # the job finds its head node, as a job script does
        name = f"labkit-doctor-{out.name[-6:]}"
        cmd = ["srun", f"--nodes={n}", "--ntasks-per-node=1", f"--job-name={name}",
               f"--time={max(1, int(wall // 60) + 1)}", "--quit-on-interrupt"]
        p = ctx.profile
        if p is not None:
            cmd += [f"--{k}={v}" for k, v in (("partition", p.partition), ("account", p.account),
                                              ("qos", p.qos)) if v]
            if ctx.wants_cuda:  # one GPU per node is enough to see that a job step gets one
                cmd += ["--gres=gpu:1"] if p.gpu_request == "gres" else ["--gpus-per-node=1"]
        setup = ([f"module load {m}" for m in p.modules] + list(p.setup)) if p else []
        if setup:
            import shlex

            cmd += ["bash", "-c", "; ".join(setup + ["exec " + shlex.join(probe)])]
        else:
            cmd += probe
        log.info(f"doctor: probing {n} node(s) with srun (up to {wall:.0f}s)")
        try:
            procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env)]
        except OSError as e:  # sinfo answers but there is no srun here
            run.error, run.fix = f"cannot start srun: {e}", "install the Slurm client (srun)"
            return run
    else:
        n = 2
        run = ProbeRun("local", n, out)
        master = os.environ.get("MASTER_ADDR", "127.0.0.1")
        log.info(f"doctor: probing with {n} local processes (no Slurm)")
        procs = [subprocess.Popen(probe + ["--rank", str(r), "--world", str(n), "--master-addr",
                                           master], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env)
                 for r in range(n)]
    errs = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=max(1.0, wall - (time.time() - t0)))
        except subprocess.TimeoutExpired:
            run.timed_out = True
            proc.kill()
            _, err = proc.communicate()
        if proc.returncode not in (0, None) and err.strip():
            errs.append(err.strip().splitlines()[-1])
    if run.timed_out and run.mode == "slurm":
        subprocess.run(["scancel", f"--name={name}"], capture_output=True, env=env)
    run.seconds = time.time() - t0
    for f in sorted(out.glob("rank-*.json")):
        try:
            run.records.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            pass
    run.records.sort(key=lambda r: r["rank"])
    if errs and not run.records:
        run.error = "; ".join(dict.fromkeys(errs))[:600]
        run.fix = ("check that the partition has idle nodes (sinfo), that this Python "
                   f"({sys.executable}) exists on the nodes, and the profile's setup lines")
    shutil.rmtree(out, ignore_errors=True)  # our own scratch folder; the results are in run
    try:
        out.parent.rmdir()  # .doctor/, when no other doctor run is using it
    except OSError:
        pass
    return run


def run_doctor(cluster: ClusterProfile | str | Path | None = None, *,
               hostfile: str | Path | None = None, nodes: int | None = None,
               timeout_s: float = 30.0, backend: str | None = None,
               checks: list[tuple[str, CheckFn]] | None = None) -> list[Result]:
    """Run the checks and return their results (never raises for a failing check).

    Args:
        cluster: a cluster profile (ClusterProfile, its YAML path or name); None: the
            mini-cluster's when it is up, else none (local).
        hostfile: DeepSpeed-style hostfile whose hosts need passwordless ssh / pdsh.
        nodes: nodes for the probe job (default: the partition's up nodes, at most 8).
        timeout_s: limit for each phase of the probe, the all-reduce included.
        backend: ``slurm`` or ``local`` to force how nodes are probed; None: Slurm when
            sinfo answers.
        checks: a subset of ``CHECKS`` (name, function) pairs.
    """
    wants_slurm = cluster is not None
    profile = load_cluster(cluster) if isinstance(cluster, (str, Path)) else cluster
    if profile is None:
        from labkit import minicluster

        profile = minicluster.minicluster_cluster() if minicluster.is_up() else None
    ctx = Context(profile=profile, wants_slurm=wants_slurm,
                  hostfile=Path(hostfile) if hostfile else None, nodes=nodes,
                  timeout_s=timeout_s, _mode=backend)
    results = []
    for name, fn in checks or CHECKS:
        try:
            results.append(fn(ctx))
        except Exception as e:  # a broken check is a finding, not a crash of the doctor
            results.append(Result(name, FAIL, f"the check itself crashed: "
                                  f"{type(e).__name__}: {e}", "report this as a labkit bug"))
    return results


def doctor_json(results: list[Result]) -> dict[str, list[dict[str, str]]]:
    return {"checks": [r.to_dict() for r in results]}


def render_table(results: list[Result], width: int = 100) -> str:
    """A readable table: status, check, detail; the fix under each WARN/FAIL. Pure."""
    import textwrap

    name_w = max([len(r.name) for r in results] + [5])
    lines = [f"{'STATUS':6}  {'CHECK':{name_w}}  DETAIL", f"{'-' * 6}  {'-' * name_w}  {'-' * 6}"]
    pad = " " * (6 + 2 + name_w + 2)
    for r in results:
        body = textwrap.wrap(r.detail, max(30, width - len(pad))) or [""]
        lines.append(f"{r.status:6}  {r.name:{name_w}}  {body[0]}")
        lines += [pad + b for b in body[1:]]
        if r.status not in (PASS, SKIP) and r.fix:
            fix = textwrap.wrap("fix: " + r.fix, max(30, width - len(pad)))
            lines += [pad + b for b in fix]
    counts = {s: sum(r.status == s for r in results) for s in (PASS, WARN, FAIL, SKIP)}
    lines.append(f"{len(results)} checks: {counts[PASS]} PASS, {counts[WARN]} WARN, "
                 f"{counts[FAIL]} FAIL" + (f", {counts[SKIP]} SKIP" if counts[SKIP] else ""))
    return "\n".join(lines)
