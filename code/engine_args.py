"""Command line of code/pretrain_gpt.py: ``--config RUN_DIR/config.json`` or Megatron-LM flags.

Flag mode takes every RunConfig field that has a Megatron-LM flag (``MEGATRON_FLAGS``),
``--bf16``/``--fp16``, and the flags that spell out what the engine always does
(``labkit.megatron_args.ENGINE_FLAGS``: given another value, it stops), and the data flags
(``--data-path``, ``--vocab-file``, ``--merge-file``: paths that must be the ones the engine
reads, ``labkit.megatron_args.data_paths``). How a job script passes a run (flags, and
config.json in ``$LABKIT_CONFIG`` for the fields without one) is ``labkit/render.py``'s rule;
without ``$LABKIT_CONFIG`` those fields come from the launcher (world size, local size, the
GPU seen) and RunConfig's defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

import torch

from labkit.config import MEGATRON_FLAGS, RunConfig
from labkit.megatron_args import (
    ENGINE_FLAGS,
    RECOMPUTE_FULL,
    SWITCHES,
    TOKENIZER_FILES,
    config_from_flags,
    engine_flag_problems,
)
from labkit.rules import fused_norms_missing

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = REPO_ROOT / "data"
"""The default corpus and tokenizer's folder (pretrain_gpt.py reads it: engine_data.resolve_data)."""


def _number(text: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="megatron-core GPT pretraining (labkit)")
    ap.add_argument("--config", type=Path, help="RUN_DIR/config.json (a labkit RunConfig)")
    ap.add_argument("--run-dir", type=Path, help="run directory (flag mode; default runs/<name>)")
    ap.add_argument("--save", type=Path, help="checkpoint folder (default RUN_DIR/checkpoints)")
    ap.add_argument("--load", type=Path, help="the checkpoint folder to resume from: --save's")
    ap.add_argument("--no-resume", action="store_true", help="ignore existing checkpoints")
    # The DeepSpeed launcher (and torch.distributed.launch) pass the local rank as an argument;
    # torchrun and DeepSpeed also set LOCAL_RANK, RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT.
    ap.add_argument("--local_rank", "--local-rank", type=int, default=None,
                    help="this process's rank on its node (set by launchers; LOCAL_RANK wins)")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--fp16", action="store_true")
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    for name, flag in MEGATRON_FLAGS.items():
        if isinstance(defaults[name], bool):
            ap.add_argument(flag, dest=name, action="store_true", default=None)
        else:
            ap.add_argument(flag, dest=name, type=_number, default=None)
    fixed = [f for g in ENGINE_FLAGS.values() for f in g] + [RECOMPUTE_FULL[0], RECOMPUTE_FULL[2]]
    for flag in fixed:
        ap.add_argument(flag, dest="fixed:" + flag, default=None,
                        help="what labkit's engine always uses (another value stops it)")
    for flag, name in TOKENIZER_FILES.items():
        ap.add_argument(flag, dest="file:" + flag, default=None,
                        help=f"the tokenizer's {name} (it must be the run's tokenizer_dir's)")
    for flag in SWITCHES:
        ap.add_argument(flag, action="store_true", help="implied (accepted for Megatron-LM)")
    return ap


def parse_args(argv: list[str] | None = None) -> tuple[RunConfig, Path, Path, bool]:
    """(config, run dir, checkpoint dir, resume) from --config or Megatron-LM flags."""
    from labkit.errors import ConfigError

    ap = _parser()
    a = ap.parse_args(argv)
    if a.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(a.local_rank))
    flags = {n: getattr(a, n) for n in MEGATRON_FLAGS if getattr(a, n) is not None}
    fixed = {k[len("fixed:"):]: v for k, v in vars(a).items() if k.startswith("fixed:")}
    files = {k[len("file:"):]: v for k, v in vars(a).items() if k.startswith("file:") and v}
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if a.config:
        if flags or files:
            ap.error(f"give either --config or Megatron-LM flags, not both (got {sorted([*flags, *files])})")
        cfg = RunConfig.from_json(a.config)
        run_dir = a.config.resolve().parent
    else:
        bad = engine_flag_problems(fixed)
        if bad:
            raise ConfigError("flags labkit's engine does not follow: " + "; ".join(bad))
        precision = "bf16" if a.bf16 else "fp16" if a.fp16 else "fp32"
        base_file = os.environ.get("LABKIT_CONFIG")
        if base_file:  # a labkit job script: config.json carries the fields without a flag
            base = RunConfig.from_json(base_file)
            cfg = config_from_flags(flags, precision=precision, base=base, data_dir=DATA_DIR,
                                    files=files)
            run_dir = (a.run_dir or Path(base_file).parent).resolve()
        else:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("LOCAL_SIZE", str(world))))
            run_dir = (a.run_dir or (a.save.parent if a.save else REPO_ROOT / "runs" / "flags_run"))
            run_dir = run_dir.resolve()
            cfg = config_from_flags(
                flags, precision=precision, base=None, data_dir=DATA_DIR, files=files,
                name=run_dir.name,
                nodes=max(1, world // local), gpus_per_node=local,
                device="cuda" if torch.cuda.is_available() else "cpu")
    if cfg.world_size != world:
        sys.exit(f"pretrain_gpt: the config asks for world size {cfg.world_size} (nodes "
                 f"{cfg.nodes} x gpus_per_node {cfg.gpus_per_node}) but torchrun started {world} "
                 f"process(es); launch with --nnodes {cfg.nodes} --nproc_per_node "
                 f"{cfg.gpus_per_node}, or change the config")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        sys.exit("pretrain_gpt: device='cuda' but torch sees no GPU here; use device='cpu' "
                 "(profile cpu) or run on a GPU node")
    for problem in fused_norms_missing(cfg):  # the config only warns: it may be planned elsewhere
        sys.exit(f"pretrain_gpt: {problem}")
    if a.save and a.load and a.save.resolve() != a.load.resolve():
        sys.exit(f"pretrain_gpt: --save {a.save} and --load {a.load} differ; labkit resumes "
                 f"from and saves to one checkpoint folder (give the same path, or --save only)")
    resume = not (a.no_resume or os.environ.get("LABKIT_NO_RESUME", "") in ("1", "true"))
    ckpt_dir = a.save or a.load
    ckpt = ckpt_dir.resolve() if ckpt_dir else run_dir / "checkpoints"
    return cfg, run_dir, ckpt, resume


def config_file(argv: list[str]) -> Path | None:
    """The run's config.json named by ``--config`` or ``$LABKIT_CONFIG`` (where exit_code goes
    when the start fails), if its folder exists."""
    path = None
    if "--config" in argv and argv.index("--config") + 1 < len(argv):
        path = Path(argv[argv.index("--config") + 1])
    elif os.environ.get("LABKIT_CONFIG"):
        path = Path(os.environ["LABKIT_CONFIG"])
    return path if path is not None and path.parent.is_dir() else None
