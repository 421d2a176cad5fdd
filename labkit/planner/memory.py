"""Parameters and memory per pipeline stage, in GB (1e9 bytes), for one rank of a layout.

Model: megatron-core's ``GPTModel`` with the local layer spec and Megatron-LM's defaults (what
``code/pretrain_gpt.py`` builds): learned absolute position embeddings, LayerNorm (weight and
bias), biases on every linear layer, GELU MLP or SwiGLU (``fc1`` twice as wide), grouped-query
attention, vocabulary padded to a multiple of ``make_vocab_size_divisible_by x TP``.

Per rank and stage:

* weights: the stage's parameters in the training precision (4 bytes fp32, 2 bytes bf16/fp16);
* gradients: fp32 main grads (4 bytes), megatron's DDP grad buffer, never sharded;
* optimizer: Adam's two fp32 moments (8 bytes) plus, in bf16/fp16, fp32 master weights
  (4 bytes); the distributed optimizer shards these over DP, as megatron does;
* activations: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
  Models", section 4), generalised; per layer and microbatch, with e bytes per activation
  element: LayerNorm inputs 2·sbh·e, QKV input sbh·e, Q and K s·b·(h+kv)·e, V s·b·kv·e,
  attention probabilities a·s²·b (fp32 softmax, plus a half copy in bf16/fp16), projection
  input sbh·e, fc1 input sbh·e, fc1 output sb·f1·e, activation output sbf·e (SwiGLU: + sbf·e).
  ``code/pretrain_gpt.py`` trains without dropout, so no masks are kept; with dropout (1-byte
  masks, e = 2, half softmax, kv = h, f = 4h) the same count is Korthikanti's
  34·sbh + 5·a·s²·b. TP divides what it splits; sequence parallel divides the rest too. The s²
  term goes with selective recompute or flash attention; full recompute keeps one layer input
  per layer plus one layer's working set.
  The first stage holds the most microbatches in flight: min(m, p - r) under 1F1B; under the
  interleaved schedule megatron's warm-up (2·(p - r - 1) + (v - 1)·p + 1 chunk microbatches).
  The first stage also keeps the token and position ids (int64) of its in-flight microbatches;
* start-up: what stays allocated besides those three (megatron-core's attention score buffer
  with unfused attention, library workspaces on CUDA; ``startup_bytes``). Weights, gradients,
  optimizer and start-up are the *static* memory, allocated between iterations;
* logits (last stage): megatron-core's vocab-parallel cross entropy works in place on an fp32
  copy of the logits (s·b·V/t x 4 bytes), which later holds their gradient; in bf16/fp16 the
  output layer's half-precision logits live beside it (s·b·V/t x 2).

``fits`` compares the peak stage with the memory limit after a margin: x 1.10 for the
allocator's fragmentation and temporaries, plus the process's fixed cost (CUDA context,
cuBLAS/NCCL workspaces: 1.0 GB on ``cuda``; interpreter + torch + megatron-core: 0.5 GB on
``cpu``). On ``cpu`` with ``memory_limit_gb`` set, the limit is that budget, which
``code/pretrain_gpt.py`` applies on top of the process after the model and optimizer are
built: it is compared with what is allocated later (optimizer moments, activations, logits)
x 1.10, plus ``CPU_CAP_OVERHEAD_GB`` (0.6 GB, measured) for what the address space grows by
beyond the tensors. That cap is on address space (RLIMIT_AS), which also counts thread stacks
and malloc arenas, so near the limit the CPU prediction is rougher than the GPU one.

Where this differs from Megatron-LM's ``megatron/training/theoretical_memory_usage.py``, and why:

* it counts 18 bytes/parameter (bf16 weights + fp32 grads + fp32 master + Adam) whatever the
  precision; here fp32 runs (our CPU profile) count 4 + 4 + 8, without a master copy;
* its "most loaded shard" adds the embedding to the first stage's layers; here the first and
  the last stage are computed separately (position embeddings, final LayerNorm and, with tied
  embeddings and PP > 1, the output layer's copy of the word embeddings on the last stage);
* its activation formula is Table 2 for hidden-sized attention (its own TODO); here GQA's
  smaller K/V, SwiGLU's wider fc1, ffn_hidden_size and fp32 activations are counted;
* it adds logits only when PP = 1 and as 4·sbh·(1 + V/h) bytes; here the last stage always
  carries the logits, sized after the in-place cross entropy described above;
* it applies the interleaving penalty 1 + (p-1)/(p·v) and min(1, m/p) as factors; here the
  in-flight count per pipeline rank follows the schedules' warm-up counts (the same for rank 0
  when m is large, smaller when m is small);
* it has no fits / margin; its 5 % "miscellaneous" overhead is replaced by the margin above.
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from labkit.config import RunConfig

GB = 1e9
ALLOCATOR_FACTOR = 1.10
"""Headroom for the allocator's fragmentation and short-lived temporaries."""
CPU_CAP_OVERHEAD_GB = 0.6
"""Address space a CPU training process adds after the engine sets its RLIMIT_AS cap beyond
what the planner counts: glibc heap fragmentation and the stacks and 64 MB malloc arenas of
threads started later. Measured with code/pretrain_gpt.py (3 iterations): a TP=2 run the
planner puts at 0.76 GB needed a budget in (1.0, 1.4] GB; a PP=2 run put at 0.41 GB one in
(1.0, 1.3] GB, i.e. 0.24-0.89 GB more; 0.6 GB fits both. Checked on the ``cpu`` profile's tiny
GPT (1 node x 2, DP 2) under a 1.0 GB budget: micro batch 32 (planned 0.875 GB) trained,
128 (planned 1.66 GB) ran out of memory; under 0.1 GB even micro batch 1 failed ("can't start
new thread": thread stacks count against RLIMIT_AS)."""
CONTEXT_GB = {"cuda": 1.0, "cpu": 0.5}
"""Fixed per-process cost outside PyTorch's allocator: CUDA context, NCCL buffers and library
memory not allocated through torch, or interpreter + libraries."""
CUDA_WORKSPACES_GB = 0.1
"""What PyTorch's CUDA allocator holds at start-up besides megatron-core's tensors: cuBLAS /
cuBLASLt workspaces (PyTorch allocates one per handle and stream through its caching
allocator: ~8 MiB before Hopper, 32 MiB on Hopper, by default) and Transformer Engine's GEMM
workspaces. Calibrated on Megatron-LM's measured ``mem-allocated-bytes`` (tests/
test_planner_published.py): the count of weights, gradients and optimizer state falls short by
0.084 GB (A100, 12 layers, hidden 512) and 0.117 GB (H100, 7B, TP 4) there."""

