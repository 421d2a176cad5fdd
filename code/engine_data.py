"""Data side of code/pretrain_gpt.py: GPT-2 BPE files, megatron-core GPTDataset, batches.

The token ids come from the saved ``vocab.json`` + ``merges.txt`` (read with the ``tokenizers``
package, because megatron-core 0.16 does not ship Megatron-LM's GPT2BPETokenizer class). The
dataset is megatron-core's own ``GPTDataset`` built by ``BlendedMegatronDatasetBuilder`` with a
train/valid split; batches are cut the way Megatron-LM's pretraining sampler cuts them, so the
data position is just ``consumed_samples`` (saved in checkpoints). As in Megatron-LM, TP rank 0
of each tensor-parallel group loads the batch and broadcasts it to the group (``tp_batches``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from megatron.core import parallel_state as ps
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

from labkit.megatron_args import ENGINE_FLAGS, TOKENIZER_FILES

EOD = "<|endoftext|>"


class GPT2BPEFiles:
    """The tokenizer interface GPTDataset needs (vocab size, eod), read from GPT-2 BPE files."""

    def __init__(self, tokenizer_dir: str | Path):
        from tokenizers import ByteLevelBPETokenizer

        d = Path(tokenizer_dir)
        vocab, merges = (d / TOKENIZER_FILES[f] for f in ("--vocab-file", "--merge-file"))
        missing = [str(p) for p in (vocab, merges) if not p.is_file()]
        if missing:
            raise FileNotFoundError(
                f"tokenizer files missing: {', '.join(missing)}. Run `make data` "
                f"(python code/prepare_data.py) or set tokenizer_dir to a folder with GPT-2 "
                f"vocab.json + merges.txt")
        self._tok = ByteLevelBPETokenizer(str(vocab), str(merges), add_prefix_space=False)
        eod = self._tok.token_to_id(EOD)
        if eod is None:
            raise ValueError(f"{vocab} has no {EOD!r} token (needed to separate documents)")
        self.eod = eod
        self.vocab_size = self._tok.get_vocab_size()
        self.unique_identifiers = {"class": "GPT2BPEFiles", "vocab": str(vocab.resolve())}

    def tokenize(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def detokenize(self, ids: list[int]) -> str:
        return self._tok.decode(ids)


def resolve_data(cfg: Any, data_dir: Path) -> tuple[Path, Path]:
    """(dataset prefix, tokenizer dir) from the config, defaulting to ``data/``."""
    prefix = Path(cfg.data_path) if cfg.data_path else data_dir / "corpus_text_document"
    tok = Path(cfg.tokenizer_dir) if cfg.tokenizer_dir else prefix.parent / "tokenizer"
    if not prefix.with_suffix(".bin").is_file() or not prefix.with_suffix(".idx").is_file():
        raise FileNotFoundError(
            f"dataset {prefix}.bin/.idx not found. Run `make data` (python code/prepare_data.py) "
            f"or set data_path to the prefix of an indexed dataset")
    return prefix, tok


def build_datasets(cfg: Any, prefix: Path, tokenizer: GPT2BPEFiles,
                   cache_dir: Path) -> tuple[GPTDataset | None, GPTDataset | None]:
    """Train and validation GPTDatasets (split 98/2) sized for this run; None on TP ranks > 0."""
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(
            f"the tokenizer in {prefix.parent} has {tokenizer.vocab_size} tokens but the config "
            f"says vocab_size={cfg.vocab_size}; set vocab_size={tokenizer.vocab_size} (token ids "
            f"beyond the embedding table would crash)")
    evals = (cfg.train_iters // cfg.eval_interval + 1) * cfg.eval_iters if cfg.eval_interval else 0
    sizes = [cfg.train_iters * cfg.global_batch_size, max(evals, 1) * cfg.global_batch_size, 0]
    dcfg = GPTDatasetConfig(
        random_seed=cfg.seed,
        sequence_length=cfg.seq_length,
        blend=([str(prefix)], None),
        split=ENGINE_FLAGS["data"]["--split"],  # what the job script's --split says
        path_to_cache=str(cache_dir),
        tokenizer=tokenizer,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        # The local (unfused) attention builds its causal mask itself.
        create_attention_mask=False,
        mid_level_dataset_surplus=0.005,
    )
    # Only TP rank 0 of each group reads batches (tp_batches): the others get None, as in
    # Megatron-LM, and never open the corpus.
    built_here = lambda: ps.get_tensor_model_parallel_rank() == 0  # noqa: E731
    train, valid, _ = BlendedMegatronDatasetBuilder(GPTDataset, sizes, built_here, dcfg).build()
    return train, valid


def batches(dataset: Any, consumed_samples: int, micro_batch_size: int,
            pin_memory: bool = False) -> Iterator[dict]:
    """Micro batches for this DP rank from ``consumed_samples`` on (Megatron's sampler order).

    A global step of ``micro_batch_size * dp`` samples is cut into DP slices; DP rank r takes
    slice r. TP and PP ranks of one DP replica read the same samples. With ``pin_memory`` (CUDA
    only) each batch lands in page-locked memory, so ``to_device`` copies it asynchronously.
    """
    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    step = micro_batch_size * dp
    start = consumed_samples
    while start + step <= len(dataset):
        idx = range(start + dp_rank * micro_batch_size, start + (dp_rank + 1) * micro_batch_size)
        samples = [dataset[i] for i in idx]
        batch = {k: torch.stack([torch.as_tensor(s[k]) for s in samples])
                 for k in ("tokens", "labels", "loss_mask", "position_ids")}
        yield {k: v.pin_memory() for k, v in batch.items()} if pin_memory else batch
        start += step
    raise RuntimeError(f"ran out of samples at {start} of {len(dataset)}; the dataset was sized "
                       f"for fewer iterations than were asked for")


BATCH = {"tokens": torch.int64, "labels": torch.int64, "loss_mask": torch.float32,
         "position_ids": torch.int64}
"""What a micro batch holds: each a (micro_batch_size, seq_length) tensor of this dtype."""


def tp_batches(dataset: Any, consumed_samples: int, micro_batch_size: int, seq_length: int,
               on_cuda: bool) -> Iterator[dict]:
    """Micro batches on this rank's device, loaded as Megatron-LM loads them.

    Only TP rank 0 of each tensor-parallel group reads the dataset and assembles the batch
    (in pinned memory on CUDA, copied without blocking); it broadcasts the batch over the TP
    group, whose other ranks receive it into tensors of the known shape and never read the
    dataset. Every TP rank of a group calls ``next`` in the same order (the same schedule), so
    each call is one broadcast per tensor. With TP=1 it is the plain batches, on the device.
    """
    tp = ps.get_tensor_model_parallel_world_size()
    reader = ps.get_tensor_model_parallel_rank() == 0
    source = batches(dataset, consumed_samples, micro_batch_size, pin_memory=on_cuda) \
        if reader else None
    if tp == 1:
        for batch in source:
            yield to_device(batch, on_cuda)
        return
    src, group = ps.get_tensor_model_parallel_src_rank(), ps.get_tensor_model_parallel_group()
    dev = torch.device("cuda", torch.cuda.current_device()) if on_cuda else torch.device("cpu")
    shape = (micro_batch_size, seq_length)
    while True:
        if reader:
            batch = to_device(next(source), on_cuda)
            wrong = {k: (tuple(v.shape), v.dtype) for k, v in batch.items()
                     if tuple(v.shape) != shape or v.dtype != BATCH.get(k)}
            if set(batch) != set(BATCH) or wrong:
                raise ValueError(f"a micro batch must hold {sorted(BATCH)} of shape {shape} "
                                 f"({BATCH}); got {sorted(batch)}, differing: {wrong}")
        else:
            batch = {k: torch.empty(shape, dtype=dt, device=dev) for k, dt in BATCH.items()}
        for k in BATCH:  # one fixed order on every rank of the group
            torch.distributed.broadcast(batch[k], src, group=group)
        yield batch


def to_device(batch: dict, on_cuda: bool) -> dict:
    """The batch on this rank's device: non-blocking copies from pinned memory on CUDA; on CPU
    the tensors themselves."""
    if not on_cuda:
        return batch
    dev = torch.cuda.current_device()
    return {k: v.to(dev, non_blocking=v.is_pinned()) for k, v in batch.items()}
