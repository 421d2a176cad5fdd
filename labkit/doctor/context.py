"""What the doctor's checks share: the ``Context`` (the profile, limits, the mode) and the
per-node probe run it starts once, lazily (``run_probes``)."""

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
from labkit.config import RunConfig
from labkit.doctor.probe import ProbeRun, local_probes, slurm_probe
from labkit.paths import CODE_DIR, DATA_DIR, run_root
from labkit.site import ClusterProfile
from labkit.slurmcli import SlurmError

DEFAULT_TIMEOUT_S = 120.0


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
