"""RunConfig: the one description of a training run, from the notebook to the DataFrame.

A frozen dataclass built from a notebook's parameters cell, validated when it is built,
written to ``runs/<name>/config.json``, rendered into the job script, read back by
``code/pretrain_gpt.py`` and joined as columns onto parsed log rows.

Field names are Megatron-LM's argument names in snake_case, so ``--tensor-model-parallel-size``
is ``tensor_model_parallel_size`` (see ``MEGATRON_FLAGS``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from labkit.errors import ConfigError

PRECISIONS = ("fp32", "bf16", "fp16")
RECOMPUTE = (None, "selective", "full")
ATTENTION_BACKENDS = ("unfused", "flash")
DEVICES = ("cpu", "cuda")
BACKENDS = ("local", "slurm")
# Precisions the CPU/gloo path of code/pretrain_gpt.py really trains with.
CPU_PRECISIONS = ("fp32",)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class RunConfig:
    """A validated training run. Build it with keywords, a preset or ``from_json``."""

    # --- run -------------------------------------------------------------------------------
    name: str = "run"
    """Folder under the run root (``runs/<name>/``); letters, digits, ``.``, ``_``, ``-``."""
    nodes: int = 1
    """Nodes (Slurm) or simulated nodes (local backend)."""
    gpus_per_node: int = 2
    """GPUs per node; on CPU, training processes per node."""
    backend: str = "local"
    """``local`` (processes on this machine, the default) or ``slurm``."""
    device: str = "cpu"
    """``cpu`` (gloo) or ``cuda`` (NCCL)."""
    gpu_memory_gb: float = 80.0
    """Memory of one GPU in GB (1e9 bytes), for the planner's fits / OOM prediction."""
    memory_limit_gb: float | None = None
    """Cap on what one training process may allocate; exceeding it is a real OOM."""
    # --- model -----------------------------------------------------------------------------
    num_layers: int = 4
    hidden_size: int = 128
    num_attention_heads: int = 4
    ffn_hidden_size: int | None = None
    """Defaults to 4 x hidden_size (Megatron's default)."""
    num_query_groups: int | None = None
    """Grouped-query attention groups; None means one per head (multi-head attention)."""
    swiglu: bool = False
    untie_embeddings_and_output_weights: bool = False
    attention_backend: str = "unfused"
    seq_length: int = 128
    max_position_embeddings: int = 128
    vocab_size: int = 4096
    """Tokenizer vocabulary, unpadded; padded to a multiple of 128 x TP as Megatron does."""
    make_vocab_size_divisible_by: int = 128
    # --- batch and parallelism -------------------------------------------------------------
    micro_batch_size: int = 2
    global_batch_size: int = 8
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    num_layers_per_virtual_pipeline_stage: int | None = None
    sequence_parallel: bool = False
    use_distributed_optimizer: bool = False
    recompute_granularity: str | None = None
    precision: str = "fp32"
    # --- schedule --------------------------------------------------------------------------
    train_iters: int = 30
    lr: float = 1e-3
    min_lr: float = 1e-4
    lr_warmup_iters: int = 3
    weight_decay: float = 0.01
    clip_grad: float = 1.0
    log_interval: int = 1
    save_interval: int | None = None
    """Checkpoint every N iterations (and at the end); None: only at the end."""
    eval_interval: int | None = None
    eval_iters: int = 2
    seed: int = 1234
    # --- data and tools --------------------------------------------------------------------
    data_path: str | None = None
    """Indexed dataset prefix (``.bin``/``.idx``); None: the repo's ``data/`` default corpus."""
    tokenizer_dir: str | None = None
    """Folder with ``vocab.json`` + ``merges.txt``; None: the one next to the default corpus."""
    profile: bool = False
    """Record torch.profiler steps to ``runs/<name>/profile/``."""
    profile_ranks: tuple[int, ...] = (0,)
    nccl_debug: bool = False
    """Export NCCL_DEBUG=INFO in the job script (transport lines in the log)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form notes carried along (notebook, exercise); never read by the engine."""

    def __post_init__(self) -> None:
        if isinstance(self.profile_ranks, list):
            object.__setattr__(self, "profile_ranks", tuple(self.profile_ranks))
        problems, notes = _check(self)
        if problems:
            raise ConfigError(problems, name=self.name if isinstance(self.name, str) else None)
        for note in notes:
            warnings.warn(note, stacklevel=3)

    # --- derived numbers -------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def tp(self) -> int:
        return self.tensor_model_parallel_size

    @property
    def pp(self) -> int:
        return self.pipeline_model_parallel_size

    @property
    def dp(self) -> int:
        return self.world_size // (self.tp * self.pp)

    @property
    def vpp(self) -> int:
        """Virtual pipeline stages per pipeline rank (1 without interleaving)."""
        if not self.num_layers_per_virtual_pipeline_stage:
            return 1
        return self.num_layers // (self.pp * self.num_layers_per_virtual_pipeline_stage)

    @property
    def num_microbatches(self) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    @property
    def tokens_per_iteration(self) -> int:
        return self.global_batch_size * self.seq_length

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def padded_vocab_size(self) -> int:
        """Vocabulary padded the way Megatron-LM pads it (multiple of divisible_by x TP)."""
        multiple = self.make_vocab_size_divisible_by * self.tp
        return int(math.ceil(self.vocab_size / multiple) * multiple)

    # --- construction ----------------------------------------------------------------------
    def replace(self, **changes: Any) -> RunConfig:
        """A copy with some fields changed (validated again)."""
        _reject_unknown(changes)
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_preset(cls, preset: str, **overrides: Any) -> RunConfig:
        """A run of a model preset (``tiny``, ``gpt2-124m``, ...) with fields overridden."""
        if preset not in PRESETS:
            raise ConfigError(f"unknown preset {preset!r}; presets are: {', '.join(PRESETS)}")
        _reject_unknown(overrides)
        return cls(**{**PRESETS[preset], **overrides})

    @classmethod
    def for_profile(cls, profile: str, **overrides: Any) -> RunConfig:
        """A run for a notebook profile: ``cpu`` (tiny GPT, gloo) or ``gpu`` (GPT-2, NCCL, bf16)."""
        if profile not in PROFILES:
            raise ConfigError(f"unknown profile {profile!r}; profiles are: {', '.join(PROFILES)}")
        base = dict(PROFILES[profile])
        preset = base.pop("preset")
        return cls.from_preset(preset, **{**base, **overrides})

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["profile_ranks"] = list(self.profile_ranks)
        return d

    def to_json(self, path: str | Path | None = None) -> str:
        """The config as JSON (sorted keys); also written to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        _reject_unknown(data)
        return cls(**data)

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> RunConfig:
        """Read a config from a JSON string or a ``.json`` file."""
        s = str(text_or_path)
        if not s.lstrip().startswith("{"):
            try:
                s = Path(s).read_text()
            except OSError as e:
                raise ConfigError(f"cannot read config file {text_or_path}: {e.strerror}") from None
        try:
            data = json.loads(s)
        except json.JSONDecodeError as e:
            raise ConfigError(f"config is not valid JSON ({e.msg} at line {e.lineno}, "
                              f"column {e.colno})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config JSON must be an object, got {type(data).__name__}")
        return cls.from_dict(data)

    def summary(self) -> str:
        """The derived numbers, once, with units."""
        tokens = self.tokens_per_iteration
        lines = [
            f"run {self.name!r}: {self.nodes} node(s) x {self.gpus_per_node} "
            f"{'GPU' if self.device == 'cuda' else 'process'}(es) = world size {self.world_size}",
            f"layout: TP={self.tp} x PP={self.pp}"
            + (f" (x {self.vpp} virtual stages)" if self.vpp > 1 else "")
            + f" x DP={self.dp}",
            f"batch: global {self.global_batch_size} = micro {self.micro_batch_size} x DP "
            f"{self.dp} x {self.num_microbatches} microbatch(es) per iteration",
            f"tokens per iteration: {self.global_batch_size} x {self.seq_length} = {tokens:,}",
            f"model: {self.num_layers} layers, hidden {self.hidden_size}, "
            f"{self.num_attention_heads} heads, vocab {self.vocab_size} "
            f"(padded {self.padded_vocab_size}), precision {self.precision}",
            f"training: {self.train_iters} iterations = {tokens * self.train_iters:,} tokens",
        ]
        return "\n".join(lines)


FIELD_NAMES = tuple(f.name for f in fields(RunConfig))

# RunConfig field -> Megatron-LM command-line flag (bool fields are store_true flags).
MEGATRON_FLAGS = {
    name: "--" + name.replace("_", "-")
    for name in FIELD_NAMES
    if name not in ("name", "nodes", "gpus_per_node", "backend", "device", "gpu_memory_gb",
                    "memory_limit_gb", "precision", "profile_ranks", "nccl_debug", "extra",
                    "tokenizer_dir")
}


def _reject_unknown(data: dict[str, Any]) -> None:
    unknown = sorted(set(data) - set(FIELD_NAMES))
    if unknown:
        hints = []
        for key in unknown:
            close = [n for n in FIELD_NAMES if key.replace("-", "_") in n or n in key]
            if close:
                hints.append(f"{key!r} -> did you mean {close[0]!r}?")
        raise ConfigError(
            f"unknown RunConfig field(s): {unknown}. "
            + (" ".join(hints) + " " if hints else "")
            + f"Valid fields are: {', '.join(FIELD_NAMES)}"
        )


def _check(c: RunConfig) -> tuple[list[str], list[str]]:
    """Every broken rule (with its numbers and a fix), and warnings that do not stop a run."""
    p: list[str] = []
    notes: list[str] = []
    # Types first: the arithmetic below needs ints.
    ints = ["nodes", "gpus_per_node", "num_layers", "hidden_size", "num_attention_heads",
            "seq_length", "max_position_embeddings", "vocab_size", "make_vocab_size_divisible_by",
            "micro_batch_size", "global_batch_size", "tensor_model_parallel_size",
            "pipeline_model_parallel_size", "train_iters", "log_interval", "eval_iters", "seed"]
    opt_ints = ["ffn_hidden_size", "num_query_groups", "num_layers_per_virtual_pipeline_stage",
                "save_interval", "eval_interval"]
    for n in ints + opt_ints:
        v = getattr(c, n)
        if v is None and n in opt_ints:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            p.append(f"{n}={v!r} must be an integer")
        elif v <= 0 and n != "seed":
            p.append(f"{n}={v} must be positive (> 0)")
    for n in ("lr", "min_lr", "weight_decay", "clip_grad", "gpu_memory_gb"):
        v = getattr(c, n)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            p.append(f"{n}={v!r} must be a number >= 0")
    if c.memory_limit_gb is not None and (not isinstance(c.memory_limit_gb, (int, float))
                                          or c.memory_limit_gb <= 0):
        p.append(f"memory_limit_gb={c.memory_limit_gb!r} must be a positive number or None")
    if not isinstance(c.lr_warmup_iters, int) or c.lr_warmup_iters < 0:
        p.append(f"lr_warmup_iters={c.lr_warmup_iters!r} must be an integer >= 0")
    for n, allowed in (("precision", PRECISIONS), ("recompute_granularity", RECOMPUTE),
                       ("attention_backend", ATTENTION_BACKENDS), ("device", DEVICES),
                       ("backend", BACKENDS)):
        if getattr(c, n) not in allowed:
            p.append(f"{n}={getattr(c, n)!r} is not one of {list(allowed)}")
    if not isinstance(c.name, str) or not NAME_RE.match(c.name):
        p.append(f"name={c.name!r} must be 1-64 letters, digits, '.', '_' or '-' (it names the "
                 f"folder runs/<name>/ and the Slurm job), e.g. 'tp2_pp2'")
    if p:  # the layout rules below would only repeat these
        return p, notes

    ws, tp, pp = c.world_size, c.tp, c.pp
    if ws % (tp * pp):
        p.append(f"TP x PP = {tp} x {pp} = {tp * pp} does not divide world size {ws} "
                 f"(= nodes {c.nodes} x gpus_per_node {c.gpus_per_node}); "
                 f"choose TP x PP among the divisors of {ws}: {_divisors(ws)}")
    else:
        dp = ws // (tp * pp)
        if c.global_batch_size % (c.micro_batch_size * dp):
            ok = c.micro_batch_size * dp
            p.append(f"global_batch_size {c.global_batch_size} is not divisible by "
                     f"micro_batch_size {c.micro_batch_size} x DP {dp} = {ok}; use a multiple of "
                     f"{ok}, e.g. {max(ok, c.global_batch_size // ok * ok)}")
        elif c.num_layers_per_virtual_pipeline_stage and pp > 1:
            m = c.global_batch_size // (c.micro_batch_size * dp)
            if m % pp:
                p.append(f"the interleaved schedule needs the number of microbatches ({m} = "
                         f"global {c.global_batch_size} / (micro {c.micro_batch_size} x DP {dp})) "
                         f"to be divisible by PP {pp}; use global_batch_size "
                         f"{c.micro_batch_size * dp * pp * max(1, -(-m // pp))}")
    if c.num_layers % pp:
        p.append(f"num_layers {c.num_layers} is not divisible by PP {pp}; "
                 f"PP must divide the layers: {_divisors(c.num_layers)}")
    vs = c.num_layers_per_virtual_pipeline_stage
    if vs:
        if pp == 1:
            p.append(f"num_layers_per_virtual_pipeline_stage={vs} (interleaving) needs PP > 1, "
                     f"but PP = 1; set pipeline_model_parallel_size >= 2 or drop interleaving")
        elif c.num_layers % (pp * vs):
            p.append(f"num_layers {c.num_layers} is not divisible by PP {pp} x "
                     f"num_layers_per_virtual_pipeline_stage {vs} = {pp * vs}")
        elif c.num_layers // (pp * vs) < 2:
            p.append(f"num_layers_per_virtual_pipeline_stage={vs} gives {c.num_layers} / "
                     f"({pp} x {vs}) = 1 virtual stage: that is no interleaving; use a smaller "
                     f"value (e.g. {c.num_layers // (2 * pp)}) or None")
    heads, groups = c.num_attention_heads, c.query_groups
    if heads % tp:
        p.append(f"num_attention_heads {heads} is not divisible by TP {tp}; "
                 f"TP must divide the heads: {_divisors(heads)}")
    if c.hidden_size % heads:
        p.append(f"hidden_size {c.hidden_size} is not divisible by num_attention_heads {heads} "
                 f"(head dim would be {c.hidden_size / heads:.2f}); heads that divide it: "
                 f"{_divisors(c.hidden_size)[:12]}")
    if heads % groups:
        p.append(f"num_query_groups {groups} does not divide num_attention_heads {heads}")
    if groups % tp:
        p.append(f"num_query_groups {groups} is not divisible by TP {tp}; each TP rank needs "
                 f"whole query groups")
    if c.sequence_parallel and tp == 1:
        p.append("sequence_parallel=True needs TP > 1 (it splits the sequence over the TP group); "
                 "set tensor_model_parallel_size >= 2 or sequence_parallel=False")
    if c.seq_length > c.max_position_embeddings:
        p.append(f"seq_length {c.seq_length} > max_position_embeddings "
                 f"{c.max_position_embeddings}; raise max_position_embeddings to >= {c.seq_length}")
    if c.min_lr > c.lr:
        p.append(f"min_lr {c.min_lr} > lr {c.lr}; the cosine decay goes from lr down to min_lr")
    if c.lr_warmup_iters > c.train_iters:
        p.append(f"lr_warmup_iters {c.lr_warmup_iters} > train_iters {c.train_iters}")
    bad_ranks = [r for r in c.profile_ranks if not isinstance(r, int) or not 0 <= r < ws]
    if bad_ranks:
        p.append(f"profile_ranks {list(c.profile_ranks)} has ranks outside 0..{ws - 1}: "
                 f"{bad_ranks}")
    if c.device == "cpu":
        if c.precision not in CPU_PRECISIONS:
            p.append(f"precision={c.precision!r} does not run on device='cpu' (the CPU path "
                     f"trains in {list(CPU_PRECISIONS)}); use precision='fp32' or device='cuda'")
        if c.attention_backend == "flash":
            p.append("attention_backend='flash' needs CUDA; use 'unfused' on device='cpu'")
        if c.sequence_parallel:
            p.append("sequence_parallel=True needs Transformer Engine or Apex layer norms "
                     "(GPU only); set sequence_parallel=False on device='cpu'")
    if tp > c.gpus_per_node and ws % (tp * pp) == 0:
        notes.append(f"TP {tp} > gpus_per_node {c.gpus_per_node}: tensor-parallel groups cross "
                     f"nodes, so every layer all-reduces over the inter-node network (slow). "
                     f"Keep TP <= {c.gpus_per_node} and use PP or DP across nodes.")
    return p, notes


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def validate(cfg: RunConfig | dict[str, Any]) -> RunConfig:
    """A RunConfig from a dict (or the same one); raises ConfigError listing every problem."""
    return cfg if isinstance(cfg, RunConfig) else RunConfig.from_dict(cfg)


# Model presets: the model fields only; runs add their own layout and batch.
PRESETS: dict[str, dict[str, Any]] = {
    # A few layers, hidden 128, BPE vocab of 4096: trains on CPU in seconds per iteration.
    "tiny": dict(num_layers=4, hidden_size=128, num_attention_heads=4, seq_length=128,
                 max_position_embeddings=128, vocab_size=4096),
    "gpt2-124m": dict(num_layers=12, hidden_size=768, num_attention_heads=12, seq_length=1024,
                      max_position_embeddings=1024, vocab_size=50257),
    "gpt2-350m": dict(num_layers=24, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                      max_position_embeddings=1024, vocab_size=50257),
    "gpt-1.3b": dict(num_layers=24, hidden_size=2048, num_attention_heads=16, seq_length=2048,
                     max_position_embeddings=2048, vocab_size=50257),
    # The GPT of NVIDIA DLI's Megatron-LM multi-node lab: 12 layers, 768 hidden, 32 heads.
    "dli-gpt": dict(num_layers=12, hidden_size=768, num_attention_heads=32, seq_length=1024,
                    max_position_embeddings=1024, vocab_size=50257),
}

# Notebook profiles (DESIGN section 7): papermill picks one with -p profile cpu|gpu.
PROFILES: dict[str, dict[str, Any]] = {
    "cpu": dict(preset="tiny", device="cpu", precision="fp32", nodes=2, gpus_per_node=2,
                micro_batch_size=2, global_batch_size=8, gpu_memory_gb=80.0),
    "gpu": dict(preset="gpt2-124m", device="cuda", precision="bf16", nodes=2, gpus_per_node=8,
                micro_batch_size=4, global_batch_size=64, gpu_memory_gb=80.0,
                attention_backend="flash", lr=6e-4, min_lr=6e-5, lr_warmup_iters=10,
                train_iters=100, log_interval=10),
}
