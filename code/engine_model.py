"""Model side of code/pretrain_gpt.py: megatron-core GPTModel chunks, DDP, optimizer, LR schedule.

Everything here is megatron-core's own classes; this file only maps a ``RunConfig`` onto them
in one visible place, plus one labkit addition: ``layout_invariant_init``, which gives every
weight the same values whatever the TP/PP layout (see its docstring for why).

In bf16/fp16 each chunk is wrapped in megatron-core's ``Float16Module`` as Megatron-LM's
``get_model`` does: every parameter and buffer (position embeddings and torch LayerNorms
included) is cast to the half type, and the first stage's inputs with them, so the residual
stream never meets a weight of another dtype.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import torch
from megatron.core import parallel_state as ps
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.distributed.finalize_model_grads import finalize_model_grads
from megatron.core.models.gpt import GPTModel
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.module import Float16Module

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def transformer_config(cfg: Any, on_cuda: bool) -> TransformerConfig:
    """The RunConfig -> megatron-core TransformerConfig mapping (one place, Megatron's names)."""
    dtype = DTYPES[cfg.precision]
    return TransformerConfig(
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        num_query_groups=cfg.num_query_groups,
        ffn_hidden_size=cfg.ffn_size,
        gated_linear_unit=cfg.swiglu,
        activation_func=torch.nn.functional.silu if cfg.swiglu else torch.nn.functional.gelu,
        # No dropout: every layout then computes the same function, so TP=1/TP=2/PP=2 agree.
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=cfg.tp,
        pipeline_model_parallel_size=cfg.pp,
        virtual_pipeline_model_parallel_size=cfg.vpp if cfg.vpp > 1 else None,
        sequence_parallel=cfg.sequence_parallel,
        pipeline_dtype=dtype,
        params_dtype=dtype,
        bf16=cfg.precision == "bf16",
        fp16=cfg.precision == "fp16",
        recompute_granularity=cfg.recompute_granularity,
        recompute_method="uniform" if cfg.recompute_granularity == "full" else None,
        recompute_num_layers=1 if cfg.recompute_granularity == "full" else None,
        use_cpu_initialization=True,
        # megatron's init also marks which weights are TP-sharded (partition_dim/stride);
        # layout_invariant_init then overwrites the values.
        perform_initialization=True,
        # The fusions that need Apex or Transformer Engine stay off; those megatron-core
        # compiles itself with torch.compile are on under CUDA (``fusions``).
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        **fusions(on_cuda),
        init_method_std=0.02,
        # With PP=2 and interleaving, a rank's previous and next stage are the same peer.
        # Batched p2p posts (send prev, recv prev, send next, recv next) and the backend may
        # match messages between two peers in posting order, so activations and gradients
        # swap (seen with gloo; reported for NCCL in Megatron-LM's tracker). The unbatched
        # path orders sends/receives by even/odd rank and stays matched, on CPU and CUDA alike.
        **p2p_mode(cfg),
        # The pipeline frees each sent activation's data (only its autograd graph is needed).
        deallocate_pipeline_outputs=True,
    )


def fusions(on_cuda: bool) -> dict[str, Any]:
    """megatron-core's fused element-wise kernels that need neither Apex nor Transformer Engine:
    its ``megatron.core.jit.jit_fuser`` is ``torch.compile`` (torch >= 2.2), which generates one
    Triton kernel per fused function. Bias + GELU (tanh approximation, as Megatron-LM trains;
    bias + SwiGLU with ``swiglu``), bias + dropout + residual add, and the vocab-parallel cross
    entropy (``cross_entropy_fusion_impl='native'``). On CUDA only, where the throughput is
    measured; on CPU the plain PyTorch paths are the ones the lessons read (and Inductor would
    need a C++ compiler there).

    Off unless ``LABKIT_FUSIONS=1``: on one H100 (torch 2.11, megatron-core 0.16.1, no Transformer
    Engine) they made the median iteration slower, not faster: GPT-2 124M 398 -> 525 ms, the
    350M-class GPT 357 -> 472 ms, with 1.6 GB more peak memory than the planner counts
    (benchmarks/README.md, "GPU check")."""
    from engine_memory import run_switch

    on = bool(on_cuda and run_switch("LABKIT_FUSIONS", default=False))
    return {"bias_activation_fusion": on, "bias_dropout_fusion": on,
            "cross_entropy_loss_fusion": on, "cross_entropy_fusion_impl": "native"}


def fusions_line(tcfg: TransformerConfig) -> str:
    """Which of ``fusions`` this run uses, for the log."""
    if not tcfg.bias_activation_fusion:
        return "fusions: none (plain PyTorch element-wise ops)"
    act = "SwiGLU" if tcfg.gated_linear_unit else "GELU"
    return (f"fusions: bias-{act}, bias-dropout-add, cross entropy (megatron-core, torch.compile); "
            f"none from Apex or Transformer Engine")


def p2p_mode(cfg: Any) -> dict[str, bool]:
    """Pipeline p2p settings, the same on every device: unbatched and waited for.

    Megatron-LM's default for interleaving, ``overlap_p2p_comm=True``, leaves a forward and a
    backward message to the same peer in flight together; with PP=2 on gloo that gave a
    different loss from iteration 1 (8.3192 against 8.3056 for PP=1, measured), so it stays off
    here too: the CPU tests then prove the exact settings a GPU run uses.
    """
    return {"batch_p2p_comm": False, "overlap_p2p_comm": False}


def overlap_param_gather(cfg: Any) -> bool:
    """The distributed optimizer's parameter all-gather overlapped with the next forward pass.

    megatron-core needs the distributed optimizer and ``overlap_grad_reduce`` for it (as
    Megatron-LM's argument checks say); it then all-gathers each bucket's updated parameters
    asynchronously, started by forward pre-hooks (bucket by bucket, the next one dispatched
    while the current one's layers compute), instead of all at once at the end of the optimizer
    step. On every device (gloo included, where the CPU tests prove it). Set
    ``LABKIT_OVERLAP_PARAM_GATHER=0`` to gather synchronously, for comparisons.
    """
    import os

    wanted = os.environ.get("LABKIT_OVERLAP_PARAM_GATHER", "1") not in ("0", "false")
    return bool(wanted and cfg.use_distributed_optimizer and cfg.dp > 1)


def ddp_config(cfg: Any) -> DistributedDataParallelConfig:
    """megatron-core DDP settings: with DP > 1 gradients are reduced in buckets during backward,
    and the distributed optimizer's parameter all-gather overlaps the next forward pass."""
    return DistributedDataParallelConfig(
        grad_reduce_in_fp32=cfg.precision != "fp32",
        overlap_grad_reduce=cfg.dp > 1,
        overlap_param_gather=overlap_param_gather(cfg),
        use_distributed_optimizer=cfg.use_distributed_optimizer,
    )


def overlap_line(cfg: Any) -> str:
    """What the DP communication overlaps, for the log."""
    if cfg.dp == 1:
        return "data parallel: DP=1, no gradient reduction or parameter gather"
    grads = ("reduce-scatter" if cfg.use_distributed_optimizer else "all-reduce")
    line = f"data parallel: gradient {grads} overlapped with backward (bucketed)"
    if cfg.use_distributed_optimizer:
        line += ("; parameter all-gather " + ("overlapped with the next forward (bucketed)"
                                             if overlap_param_gather(cfg)
                                             else "synchronous after the optimizer step"))
    return line


def init_model_parallel(cfg: Any) -> None:
    """megatron-core's process groups for this layout, with the engine's collective timeout
    (``engine_memory.dist_timeout``, as for WORLD; megatron's own default is 30 minutes)."""
    from engine_memory import dist_timeout

    ps.initialize_model_parallel(cfg.tp, cfg.pp, cfg.vpp if cfg.vpp > 1 else None,
                                 distributed_timeout_minutes=dist_timeout().total_seconds() / 60)


def sync_params(model: list[torch.nn.Module]) -> None:
    """Finish the parameter all-gather now (before a checkpoint is written): with the gather
    overlapped, a rank's copy of the parameters it does not own is stale until the next
    forward pass gathers it (Megatron-LM does the same before saving)."""
    for m in model:
        if getattr(m, "use_forward_hook", False):
            m.start_param_sync(force_sync=True)


def build_model(cfg: Any, on_cuda: bool) -> tuple[list[torch.nn.Module], TransformerConfig]:
    """GPTModel chunks for this rank (one per virtual stage), initialised, wrapped in DDP."""
    from engine_attention import layer_spec

    tcfg = transformer_config(cfg, on_cuda)
    spec, _ = layer_spec(cfg)
    chunks: list[torch.nn.Module] = []
    vpp = cfg.vpp if cfg.vpp > 1 else None
    for vp_stage in range(cfg.vpp):
        stage = vp_stage if vpp else None
        model = GPTModel(
            config=tcfg,
            transformer_layer_spec=spec,
            vocab_size=cfg.padded_vocab_size,
            max_sequence_length=cfg.max_position_embeddings,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage),
            share_embeddings_and_output_weights=not cfg.untie_embeddings_and_output_weights,
            position_embedding_type="learned_absolute",
            vp_stage=stage,
        )
        layout_invariant_init(model, cfg.seed, cfg.num_layers)
        if on_cuda:
            model.cuda(torch.cuda.current_device())
        if tcfg.fp16 or tcfg.bf16:
            model = Float16Module(tcfg, model)
        chunks.append(model)
    wrapped = [DistributedDataParallel(config=tcfg, ddp_config=ddp_config(cfg), module=m,
                                       disable_bucketing=(i > 0))
               for i, m in enumerate(chunks)]
    for m in wrapped:
        m.broadcast_params()  # DP replicas start from the same weights
    return wrapped, tcfg


