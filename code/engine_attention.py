"""Core attention of code/pretrain_gpt.py: the layer spec follows ``attention_backend``.

``labkit.planner.memory.attention_kernel(cfg)`` decides, and the planner's activation memory
follows the same answer:

* ``local`` (``attention_backend="unfused"``): megatron-core's local spec as it is, with its
  ``DotProductAttention`` (scores, softmax and dropout as separate tensors: s x s per head).
* ``sdpa`` (``"flash"`` without Transformer Engine): the local spec with ``SDPAttention`` below
  as ``core_attention``. It calls ``torch.nn.functional.scaled_dot_product_attention``, which
  picks FlashAttention-2 or the memory-efficient kernel on CUDA and a flash kernel on CPU;
  none keeps the s x s probabilities for backward.
* ``te`` (``"flash"`` on CUDA with Transformer Engine installed): megatron-core's Transformer
  Engine spec (fused attention, fused LayerNorm + linear).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from megatron.core import parallel_state as ps
from megatron.core import tensor_parallel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule

from labkit.planner.memory import ATTENTION_KERNELS, attention_kernel


class SDPAttention(MegatronModule):
    """megatron-core's core-attention interface on ``scaled_dot_product_attention``.

    Takes query/key/value as ``[s, b, heads, head_dim]`` (this TP rank's heads; key and value
    with the query groups) and returns the context as ``[s, b, heads x head_dim]``, as
    ``DotProductAttention`` does. A boolean ``attention_mask`` is megatron's convention (True =
    masked out); without one, a causal mask type uses the kernel's own causal masking.
    """

    def __init__(self, config: Any, layer_number: int, attn_mask_type: AttnMaskType,
                 attention_type: str, attention_dropout: float | None = None,
                 softmax_scale: float | None = None, cp_comm_type: str | None = None,
                 pg_collection: Any = None):
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("SDPAttention does not split the sequence over a context-parallel "
                             "group; use context_parallel_size=1 or Transformer Engine")
        tp = pg_collection.tp.size() if pg_collection is not None else \
            ps.get_tensor_model_parallel_world_size()
        self.heads = config.num_attention_heads // tp
        self.groups = config.num_query_groups // tp
        self.head_dim = config.kv_channels
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.softmax_scale = softmax_scale if softmax_scale is not None else \
            1.0 / math.sqrt(self.head_dim)
        self.dropout_p = config.attention_dropout if attention_dropout is None else \
            attention_dropout

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, attn_mask_type: AttnMaskType | None = None,
                attention_bias: Any = None, packed_seq_params: Any = None) -> torch.Tensor:
        if attention_bias is not None or packed_seq_params is not None:
            raise ValueError("SDPAttention supports neither attention_bias nor packed sequences")
        s, b = query.shape[0], query.shape[1]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, d]
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        causal = attention_mask is None and mask_type == AttnMaskType.causal
        mask = None if attention_mask is None else ~attention_mask
        p = self.dropout_p if self.training else 0.0

        def attend() -> torch.Tensor:
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal, scale=self.softmax_scale,
                enable_gqa=self.groups != self.heads)

        if p > 0.0 and not self.config.sequence_parallel:
            with tensor_parallel.get_cuda_rng_tracker().fork():  # per-TP-rank dropout masks
                context = attend()
        else:
            context = attend()
        return context.permute(2, 0, 1, 3).reshape(s, b, self.heads * self.head_dim)


def layer_spec(cfg: Any) -> tuple[Any, str]:
    """(megatron-core layer spec, one-line description) for ``cfg.attention_backend``."""
    kernel = attention_kernel(cfg)
    if kernel == "te":
        from megatron.core.models.gpt.gpt_layer_specs import (
            get_gpt_layer_with_transformer_engine_spec,
        )

        spec = get_gpt_layer_with_transformer_engine_spec()
    else:
        spec = get_gpt_layer_local_spec()
        if kernel == "sdpa":
            spec.submodules.self_attention.submodules.core_attention = SDPAttention
    return spec, (f"attention: {kernel} = {ATTENTION_KERNELS[kernel]} "
                  f"(attention_backend={cfg.attention_backend!r})")
