"""One training or evaluation step of code/pretrain_gpt.py: the forward step megatron-core's
pipeline schedules call, the loss they return, and the validation loop."""

from __future__ import annotations

from typing import Any

import torch

ON_CUDA = {"value": False}
"""Set once by the engine: whether batches go to a GPU (pinned, non-blocking copies)."""


def forward_step(data_iterator, model):
    """One micro batch through this rank's model chunk; the last stage also returns the loss."""
    batch = next(data_iterator)  # on this rank's device (engine_data.tp_batches)
    tokens, labels = batch["tokens"], batch["labels"]
    loss_mask, position_ids = batch["loss_mask"], batch["position_ids"]
    output = model(tokens, position_ids, None, labels=labels)  # (b, s) per-token loss at the end

    def loss_func(output_tensor):
        mask = loss_mask.view(-1).float()
        loss = torch.sum(output_tensor.view(-1).float() * mask) / mask.sum().clamp(min=1)
        # clone: the schedule divides the returned loss in place by the number of microbatches
        return loss, {"lm loss": loss.detach().clone()}

    return output, loss_func


def mean_loss(losses: list[dict], *, as_tensor: bool = False) -> float | torch.Tensor | None:
    """Average 'lm loss' over micro batches and data-parallel replicas (last stage only).

    ``as_tensor``: a one-element tensor on the device, not read back (no wait for the GPU)."""
    from megatron.core import parallel_state as ps

    if not ps.is_pipeline_last_stage(ignore_virtual=True):
        return None
    dev = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
    t = torch.stack([d["lm loss"].float() for d in losses]).mean().reshape(1).to(dev)
    torch.distributed.all_reduce(t, group=ps.get_data_parallel_group())
    if as_tensor:
        return t / ps.get_data_parallel_world_size()
    return float(t.item()) / ps.get_data_parallel_world_size()


def evaluate(cfg: Any, model: list, valid_ds, fwd_bwd) -> float | None:
    """Mean validation loss over eval_iters global batches (the same batches every time)."""
    import engine_data

    for m in model:
        m.eval()
    its = [engine_data.tp_batches(valid_ds, 0, cfg.micro_batch_size, cfg.seq_length,
                                  ON_CUDA["value"]) for _ in model]
    total: list[float] = []
    with torch.no_grad():
        for _ in range(cfg.eval_iters):
            losses = fwd_bwd(forward_step_func=forward_step,
                             data_iterator=its if len(model) > 1 else its[0],
                             model=model if len(model) > 1 else model[0],
                             num_microbatches=cfg.num_microbatches, seq_length=cfg.seq_length,
                             micro_batch_size=cfg.micro_batch_size, forward_only=True)
            loss = mean_loss(losses)
            if loss is not None:
                total.append(loss)
    for m in model:
        m.train()
    return sum(total) / len(total) if total else None
