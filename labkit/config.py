"""RunConfig: the one description of a training run, from the notebook to the DataFrame.

A frozen dataclass built from a notebook's parameters cell, validated when it is built
(``labkit.rules``), written to ``runs/<name>/config.json``, rendered into the job script, read
back by ``code/pretrain_gpt.py`` and joined as columns onto parsed log rows.

Field names are Megatron-LM's argument names in snake_case, so ``--tensor-model-parallel-size``
is ``tensor_model_parallel_size`` (see ``MEGATRON_FLAGS``). Each field's docstring says what it
is, its Megatron-LM flag where there is one, and its unit. Model presets and the notebooks'
cpu|gpu profiles live in ``labkit.presets``.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from labkit.errors import ConfigError
from labkit.presets import PRESETS, PROFILES
from labkit.rules import check
from labkit.site import as_profile
from labkit.validate import loads_json, read_input

__all__ = ["FIELD_NAMES", "MEGATRON_FLAGS", "PRESETS", "PROFILES", "RunConfig"]


@dataclass(frozen=True)
class RunConfig:
    """A validated training run. Build it with keywords, a preset or ``from_json``.

    Fields come in groups: the layout (nodes, processes, parallelism), the batch, the model,
    the schedule, the run (name, backend, device, data) and tools (profiler, NCCL logging).
    """

    # --- layout: nodes, processes and parallelism -----------------------------------------------
    nodes: int = 1
    """Nodes the run spans (Slurm ``--nodes``, torchrun ``--nnodes``); on the local backend,
    simulated nodes on this machine. No Megatron-LM flag (the launcher decides)."""
    gpus_per_node: int = 2
    """GPUs per node, one training process each (torchrun ``--nproc-per-node``); on
    ``device='cpu'``, training processes per node. World size = nodes x gpus_per_node."""
    tensor_model_parallel_size: int = 1
    """TP: ranks that split every layer's weight matrices and attention heads between them
    (``--tensor-model-parallel-size``). Must divide the heads; best kept inside one node."""
    pipeline_model_parallel_size: int = 1
    """PP: consecutive stages the layers are cut into, one per rank of a pipeline
    (``--pipeline-model-parallel-size``). Must divide ``num_layers``. DP = world / (TP x PP)."""
    num_layers_per_virtual_pipeline_stage: int | None = None
    """Layers per virtual stage for the interleaved 1F1B schedule
    (``--num-layers-per-virtual-pipeline-stage``); None: no interleaving. Needs PP > 1."""
    sequence_parallel: bool = False
    """Split layer norms and dropout along the sequence over the TP group
    (``--sequence-parallel``); needs TP > 1 and a GPU."""
    use_distributed_optimizer: bool = False
    """Shard the optimizer state and fp32 master weights over the DP ranks, ZeRO-1 style
    (``--use-distributed-optimizer``)."""
    # --- batch ----------------------------------------------------------------------------------
    micro_batch_size: int = 2
    """Sequences per rank in one forward/backward pass (``--micro-batch-size``)."""
    global_batch_size: int = 8
    """Sequences per iteration over all DP ranks (``--global-batch-size``); a multiple of
    micro_batch_size x DP, the rest is gradient accumulation (microbatches per iteration)."""
    # --- model ----------------------------------------------------------------------------------
    num_layers: int = 4
    """Transformer layers (``--num-layers``)."""
    hidden_size: int = 128
    """Model width: hidden dimension of every token's vector (``--hidden-size``)."""
    num_attention_heads: int = 4
    """Attention heads per layer (``--num-attention-heads``); head dim = hidden / heads."""
    ffn_hidden_size: int | None = None
    """Width of the MLP's inner layer (``--ffn-hidden-size``); None: 4 x hidden_size,
    Megatron-LM's default."""
    num_query_groups: int | None = None
    """Key/value groups for grouped-query attention (``--group-query-attention
    --num-query-groups``); None: one per head (multi-head attention)."""
    swiglu: bool = False
    """SwiGLU gated MLP instead of GeLU (``--swiglu``)."""
    untie_embeddings_and_output_weights: bool = False
    """Separate input embedding and output layer weights
    (``--untie-embeddings-and-output-weights``); default: one shared matrix."""
    attention_backend: str = "unfused"
    """``unfused`` (megatron-core's own: the s x s scores kept in memory) or ``flash``
    (torch SDPA's flash / memory-efficient kernels, CPU and CUDA; Transformer Engine's fused
    attention on CUDA when installed) (``--attention-backend``)."""
    seq_length: int = 128
    """Tokens per sequence (``--seq-length``)."""
    max_position_embeddings: int = 128
    """Longest sequence the position embeddings cover, in tokens
    (``--max-position-embeddings``); at least seq_length."""
    vocab_size: int = 4096
    """Tokenizer vocabulary in tokens, unpadded (``--vocab-size``); padded to a multiple of
    make_vocab_size_divisible_by x TP as Megatron-LM does (``padded_vocab_size``)."""
    make_vocab_size_divisible_by: int = 128
    """Padding multiple of the vocabulary before TP (``--make-vocab-size-divisible-by``)."""
    precision: str = "fp32"
    """Training precision: ``fp32``, ``bf16`` (``--bf16``) or ``fp16`` (``--fp16``); the CPU
    path trains in fp32 only."""
    recompute_granularity: str | None = None
    """Activation recomputation: None, ``selective`` (attention core only) or ``full`` (whole
    layers) (``--recompute-granularity``); trades compute for activation memory."""
    # --- schedule -------------------------------------------------------------------------------
    train_iters: int = 30
    """Iterations to train, one global batch each (``--train-iters``)."""
    lr: float = 1e-3
    """Peak learning rate, reached after warm-up (``--lr``)."""
    min_lr: float = 1e-4
    """Learning rate at the end of the cosine decay (``--min-lr``)."""
    lr_warmup_iters: int = 3
    """Iterations of linear warm-up from 0 to lr (``--lr-warmup-iters``)."""
    weight_decay: float = 0.01
    """AdamW weight decay coefficient (``--weight-decay``)."""
    clip_grad: float = 1.0
    """Largest global L2 norm of the gradients; larger ones are scaled down (``--clip-grad``)."""
    log_interval: int = 1
    """Iterations between two log lines (``--log-interval``)."""
    save_interval: int | None = None
    """Iterations between checkpoints (``--save-interval``), and one at the end; None: only
    at the end."""
    eval_interval: int | None = None
    """Iterations between validation passes (``--eval-interval``); None: no validation."""
    eval_iters: int = 2
    """Batches per validation pass (``--eval-iters``)."""
    seed: int = 1234
    """Random seed of initialisation and data order (``--seed``)."""
    # --- run ------------------------------------------------------------------------------------
    name: str = "run"
    """Folder under the run root (``runs/<name>/``) and the Slurm job name; letters, digits,
    ``.``, ``_``, ``-``. No Megatron-LM flag."""
    backend: str = "local"
    """Where the job runs: ``local`` (processes on this machine, the default), ``slurm``, or
    ``hostfile`` (the site's hosts over ssh, with pdsh or the DeepSpeed launcher)."""
    device: str = "cpu"
    """``cpu`` (gloo) or ``cuda`` (NCCL)."""
    gpu_memory_gb: float = 80.0
    """Memory of one GPU in GB (1e9 bytes), for the planner's fits / OOM prediction."""
    memory_limit_gb: float | None = None
    """Cap in GB (1e9 bytes) on what one training process may allocate; exceeding it is a real
    out-of-memory error. None: no cap."""
    data_path: str | None = None
    """Indexed dataset prefix, without ``.bin``/``.idx`` (``--data-path``); None: the repo's
    ``data/`` default corpus."""
    tokenizer_dir: str | None = None
    """Folder with ``vocab.json`` + ``merges.txt`` (Megatron-LM: ``--vocab-file``,
    ``--merge-file``); None: the one next to the default corpus."""
    # --- tools ----------------------------------------------------------------------------------
    torch_profiler: bool = False
    """Record torch.profiler traces of a few iterations to ``runs/<name>/profile/``
    (Megatron-LM: ``--profile --use-pytorch-profiler``; ``pretrain_gpt.py --profile``)."""
    torch_profiler_ranks: tuple[int, ...] = (0,)
    """Global ranks that record a trace when torch_profiler is on (``--profile-ranks``)."""
    torch_profiler_memory: bool = False
    """With torch_profiler: record iterations 1-2 instead of 3-5, with every allocation and free
    (``profile_memory=True``), for a memory timeline of the first steps
    (``labkit.measured.profiling.memory_timeline``; Megatron-LM: ``--record-memory-history`` on CUDA)."""
    nccl_debug: bool = False
    """Export NCCL_DEBUG=INFO in the job script (transport lines in the log)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form notes carried along (notebook, exercise); never read by the engine."""

    def __post_init__(self) -> None:
        if isinstance(self.torch_profiler_ranks, list):
            object.__setattr__(self, "torch_profiler_ranks", tuple(self.torch_profiler_ranks))
        problems, notes = check(self)
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
    def for_profile(cls, profile: str, *, cluster: Any = None, **overrides: Any) -> RunConfig:
        """A run for a notebook profile: ``cpu`` (tiny GPT, gloo) or ``gpu`` (GPT-2, NCCL, bf16).

        A run on GPUs takes the site's ``gpu_memory_gb`` and ``gpus_per_node`` from ``cluster``
        (a ClusterProfile, a YAML path or a name, as the entry point resolved it:
        ``labkit.site.resolve_cluster``; None: no site) where the site sets them; the profile's
        values (80 GB, 8 GPUs per node) are the defaults, and ``overrides`` win over both.
        """
        if profile not in PROFILES:
            raise ConfigError(f"unknown profile {profile!r}; profiles are: {', '.join(PROFILES)}")
        base = dict(PROFILES[profile])
        preset = base.pop("preset")
        if overrides.get("device", base.get("device")) == "cuda":
            site = as_profile(cluster)
            base.update(site.gpu_defaults() if site is not None else {})
        return cls.from_preset(preset, **{**base, **overrides})

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["torch_profiler_ranks"] = list(self.torch_profiler_ranks)
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
        """Read a config from a JSON string or a ``.json`` file.

        A ``config.json`` written before the profiler switch was named ``torch_profiler``
        (``"profile": true``, ``"profile_ranks"``) is read with the new names.
        """
        if not isinstance(text_or_path, (str, Path)):
            raise ConfigError(f"RunConfig.from_json takes a JSON string or a file path, not "
                              f"{type(text_or_path).__name__} ({text_or_path!r:.60})")
        s = str(text_or_path)
        what = "config"
        if not s.lstrip().startswith(("{", "[")):
            what = f"config file {text_or_path}"
            s = read_input(s, "config file")
        data = loads_json(s, what)
        if not isinstance(data, dict):
            raise ConfigError(f"{what} must be a JSON object {{\"field\": value, ...}}, got "
                              f"{type(data).__name__}")
        if isinstance(data.get("profile"), bool) and "torch_profiler" not in data:
            data["torch_profiler"] = data.pop("profile")
            if "profile_ranks" in data and "torch_profiler_ranks" not in data:
                data["torch_profiler_ranks"] = data.pop("profile_ranks")
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