_ACT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}

ATTENTION_KERNELS = {
    "local": "megatron-core DotProductAttention (unfused: s x s scores, softmax in memory)",
    "sdpa": "torch scaled_dot_product_attention (flash / memory-efficient kernels)",
    "te": "Transformer Engine DotProductAttention (fused / flash kernels)",
}
"""The core attention ``code/pretrain_gpt.py`` can build, by ``attention_kernel``'s answer."""


def transformer_engine_installed() -> bool:
    """Whether Transformer Engine can be imported here (never needed; used when present)."""
    return importlib.util.find_spec("transformer_engine") is not None


def attention_kernel(cfg: RunConfig, *, transformer_engine: bool | None = None) -> str:
    """The core attention the engine builds for ``cfg``: ``local``, ``sdpa`` or ``te``.

    The one decision both the engine (which module it puts in the layer spec) and the planner
    (whether the s x s score matrix is kept for backward) follow. ``attention_backend``
    ``unfused`` is megatron-core's own unfused attention; ``flash`` is Transformer Engine's fused
    attention on CUDA when it is installed, else torch's ``scaled_dot_product_attention``
    (FlashAttention-2 or memory-efficient kernels on CUDA; a flash kernel on CPU too).
    """
    if cfg.attention_backend == "unfused":
        return "local"
    if transformer_engine is None:
        transformer_engine = transformer_engine_installed()
    return "te" if transformer_engine and cfg.device == "cuda" else "sdpa"