def _seed_for(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little")


def _global_name(model: torch.nn.Module, local_name: str) -> str:
    """``decoder.layers.<local>.`` -> ``decoder.layers.<global>.`` (layer_number is 1-based)."""
    parts = local_name.split(".")
    if parts[:2] == ["decoder", "layers"]:
        layer = model.decoder.layers[int(parts[2])]
        parts[2] = str(layer.layer_number - 1)
    name = ".".join(parts)
    # The tied output layer on the last stage is a copy of the input embedding.
    if name == "output_layer.weight" and model.share_embeddings_and_output_weights:
        name = "embedding.word_embeddings.weight"
    return name


@torch.no_grad()
def layout_invariant_init(model: torch.nn.Module, seed: int, num_layers: int) -> None:
    """Initialise every parameter from its global name, then keep this rank's TP slice.

    megatron-core draws initial weights from one RNG stream per rank, so a layer on pipeline
    stage 1 gets different numbers than the same layer in a PP=1 run. Drawing each full
    (unsharded) tensor from a generator seeded by (seed, global parameter name) and slicing it
    gives the same model for TP=1, TP=2, PP=2, ...: the layouts can then be compared loss for
    loss. Megatron's scheme otherwise: normal(0, 0.02), output projections scaled by
    1/sqrt(2 * num_layers), norms at 1, biases at 0.
    """
    tp, tp_rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
    std = 0.02
    for local_name, p in model.named_parameters():
        name = _global_name(model, local_name)
        if getattr(p, "tensor_model_parallel", False):
            dim, stride = p.partition_dim, getattr(p, "partition_stride", 1)
            full_shape = list(p.shape)
            full_shape[dim] *= tp
        else:
            dim, stride, full_shape = None, 1, list(p.shape)
        if name.endswith("bias"):
            full = torch.zeros(full_shape)
        elif ("layernorm" in name or "layer_norm" in name  # layer_norm_*: Transformer Engine
              or "norm" in name.split(".")[-2]):
            full = torch.ones(full_shape)
        else:
            s = std / math.sqrt(2.0 * num_layers) if name.endswith(
                ("linear_proj.weight", "linear_fc2.weight")) else std
            g = torch.Generator().manual_seed(_seed_for(seed, name))
            full = torch.empty(full_shape).normal_(0.0, s, generator=g)
        if dim is not None:
            # stride > 1 (gated MLP): the full tensor is tp*stride blocks, rank r owns every
            # tp-th block; stride 1 is a plain contiguous split.
            blocks = torch.chunk(full, tp * stride, dim=dim)
            full = torch.cat(blocks[tp_rank::tp], dim=dim)
        p.data.copy_(full.to(p.dtype))


def build_optimizer(cfg: Any, model: list[torch.nn.Module]) -> tuple[Any, OptimizerParamScheduler]:
    """megatron-core Adam (optionally the distributed optimizer) and warmup + cosine decay."""
    ocfg = OptimizerConfig(
        optimizer="adam",
        lr=cfg.lr,
        min_lr=cfg.min_lr,
        weight_decay=cfg.weight_decay,
        adam_beta1=0.9,
        adam_beta2=0.95,
        clip_grad=cfg.clip_grad,
        bf16=cfg.precision == "bf16",
        fp16=cfg.precision == "fp16",
        params_dtype=DTYPES[cfg.precision],
        initial_loss_scale=2**16 if cfg.precision == "fp16" else None,
        use_distributed_optimizer=cfg.use_distributed_optimizer,
        overlap_param_gather=overlap_param_gather(cfg),  # the same value as the DDP config's
    )
    optimizer = get_megatron_optimizer(ocfg, model)
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=0.0,
        max_lr=cfg.lr,
        min_lr=cfg.min_lr,
        lr_warmup_steps=cfg.lr_warmup_iters,
        # megatron-core needs decay to end after warmup; RunConfig allows warmup == train_iters.
        lr_decay_steps=max(cfg.train_iters, cfg.lr_warmup_iters + 1),
        lr_decay_style="cosine",
        start_wd=cfg.weight_decay,
        end_wd=cfg.weight_decay,
        wd_incr_steps=cfg.train_iters,
        wd_incr_style="constant",
        # The config is the source of truth on resume (train_iters may have grown); the
        # checkpoint only supplies how many steps were taken.
        use_checkpoint_opt_param_scheduler=False,
        override_opt_param_scheduler=True,
    )
    return optimizer, scheduler