# Fields with no Megatron-LM flag of their own (launcher, labkit, or a flag of another shape).
_NOT_MEGATRON = ("name", "nodes", "gpus_per_node", "backend", "device", "gpu_memory_gb",
                 "memory_limit_gb", "precision", "torch_profiler_ranks", "torch_profiler_memory",
                 "nccl_debug", "extra",
                 "tokenizer_dir")
# Fields whose Megatron-LM flag is not their name with dashes.
_MEGATRON_NAMED = {"torch_profiler": "--profile"}
# RunConfig field -> Megatron-LM command-line flag (bool fields are store_true flags).
MEGATRON_FLAGS = {
    name: _MEGATRON_NAMED.get(name, "--" + name.replace("_", "-"))
    for name in FIELD_NAMES
    if name not in _NOT_MEGATRON
}


# Short names people type for a field (the CLI's options, Megatron-LM's usual abbreviations).
_ALIASES = {"tp": "tensor_model_parallel_size", "pp": "pipeline_model_parallel_size",
            "vpp": "num_layers_per_virtual_pipeline_stage", "mbs": "micro_batch_size",
            "gbs": "global_batch_size", "layers": "num_layers", "heads": "num_attention_heads",
            "hidden": "hidden_size", "seq_len": "seq_length", "iters": "train_iters",
            "profile": "torch_profiler", "profile_ranks": "torch_profiler_ranks",
            "ffn_size": "ffn_hidden_size"}


