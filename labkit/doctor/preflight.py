"""Running the doctor: the shared context, the per-node probe job, the checks, the table."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from labkit import slurmcli
from labkit._logging import log
from labkit.doctor.checks import CHECKS, CLASS_CHECKS, FAIL, PASS, SKIP, WARN, CheckFn, Result
from labkit.doctor.probe import ProbeRun, local_probes, slurm_probe
from labkit.errors import ConfigError
from labkit.paths import CODE_DIR, DATA_DIR, run_root
from labkit.site import CLUSTER_ENV, ClusterProfile, resolve_cluster
from labkit.slurmcli import SlurmError

DEFAULT_TIMEOUT_S = 120.0

__all__ = ["Context", "ProbeRun", "Result", "run_doctor", "render_table", "doctor_json", "CHECKS",
           "DEFAULT_TIMEOUT_S"]


@dataclass
class Context:
    """What the checks share: the profile, limits, and the probe job (run once, lazily)."""

    profile: ClusterProfile | None = None
    wants_slurm: bool = False
    hostfile: Path | None = None
    nodes: int | None = None
    """Nodes of the probe job; None: the nodes the series' runs use (``series_shape``)."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """How long the doctor waits for its probe job in all, the queue included."""
    students: int | None = None
    """``--class``: students whose jobs should fit the partition at once (None: say how many do)."""
    _probe: ProbeRun | None = None
    _mode: str | None = None

    @property
    def wants_cuda(self) -> bool:
        return self.profile is not None and self.wants_slurm and self.profile.gpu_request != "none"

    @property
    def phase_s(self) -> float:
        """Seconds for each phase of the probe: a quarter of the whole wait, 5 to 30."""
        return min(30.0, max(5.0, self.timeout_s / 4))

    def series_shape(self) -> tuple[int, int]:
        """(nodes, processes per node) of the series' runs on this site: those of
        ``RunConfig.for_profile`` (``gpu`` where the site has GPUs, with the site's
        ``gpus_per_node``; else ``cpu``), the shape the notebooks' multi-node runs take;
        ``nodes`` overrides the node count."""
        from labkit.config import RunConfig

        cfg = RunConfig.for_profile("gpu" if self.wants_cuda else "cpu", cluster=self.profile)
        return self.nodes or cfg.nodes, cfg.gpus_per_node

    def data_location(self) -> tuple[Path, Path]:
        """(dataset prefix, tokenizer folder) the site's jobs read: ``data/`` beside the
        profile's ``code_dir`` (pretrain_gpt.py reads ``<its folder>/../data``), else this
        checkout's ``data/``."""
        base = (Path(self.profile.code_dir).parent / "data"
                if self.profile is not None and self.profile.code_dir else DATA_DIR)
        return base / "corpus_text_document", base / "tokenizer"

    @property
    def slurm_conf(self) -> str | None:
        """The profile's slurm.conf for Slurm's commands (None: Slurm's own default)."""
        return self.profile.slurm_conf if self.profile is not None else None

    def slurm_env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        return env

    @property
    def mode(self) -> str:
        """``slurm`` when sinfo lists a partition, else ``local``."""
        if self._mode is None:
            try:
                self._mode = "slurm" if slurmcli.partitions(self.slurm_conf) else "local"
            except SlurmError:
                self._mode = "local"
        return self._mode

    def probes(self) -> ProbeRun:
        if self._probe is None:
            self._probe = run_probes(self)
        return self._probe


