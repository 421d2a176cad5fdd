"""Running the doctor: the site, the checks over one shared ``Context``, the table."""

from __future__ import annotations

import textwrap
from pathlib import Path

from labkit import minicluster
from labkit.doctor.checks import CHECKS, CLASS_CHECKS, FAIL, PASS, SKIP, WARN, CheckFn, Result
from labkit.doctor.context import DEFAULT_TIMEOUT_S, Context, run_probes
from labkit.doctor.probe import ProbeRun
from labkit.errors import ConfigError
from labkit.site import ClusterProfile, named_cluster

__all__ = ["Context", "ProbeRun", "Result", "run_doctor", "render_table", "doctor_json", "CHECKS",
           "DEFAULT_TIMEOUT_S", "run_probes"]


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
    profile = named_cluster(cluster)  # the site resolved here, once, and passed down
    wants_slurm = profile is not None
    if profile is None:
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
