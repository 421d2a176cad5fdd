"""Real short trainings of code/pretrain_gpt.py for tests (engine, log parser, TensorBoard, ...).

    from tests.engine_runs import train
    run_dir = train(tmp_path, tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    text = (run_dir / "log.txt").read_text()     # real Megatron-format lines

Every run is real: torchrun starts ``world size`` processes that train megatron-core's GPT on
the default corpus (``data/``, built by ``make data`` or, if missing, here).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
sys.path.insert(0, str(REPO))

from labkit.config import RunConfig  # noqa: E402

# Small enough for a 2-core CI machine: 4 layers, hidden 64, 64 tokens per sample.
SMALL: dict[str, Any] = dict(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=64,
                             max_position_embeddings=64, vocab_size=4096, micro_batch_size=2,
                             global_batch_size=8, train_iters=30, log_interval=5, lr=2e-3,
                             min_lr=2e-4, lr_warmup_iters=3)
LOSS_RE = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?\| lm loss: ([0-9.E+-]+) \|")


def ensure_data() -> Path:
    """The default corpus under data/, built with code/prepare_data.py if it is missing."""
    data = REPO / "data"
    if not (data / "corpus_text_document.idx").is_file():
        subprocess.run([PYTHON, str(REPO / "code" / "prepare_data.py")], check=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    return data


def make_config(tmp_path: Path, name: str = "engine", **overrides: Any) -> tuple[RunConfig, Path]:
    """A small RunConfig written to ``tmp_path/<name>/config.json``; world size from the layout."""
    fields = {**SMALL, **overrides}
    if "gpus_per_node" not in fields:
        tp = fields.get("tensor_model_parallel_size", 1)
        pp = fields.get("pipeline_model_parallel_size", 1)
        fields["gpus_per_node"] = tp * pp * fields.pop("dp", 1)
    fields.pop("dp", None)
    cfg = RunConfig(name=name, nodes=1, **fields)
    run_dir = tmp_path / name
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg.to_json(run_dir / "config.json")
    return cfg, run_dir


def launch(cfg: RunConfig, run_dir: Path, *, extra_args: list[str] | None = None,
           env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start torchrun on this machine (standalone rendezvous); returns the Popen."""
    ensure_data()
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node", str(cfg.world_size),
           str(REPO / "code" / "pretrain_gpt.py"), "--config", str(run_dir / "config.json"),
           *(extra_args or [])]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("LABKIT_LOG_CAPTURED", None)
    out = open(run_dir / "torchrun.out", "a")
    return subprocess.Popen(cmd, cwd=REPO, env=full_env, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)


def train(tmp_path: Path, name: str = "engine", *, check: bool = True, timeout: float = 600,
          extra_args: list[str] | None = None, **cfg_overrides: Any) -> Path:
    """Run a real short training; returns its run directory (log.txt, tb/, checkpoints/, ...).

    ``cfg_overrides`` are RunConfig fields (plus ``dp=N`` for data-parallel replicas); the
    defaults are ``SMALL`` (4 layers, hidden 64, seq 64, 30 iterations, a log line every 5).
    With ``check`` a non-zero exit raises with the end of torchrun's output. Calling it again
    with the same ``tmp_path``/``name`` resumes from that run's checkpoints (pass
    ``extra_args=["--no-resume"]`` to start over); torchrun's own output is in
    ``run_dir/torchrun.out``.
    """
    cfg, run_dir = make_config(tmp_path, name, **cfg_overrides)
    proc = launch(cfg, run_dir, extra_args=extra_args)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_all(proc)
        raise
    if check and code != 0:
        tail = (run_dir / "torchrun.out").read_text()[-4000:]
        raise RuntimeError(f"training {name} exited {code}; torchrun output ends:\n{tail}")
    return run_dir


def losses(run_dir: Path) -> dict[int, float]:
    """iteration -> lm loss from a run's log.txt (the last value wins after a resume)."""
    out: dict[int, float] = {}
    for m in LOSS_RE.finditer((run_dir / "log.txt").read_text()):
        out[int(m.group(1))] = float(m.group(2))
    return out


def kill_all(proc: subprocess.Popen) -> None:
    """SIGKILL torchrun and every worker (torchrun starts its workers in their own sessions)."""
    import psutil

    try:
        procs = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        procs = []
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)
    proc.wait()


def wait_for(path: Path, timeout: float = 300, proc: subprocess.Popen | None = None) -> None:
    """Wait until ``path`` exists (or the process ended)."""
    t0 = time.time()
    while not path.exists():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process ended ({proc.returncode}) before {path} appeared")
        if time.time() - t0 > timeout:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        time.sleep(0.2)