def wire_schedule_hooks(tcfg: TransformerConfig, model: list[torch.nn.Module],
                        optimizer: Any) -> None:
    """What megatron-core's schedules expect on the config: grad sync and loss scaling hooks."""
    tcfg.no_sync_func = [m.no_sync for m in model] if len(model) > 1 else model[0].no_sync
    tcfg.finalize_model_grads_func = finalize_model_grads
    tcfg.grad_scale_func = optimizer.scale_loss


def count_parameters(model: list[torch.nn.Module]) -> int:
    """Parameters held by this rank (its TP shard of its PP stage), as Megatron counts them."""
    return sum(p.nelement() for m in model for p in m.parameters())


def inner_optimizers(optimizer: Any) -> list[Any]:
    """The torch/Apex/TE optimizers inside megatron-core's (possibly chained) optimizer."""
    subs = getattr(optimizer, "chained_optimizers", [optimizer])
    return [s.optimizer for s in subs if getattr(s, "optimizer", None) is not None]


def kernels_line(optimizer: Any) -> str:
    """Which optimizer class and multi-tensor kernels megatron-core picked (TE > Apex > torch)."""
    from megatron.core.optimizer import clip_grads

    names = sorted({f"{type(o).__module__}.{type(o).__name__}" for o in inner_optimizers(optimizer)})
    applier = getattr(clip_grads, "multi_tensor_applier", None)
    where = getattr(applier, "__module__", "") or type(applier).__module__
    fused = not where.startswith("megatron.core")
    return (f"optimizer: {type(optimizer).__name__} over {', '.join(names) or '?'}; multi-tensor "
            f"kernels: {'fused (' + where + ')' if fused else 'local fallback (' + where + ')'}"
            + ("" if fused else "; install Apex or Transformer Engine for fused Adam and kernels"))
