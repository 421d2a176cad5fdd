"""The rules a RunConfig keeps, each broken one reported with its numbers and a fix.

``check(cfg)`` returns every broken rule at once (so a student fixes them in one go) and the
warnings that do not stop a run. ``divisors(n)`` is the one divisor list of labkit: the rules
quote it in their fixes and the planner sweeps layouts over it.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import MISSING, fields
from typing import Any, Protocol

from labkit.errors import ConfigError
from labkit.validate import text_problem

PRECISIONS = ("fp32", "bf16", "fp16")
RECOMPUTE = (None, "selective", "full")
ATTENTION_BACKENDS = ("unfused", "flash")
DEVICES = ("cpu", "cuda")
BACKENDS = ("local", "slurm", "hostfile")
# Precisions the CPU/gloo path of code/pretrain_gpt.py really trains with.
CPU_PRECISIONS = ("fp32",)
# \Z, not $: "$" also matches before a trailing newline. Use NAME_RE.fullmatch.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
# Bounds that keep every check and the planner's arithmetic quick; far above any real run.
MAX_INT = 10**9
MAX_NODES = 100_000
MAX_WORLD_SIZE = 2**20
MAX_SEED = 2**32 - 1
MAX_FLOAT = 1e9
BOOL_FIELDS = ("sequence_parallel", "use_distributed_optimizer", "swiglu",
               "untie_embeddings_and_output_weights", "torch_profiler", "torch_profiler_memory",
               "nccl_debug")

# Trial division stops here (at most ~5 x 10**5 steps whatever n is); a cofactor left above
# _TRIAL_LIMIT ** 2 is then a prime (Miller-Rabin says so) or too large to factorise.
_TRIAL_LIMIT = 1_000_000
# Miller-Rabin with these bases is exact below 3.3 x 10**24.
_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
# Divisors quoted in one message: enough to pick from, short enough to read.
SHOWN_DIVISORS = 12


def _is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin for n < 3.3 x 10**24 (larger n: False, i.e. not proven)."""
    if n < 2 or n >= 3_317_044_064_679_887_385_961_981:
        return False
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in _MR_BASES:
        if a % n == 0:
            continue
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _prime_factors(n: int) -> dict[int, int]:
    factors: dict[int, int] = {}
    rest, d = n, 2
    while d * d <= rest:
        if d > _TRIAL_LIMIT and _is_prime(rest):
            break
        if d > _TRIAL_LIMIT:
            raise ConfigError(f"cannot list the divisors of {n:,}: it has a factor {rest:,} with no "
                              f"divisor below {_TRIAL_LIMIT:,}; use a cluster (nodes x "
                              f"gpus_per_node) and a model of realistic size")
        while rest % d == 0:
            factors[d] = factors.get(d, 0) + 1
            rest //= d
        d += 1 if d == 2 else 2
    if rest > 1:
        factors[rest] = factors.get(rest, 0) + 1
    return factors