def _did_you_mean(key: str) -> str | None:
    k = key.strip().lower().replace("-", "_")
    if k in ("dp", "data_parallel_size", "world_size"):
        return None  # derived, never set: said in the message
    if k in _ALIASES:
        return _ALIASES[k]
    close = difflib.get_close_matches(k, FIELD_NAMES, n=1, cutoff=0.75)
    return close[0] if close else None


def _reject_unknown(data: dict[str, Any]) -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"a RunConfig is built from a dict of fields, not {type(data).__name__}")
    bad_keys = [k for k in data if not isinstance(k, str)]
    if bad_keys:
        raise ConfigError(f"RunConfig field names are strings, not {bad_keys[:3]!r}")
    unknown = sorted(set(data) - set(FIELD_NAMES))
    if unknown:
        hints = []
        for key in unknown:
            close = _did_you_mean(key)
            if close:
                hints.append(f"{key!r} -> did you mean {close!r}?")
            elif key.lower() in ("dp", "data_parallel_size", "world_size"):
                hints.append(f"{key!r} is derived: world size = nodes x gpus_per_node, "
                             f"DP = world size / (TP x PP)")
        shown = [k[:40] for k in unknown[:5]] + (["..."] if len(unknown) > 5 else [])
        raise ConfigError(
            f"unknown RunConfig field(s): {shown}. "
            + (" ".join(hints) + " " if hints else "")
            + f"Valid fields are: {', '.join(FIELD_NAMES)}"
        )


def require_config(obj: Any, where: str) -> RunConfig:
    """``obj`` if it is a RunConfig, else a ConfigError that says how to make one."""
    if isinstance(obj, RunConfig):
        return obj
    how = {dict: "RunConfig.from_dict(d)", str: "RunConfig.from_json(PATH)",
           Path: "RunConfig.from_json(PATH)"}.get(type(obj), "RunConfig.from_preset('tiny', ...)")
    raise ConfigError(f"{where} needs a RunConfig, got {type(obj).__name__} {repr(obj)[:60]}; "
                      f"make one with {how}")