def _probe_root(ctx: Context) -> Path:
    root = (ctx.profile.run_root_path() if ctx.profile else None) or run_root()
    return root / ".doctor" / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def run_probes(ctx: Context) -> ProbeRun:
    """Submit the probe job (Slurm) or start two local probes; collect their records."""
    out = _probe_root(ctx)
    made = [d for d in (out, *out.parents) if not d.exists()]  # deepest first
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return ProbeRun(ctx.mode, 0, out, error=f"cannot create {out}: {e.strerror}",
                        fix="point the run root at a writable shared folder (LABKIT_RUN_ROOT "
                            "or the profile's run_root)")
    prefix, tokenizer = ctx.data_location()
    args = ["--out", str(out), "--timeout", f"{ctx.phase_s:g}", "--data", str(prefix),
            "--tokenizer", str(tokenizer)]
    port = os.environ.get("MASTER_PORT")
    if port and port.isdigit():
        args += ["--port", port]
    errs: list[str] = []
    if ctx.mode == "slurm":
        n = ctx.series_shape()[0]
        log.info(f"doctor: probe job on {n} node(s) (waiting up to {ctx.timeout_s:.0f}s)")
        run = slurm_probe(ctx.profile or ClusterProfile(), out, n, args,
                          timeout_s=ctx.timeout_s, gpu=ctx.wants_cuda)
    else:
        env = ctx.slurm_env()
        env.setdefault("OMP_NUM_THREADS", "1")
        n = 2
        run = ProbeRun("local", n, out)
        log.info(f"doctor: probing with {n} local processes (no Slurm)")
        t0 = time.time()
        errs, run.timed_out = local_probes(
            [sys.executable, str(CODE_DIR / "doctor_probe.py"), *args], n,
            os.environ.get("MASTER_ADDR", "127.0.0.1"), env,
            max(ctx.timeout_s, 2 * ctx.phase_s + 20))
        run.seconds = time.time() - t0
    for f in sorted(out.glob("rank-*.json")):
        try:
            run.records.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            pass
    run.records.sort(key=lambda r: r["rank"])
    if errs and not run.records:
        run.error = "; ".join(dict.fromkeys(errs))[:600]
        run.fix = f"check that this Python ({sys.executable}) runs code/doctor_probe.py"
    shutil.rmtree(out, ignore_errors=True)  # our own scratch folder; the results are in run
    for d in made[1:]:  # .doctor/ and any run root folder this made, unless now in use
        try:
            d.rmdir()
        except OSError:
            break
    return run


def run_doctor(cluster: ClusterProfile | str | Path | None = None, *,
               hostfile: str | Path | None = None, nodes: int | None = None,
               timeout_s: float = DEFAULT_TIMEOUT_S, backend: str | None = None,
               checks: list[tuple[str, CheckFn]] | None = None, for_class: bool = False,
               students: int | None = None) -> list[Result]:
    """Run the checks and return their results (never raises for a failing check).

    Args:
        cluster: a cluster profile (ClusterProfile, its YAML path or name); None:
            ``$LABKIT_CLUSTER`` when set, else the mini-cluster's when it is up, else none.
        hostfile: DeepSpeed-style hostfile whose hosts need passwordless ssh / pdsh.
        nodes: nodes for the probe job (default: the nodes the series' runs use).
        timeout_s: how long to wait for the probe job in all, the queue included; on Slurm
            the doctor then names the job, its state and queue reason, and cancels it.
        backend: ``slurm`` or ``local`` to force how nodes are probed; ``hostfile``: the
            profile's hosts are reached by ssh, so the Slurm checks are left out (the probe
            runs here); None: ``hostfile`` for a profile with ``hosts`` or a ``hostfile``,
            else Slurm when sinfo answers.
        checks: a subset of ``CHECKS`` (name, function) pairs.
        for_class: also the instructor's checks (``CLASS_CHECKS``): the shared run root per
            user, and ``students`` jobs of the series at once in the partition.
        students: the class size for ``for_class``.
    """
    if students is not None and not for_class:
        raise ConfigError(f"students={students} is for the instructor's checks: labkit doctor "
                          f"--class --students {students} (for_class=True)")
    site_env = os.environ.get(CLUSTER_ENV, "").strip()
    wants_slurm = cluster is not None or bool(site_env)
    profile = resolve_cluster(cluster) if wants_slurm else None
    if profile is None:
        from labkit import minicluster

        up = minicluster.is_up()
        profile = None if not up else (minicluster.minicluster_hostfile_cluster()
                                       if backend == "hostfile" else minicluster.minicluster_cluster())
    if backend == "hostfile" or (backend is None and profile is not None
                                 and (profile.hosts or profile.hostfile)):
        # a site without Slurm: its hosts over ssh (the hostfile checks), no sinfo, no srun
        wants_slurm, backend = False, "local"
        checks = [c for c in checks or CHECKS if c[0] not in ("slurm", "accounting")]
    ctx = Context(profile=profile, wants_slurm=wants_slurm,
                  hostfile=Path(hostfile) if hostfile else None, nodes=nodes,
                  timeout_s=timeout_s, students=students, _mode=backend)
    results = []
    for name, fn in (checks or CHECKS) + (CLASS_CHECKS if for_class else []):
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