def divisors(n: int) -> list[int]:
    """The divisors of ``n >= 1``, smallest first (``divisors(12) == [1, 2, 3, 4, 6, 12]``).

    Factorises by trial division up to sqrt(n), stopping at 10**6: even a huge ``n`` answers at
    once, or raises ConfigError when a cofactor has two prime factors above 10**6. It never hangs.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"divisors of {n!r}: need an integer >= 1")
    out = [1]
    for prime, power in _prime_factors(n).items():
        out = [d * prime**k for d in out for k in range(power + 1)]
    return sorted(out)


def shown_divisors(n: int) -> str:
    """``divisors(n)`` for a message: at most SHOWN_DIVISORS of them, then how many more."""
    try:
        ds = divisors(n)
    except ConfigError:
        return f"(too many to list for {n:,})"
    if len(ds) <= SHOWN_DIVISORS:
        return str(ds)
    return f"{ds[:SHOWN_DIVISORS]} and {len(ds) - SHOWN_DIVISORS} more"


class RunFields(Protocol):
    """What the rules read of a run: ``labkit.config.RunConfig`` (which calls ``check`` when it
    is built) has these fields and layout properties; ``_types`` reads the integer fields by
    name."""

    name: str
    nodes: int
    gpus_per_node: int
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int | None
    num_layers_per_virtual_pipeline_stage: int | None
    sequence_parallel: bool
    seq_length: int
    max_position_embeddings: int
    micro_batch_size: int
    global_batch_size: int
    train_iters: int
    lr: float
    min_lr: float
    lr_warmup_iters: int
    precision: str
    device: str
    memory_limit_gb: float | None
    torch_profiler_ranks: tuple[int, ...]
    extra: dict[str, Any]

    @property
    def world_size(self) -> int: ...

    @property
    def tp(self) -> int: ...

    @property
    def pp(self) -> int: ...

    @property
    def query_groups(self) -> int: ...


def check(c: RunFields) -> tuple[list[str], list[str]]:
    """Every broken rule (with its numbers and a fix), and warnings that do not stop a run."""
    p = _types(c)
    notes: list[str] = []
    if p:  # the layout rules still run on the fields that are fine
        return p + _rules_without(c, p), notes
    ws, tp, pp = c.world_size, c.tp, c.pp
    if ws % (tp * pp):
        p.append(f"TP x PP = {tp} x {pp} = {tp * pp} does not divide world size {ws} "
                 f"(= nodes {c.nodes} x gpus_per_node {c.gpus_per_node}); "
                 f"choose TP x PP among the divisors of {ws}: {shown_divisors(ws)}")
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
                 f"PP must divide the layers: {shown_divisors(c.num_layers)}")
    p += _interleaving(c)
    heads, groups = c.num_attention_heads, c.query_groups
    if heads % tp:
        p.append(f"num_attention_heads {heads} is not divisible by TP {tp}; "
                 f"TP must divide the heads: {shown_divisors(heads)}")
    if c.hidden_size % heads:
        p.append(f"hidden_size {c.hidden_size} is not divisible by num_attention_heads {heads} "
                 f"(head dim would be {c.hidden_size / heads:.2f}); heads that divide it: "
                 f"{shown_divisors(c.hidden_size)}")
    if heads % groups:
        p.append(f"num_query_groups {groups} does not divide num_attention_heads {heads}")
    # Unset, num_query_groups is the head count: the heads rule above already says it all.
    if groups % tp and c.num_query_groups is not None:
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
    bad_ranks = [r for r in c.torch_profiler_ranks if not isinstance(r, int) or not 0 <= r < ws]
    if bad_ranks:
        p.append(f"torch_profiler_ranks {list(c.torch_profiler_ranks)} has ranks outside "
                 f"0..{ws - 1}: {bad_ranks}")
    p += _cpu_only(c)
    notes += fused_norms_missing(c)  # a warning here (planning elsewhere); code/pretrain_gpt.py stops
    if tp > c.gpus_per_node and ws % (tp * pp) == 0:
        notes.append(f"TP {tp} > gpus_per_node {c.gpus_per_node}: tensor-parallel groups cross "
                     f"nodes, so every layer all-reduces over the inter-node network (slow). "
                     f"Keep TP <= {c.gpus_per_node} and use PP or DP across nodes.")
    return p, notes


def _rules_without(c: RunFields, problems: list[str]) -> list[str]:
    """The layout rules for the fields the type rules accepted: each field a problem names
    (``name=value ...``) takes its default for the arithmetic, and a rule whose message names
    such a field is left out, so no message shows a number the user did not write."""
    bad = {m.split("=", 1)[0] for m in problems if "=" in m.split(" ", 1)[0]}
    if not bad:
        return []
    proxy = object.__new__(type(c))
    for f in fields(c):
        value = getattr(c, f.name)
        if f.name in bad:
            value = f.default if f.default is not MISSING else f.default_factory()
        object.__setattr__(proxy, f.name, value)
    try:
        more, _ = check(proxy)
    except Exception:  # noqa: BLE001 - a second opinion only; the type problems stand alone
        return []
    words = bad | {_SHORT[b] for b in bad if b in _SHORT}
    return [m for m in more if m not in problems and not any(
        re.search(rf"\b{re.escape(w)}\b", m) for w in words)]


# How the layout rules' messages also name some fields.
_SHORT = {"micro_batch_size": "micro", "global_batch_size": "global",
          "tensor_model_parallel_size": "TP", "pipeline_model_parallel_size": "PP",
          "num_layers": "layers", "nodes": "world size", "gpus_per_node": "world size"}


def _types(c: RunFields) -> list[str]:
    """Types and ranges first: the arithmetic of the layout rules needs positive ints."""
    p: list[str] = []
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
        top = MAX_SEED if n == "seed" else MAX_NODES if n == "nodes" else MAX_INT
        if isinstance(v, bool) or not isinstance(v, int):
            p.append(f"{n}={v!r:.60} must be an integer")
        elif v <= 0 and n != "seed":
            p.append(f"{n}={v if v.bit_length() < 100 else 'a huge negative'} must be "
                     f"positive (> 0)")
        elif v < 0 or v > top:
            p.append(f"{n}={v if v.bit_length() < 100 else 'a huge number'} must be between "
                     f"{0 if n == 'seed' else 1} and {top:,}")
    for n in ("lr", "min_lr", "weight_decay", "clip_grad", "gpu_memory_gb"):
        v = getattr(c, n)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= MAX_FLOAT:
            p.append(f"{n}={v!r:.60} must be a finite number between 0 and {MAX_FLOAT:g}")
    v = c.memory_limit_gb
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                          or not 0 < v <= MAX_FLOAT):
        p.append(f"memory_limit_gb={v!r:.60} must be a positive finite number (GB) or None")
    v = c.lr_warmup_iters
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_INT:
        p.append(f"lr_warmup_iters={v!r:.60} must be an integer between 0 and {MAX_INT:,}")
    for n, allowed in (("precision", PRECISIONS), ("recompute_granularity", RECOMPUTE),
                       ("attention_backend", ATTENTION_BACKENDS), ("device", DEVICES),
                       ("backend", BACKENDS)):
        v = getattr(c, n)
        if not any(v is a or (type(v) is str and v == a) for a in allowed):
            p.append(f"{n}={v!r:.60} is not one of {list(allowed)}")
    for n in BOOL_FIELDS:
        v = getattr(c, n)
        if not isinstance(v, bool):
            p.append(f"{n}={v!r:.60} must be True or False (JSON true/false, not a string "
                     f"or a number)")
    ranks = c.torch_profiler_ranks
    if not isinstance(ranks, tuple) or not ranks or len(ranks) > 1024 or any(
            isinstance(r, bool) or not isinstance(r, int) for r in ranks):
        p.append(f"torch_profiler_ranks={ranks!r:.60} must be a list of rank numbers, e.g. [0]")
    for n in ("data_path", "tokenizer_dir"):
        v = getattr(c, n)
        why = None if v is None else text_problem(n, v)
        if why:
            p.append(why)
    if not isinstance(c.extra, dict):
        p.append(f"extra={c.extra!r:.60} must be a mapping (free-form notes)")
    if not isinstance(c.name, str) or not NAME_RE.fullmatch(c.name):
        p.append(f"name={c.name!r:.80} must be 1-64 letters, digits, '.', '_' or '-' (it names "
                 f"the folder runs/<name>/ and the Slurm job), e.g. 'tp2_pp2'")
    if not p and c.nodes * c.gpus_per_node > MAX_WORLD_SIZE:
        p.append(f"world size nodes {c.nodes} x gpus_per_node {c.gpus_per_node} = "
                 f"{c.nodes * c.gpus_per_node:,} is more than {MAX_WORLD_SIZE:,} ranks; use a "
                 f"real cluster's size")
    return p


def _interleaving(c: RunFields) -> list[str]:
    vs, pp = c.num_layers_per_virtual_pipeline_stage, c.pp
    if not vs:
        return []
    if pp == 1:
        return [f"num_layers_per_virtual_pipeline_stage={vs} (interleaving) needs PP > 1, "
                f"but PP = 1; set pipeline_model_parallel_size >= 2 or drop interleaving"]
    if c.num_layers % (pp * vs):
        return [f"num_layers {c.num_layers} is not divisible by PP {pp} x "
                f"num_layers_per_virtual_pipeline_stage {vs} = {pp * vs}"]
    if c.num_layers // (pp * vs) < 2:
        return [f"num_layers_per_virtual_pipeline_stage={vs} gives {c.num_layers} / "
                f"({pp} x {vs}) = 1 virtual stage: that is no interleaving; use a smaller "
                f"value (e.g. {c.num_layers // (2 * pp)}) or None"]
    return []


def _cpu_only(c: RunFields) -> list[str]:
    if c.device != "cpu":
        return []
    p = []
    if c.precision not in CPU_PRECISIONS:
        p.append(f"precision={c.precision!r} does not run on device='cpu' (the CPU path "
                 f"trains in {list(CPU_PRECISIONS)}); use precision='fp32' or device='cuda'")
    if c.sequence_parallel:
        p.append("sequence_parallel=True needs Transformer Engine or Apex layer norms "
                 "(GPU only); set sequence_parallel=False on device='cpu'")
    return p


def fused_norms_missing(c: RunFields) -> list[str]:
    """sequence_parallel on CUDA where neither Transformer Engine nor Apex is importable:
    megatron-core's torch LayerNorm refuses it at model build; TE's and Apex's take it."""
    if c.device != "cuda" or not c.sequence_parallel or importlib.util.find_spec("transformer_engine") \
            or importlib.util.find_spec("apex"):
        return []
    return ["sequence_parallel=True needs Transformer Engine or Apex (their LayerNorms split the "
            "sequence; megatron-core's torch LayerNorm does not), and neither is installed here; "
            "pip install transformer_engine[pytorch] on the GPU nodes, or set "
            "sequence_parallel=False"]