def keeps_attention_scores(kernel: str) -> bool:
    """True when the kernel keeps the s x s probabilities for backward (unfused attention)."""
    return kernel == "local"


def element_bytes(precision: str) -> int:
    """Bytes per weight / activation element in a training precision."""
    return _ACT_BYTES[precision]


# --- parameters ------------------------------------------------------------------------------
def _dims(cfg: RunConfig) -> tuple[int, int, int, int, int, int]:
    h, a = cfg.hidden_size, cfg.num_attention_heads
    kv = cfg.query_groups * (h // a)  # K (or V) width: query groups x head dim
    f = cfg.ffn_size
    f1 = 2 * f if cfg.swiglu else f  # fc1 computes gate and value halves under SwiGLU
    return h, a, kv, f, f1, cfg.tp


def layer_params(cfg: RunConfig, tp: int | None = None) -> int:
    """Parameters of one transformer layer on one TP rank (of ``tp``, default the config's)."""
    h, _, kv, f, f1, t = _dims(cfg)
    t = tp or t
    qkv = (h + 2 * kv) // t * (h + 1)  # column parallel: weight rows and bias split
    proj = h * (h // t) + h  # row parallel: weight columns split, bias whole
    fc1 = f1 // t * (h + 1)
    fc2 = h * (f // t) + h
    norms = 2 * 2 * h  # input_layernorm and pre_mlp_layernorm, weight + bias
    return qkv + proj + fc1 + fc2 + norms


def stage_params(cfg: RunConfig, pp_rank: int) -> int:
    """Parameters on one TP rank of pipeline rank ``pp_rank`` (all its virtual chunks)."""
    h, t, p = cfg.hidden_size, cfg.tp, cfg.pp
    vocab_shard = cfg.padded_vocab_size // t * h
    n = cfg.num_layers // p * layer_params(cfg)
    if pp_rank == 0:
        n += vocab_shard + cfg.max_position_embeddings * h  # word + position embeddings
    if pp_rank == p - 1:
        n += 2 * h  # final LayerNorm
        # The output layer: its own weight when untied; with tied embeddings and PP > 1 the
        # last stage keeps a copy of the word embeddings (kept equal by an all-reduce).
        if cfg.untie_embeddings_and_output_weights or p > 1:
            n += vocab_shard
    return n


def param_counts(cfg: RunConfig) -> dict[tuple[int, int], int]:
    """Parameters per (tp_rank, pp_rank), as each rank's ``sum(p.numel())`` counts them."""
    per_stage = [stage_params(cfg, r) for r in range(cfg.pp)]
    return {(t, r): per_stage[r] for r in range(cfg.pp) for t in range(cfg.tp)}


def total_params(cfg: RunConfig) -> int:
    """Distinct parameters of the whole model (tied embeddings counted once)."""
    h, vp = cfg.hidden_size, cfg.padded_vocab_size  # padded as at the config's TP
    embeddings = vp * h * (2 if cfg.untie_embeddings_and_output_weights else 1)
    return (cfg.num_layers * layer_params(cfg, tp=1) + embeddings
            + cfg.max_position_embeddings * h + 2 * h)


# --- activations -----------------------------------------------------------------------------
def activation_bytes_per_layer(cfg: RunConfig, *, recompute: str | None = "config",
                               dropout: bool = False, fused_softmax: bool = False) -> float:
    """Bytes one transformer layer keeps for backward, per microbatch, on one TP rank.

    Args:
        recompute: defaults to the config's granularity; None for no recompute.
        dropout: count dropout masks and outputs (Korthikanti's setting). ``code/pretrain_gpt.py``
            trains without dropout, where torch keeps neither.
        fused_softmax: a fused softmax kernel (Transformer Engine, Apex; Megatron-LM's default
            on GPUs) saves the probabilities in bf16/fp16. The plain PyTorch path that
            ``code/pretrain_gpt.py`` uses runs the softmax in fp32 (``attention_softmax_in_fp32``)
            and keeps it, plus a half-precision copy for the product with V.
    """
    rc = cfg.recompute_granularity if recompute == "config" else recompute
    h, a, kv, f, f1, t = _dims(cfg)
    s, b, e = cfg.seq_length, cfg.micro_batch_size, element_bytes(cfg.precision)
    sp = cfg.sequence_parallel
    if rc == "full":  # only the layer's input survives the forward pass
        return s * b * h * e / (t if sp else 1)
    # Q, K and V (views of the QKV output), projection input, fc1 output, activation output;
    # SwiGLU also keeps silu(gate) for the product with the value half.
    split = e * ((h + kv) + kv + h + f1 + f + (f if cfg.swiglu else 0))
    unsplit = e * 4 * h  # LayerNorm inputs, QKV and fc1 inputs (LayerNorm outputs)
    if dropout:
        unsplit += 2 * h  # 1-byte masks after the projection and after fc2
    per_token = split / t + (unsplit / t if sp else unsplit)
    total = s * b * per_token
    if rc != "selective":
        if not keeps_attention_scores(attention_kernel(cfg)):
            total += 4 * a * s * b / t  # only the softmax statistics (fp32) are kept
        else:
            softmax = 4 if (not fused_softmax and e < 4) else e
            copy = e if softmax != e else 0  # the half-precision probabilities for softmax·V
            masks = (1 + e) if dropout else 0  # dropout mask and dropped probabilities
            total += (softmax + copy + masks) * a * s * s * b / t
    return total


def in_flight_microbatches(cfg: RunConfig, pp_rank: int) -> int:
    """Microbatches (of one model chunk) whose activations pipeline rank ``pp_rank`` holds at
    its peak: the schedule's warm-up forwards plus the one in its steady 1F1B step."""
    p, v, m = cfg.pp, cfg.vpp, cfg.num_microbatches
    if p == 1:
        return 1  # forward and backward of one microbatch at a time
    if v == 1:
        return min(m, p - pp_rank)
    return min(m * v, 2 * (p - pp_rank - 1) + (v - 1) * p + 1)


@dataclass(frozen=True)
class StageMemory:
    """Memory of one rank of a pipeline stage, in GB (1e9 bytes)."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    logits: float
    startup: float = 0.0
    """What megatron-core and the libraries allocate besides weights, gradients and optimizer
    state and keep for the whole run (see ``startup_bytes``)."""

    @property
    def static(self) -> float:
        """Allocated between iterations: weights, gradients, optimizer state, start-up buffers."""
        return self.weights + self.gradients + self.optimizer + self.startup

    @property
    def total(self) -> float:
        return self.static + self.activations + self.logits

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}


def stage_memory(cfg: RunConfig, pp_rank: int, *, dropout: bool = False,
                 fused_softmax: bool = False, transformer_engine: bool = False) -> StageMemory:
    """Weights, gradients, optimizer, activations and logits of one rank of stage ``pp_rank``.

    ``dropout`` and ``fused_softmax`` describe a Megatron-LM run (dropout 0.1, fused kernels)
    rather than ``code/pretrain_gpt.py`` (no dropout, PyTorch softmax); see
    ``activation_bytes_per_layer``; ``transformer_engine`` a run on Transformer Engine's layers
    (see ``startup_bytes``).
    """
    knobs = {"dropout": dropout, "fused_softmax": fused_softmax}
    n = stage_params(cfg, pp_rank)
    e = element_bytes(cfg.precision)
    adam = 8 + (4 if e < 4 else 0)  # moments, plus fp32 master weights in mixed precision
    if cfg.use_distributed_optimizer:
        adam /= cfg.dp
    s, b, h, t = cfg.seq_length, cfg.micro_batch_size, cfg.hidden_size, cfg.tp
    sp_div = t if cfg.sequence_parallel else 1
    p, v = cfg.pp, cfg.vpp
    layers_per_chunk = cfg.num_layers // (p * v)
    chunks = in_flight_microbatches(cfg, pp_rank)
    act = chunks * layers_per_chunk * activation_bytes_per_layer(cfg, **knobs)
    if cfg.recompute_granularity == "full":  # one layer is re-run at a time, fully stored
        act += activation_bytes_per_layer(cfg, recompute=None, **knobs)
    if pp_rank == 0:  # token ids and position ids (int64), per microbatch in flight
        first_chunk = min(cfg.num_microbatches, -(-chunks // v) if v > 1 else chunks)
        act += first_chunk * s * b * 16
    logits = 0.0
    if pp_rank == p - 1:
        act += 2 * s * b * h * e / sp_div  # final LayerNorm input, output layer input
        v_shard = cfg.padded_vocab_size / t
        logits = s * b * v_shard * (4 + (e if e < 4 else 0))
    return StageMemory(weights=n * e / GB, gradients=n * 4 / GB, optimizer=n * adam / GB,
                       activations=act / GB, logits=logits / GB,
                       startup=startup_bytes(cfg, pp_rank,
                                             transformer_engine=transformer_engine) / GB)


def startup_bytes(cfg: RunConfig, pp_rank: int, *, transformer_engine: bool = False) -> float:
    """Bytes allocated besides weights, gradients and optimizer state that stay for the run.

    * megatron-core's unfused ``DotProductAttention`` computes the scores into its global memory
      buffer (``parallel_state.get_global_memory_buffer()``, b x a/t x s x s elements in the
      activation dtype), allocated at the first forward pass and kept: 67 MB at micro batch 4,
      8 heads, s = 1024 in bf16. Measured on CPU (every live tensor after a step of
      code/pretrain_gpt.py's model: exactly weights + grad buffer + optimizer + this buffer).
      Transformer Engine's attention (``transformer_engine=True``) does not use it.
    * on CUDA, ``CUDA_WORKSPACES_GB`` for library workspaces inside PyTorch's allocator.

    megatron-core's DDP grad (and, with the distributed optimizer, param) buffer pads each
    bucket to a multiple of lcm(DP, 128) elements and each parameter to 64: a few KB, not
    counted.
    """
    n = 0.0
    if attention_kernel(cfg) == "local" and not transformer_engine:
        a, s = cfg.num_attention_heads // cfg.tp, cfg.seq_length
        n += cfg.micro_batch_size * a * s * s * element_bytes(cfg.precision)
    if cfg.device == "cuda":
        n += CUDA_WORKSPACES_GB * GB
    return n


def memory_limit_gb(cfg: RunConfig) -> float:
    """The memory one rank may use: ``memory_limit_gb`` when set, else ``gpu_memory_gb``.

    On ``cuda`` the engine's cap is on PyTorch's allocator (never above the GPU's memory)."""
    if cfg.memory_limit_gb is not None:
        if cfg.device == "cuda":
            return min(float(cfg.memory_limit_gb), float(cfg.gpu_memory_gb))
        return float(cfg.memory_limit_gb)
    return float(cfg.gpu_memory_gb)


def required_gb(cfg: RunConfig, *stages: StageMemory) -> float:
    """What ``fits`` compares with the limit: the largest stage plus the documented margin.

    On ``cuda`` with ``memory_limit_gb`` below the GPU's memory, the cap
    (``torch.cuda.set_per_process_memory_fraction``) sees PyTorch's allocations only, so the
    context is not added. On ``cpu`` with ``memory_limit_gb`` the engine caps the address
    space on top of the process as it is after building the model and the optimizer, so only
    what comes later counts:
    Adam's moments (allocated at the first step), the start-up buffers of the first forward
    pass, activations and logits.
    """
    if cfg.device == "cpu" and cfg.memory_limit_gb is not None:
        later = max(st.optimizer + st.startup + st.activations + st.logits for st in stages)
        return later * ALLOCATOR_FACTOR + CPU_CAP_OVERHEAD_GB
    peak = max(st.total for st in stages) * ALLOCATOR_FACTOR
    if cfg.device == "cuda" and cfg.memory_limit_gb is not None \
            and cfg.memory_limit_gb < cfg.gpu_memory_gb:
        return peak  # the cap counts PyTorch's allocator only: the CUDA context is outside it
    return peak + CONTEXT_GB[cfg.device]
