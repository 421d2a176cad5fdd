"""A RunConfig as Megatron-LM command-line flags, grouped the way Megatron-LM's example scripts
group them, and back.

``flag_groups(cfg)`` gives the flags of every field that has one (``MEGATRON_FLAGS``, plus
``--bf16``/``--fp16`` for ``precision``) and the fixed choices of labkit's engine that
Megatron-LM leaves to a flag with another default (``ENGINE_FLAGS``: cosine decay, Adam betas,
no dropout, ...), so that an upstream Megatron-LM ``pretrain_gpt.py`` given the same words
trains the same model the same way. A None field and a False switch give no flag (Megatron-LM's
default is the same). ``config_from_flags`` is the way back that ``code/pretrain_gpt.py``
uses in flag mode; the job scripts' rule for the fields without a flag is in ``labkit.render``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from labkit.config import MEGATRON_FLAGS, RunConfig
from labkit.errors import ConfigError

# Megatron-LM example scripts' groups, in the order a job script lists them.
GROUPS: dict[str, tuple[str, ...]] = {
    "parallelism": ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                    "num_layers_per_virtual_pipeline_stage", "sequence_parallel",
                    "use_distributed_optimizer"),
    "model": ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size",
              "num_query_groups", "swiglu", "untie_embeddings_and_output_weights",
              "attention_backend", "seq_length", "max_position_embeddings", "vocab_size",
              "make_vocab_size_divisible_by"),
    "batch": ("micro_batch_size", "global_batch_size"),
    "training": ("train_iters", "lr", "min_lr", "lr_warmup_iters", "weight_decay", "clip_grad",
                 "seed", "precision", "recompute_granularity"),
    "data": ("data_path",),
    "logging": ("log_interval", "save_interval", "eval_interval", "eval_iters", "torch_profiler"),
}

# What labkit's engine always does, as the Megatron-LM flags that say it (Megatron-LM's own
# defaults differ: linear decay, dropout 0.1, beta2 0.999). Group -> {flag: value}.
ENGINE_FLAGS: dict[str, dict[str, str]] = {
    "model": {"--hidden-dropout": "0.0", "--attention-dropout": "0.0",
              "--init-method-std": "0.02", "--position-embedding-type": "learned_absolute"},
    "training": {"--lr-decay-style": "cosine", "--adam-beta1": "0.9", "--adam-beta2": "0.95"},
}
# Switches Megatron-LM needs before a field's own flag: field -> the switch.
_WITH = {
    "num_query_groups": ("--group-query-attention",),
    "torch_profiler": ("--use-pytorch-profiler",),
}
RECOMPUTE_FULL = ("--recompute-method", "uniform", "--recompute-num-layers", "1")
PRECISION_FLAGS = {"bf16": "--bf16", "fp16": "--fp16"}
SWITCHES = ("--group-query-attention", "--use-pytorch-profiler")
"""Flags without a value that only accompany another (accepted and implied in flag mode)."""

Item = tuple[str, ...]  # one flag and its value (or a switch alone)


def _word(value: Any) -> str:
    return str(value)


def _field_items(cfg: RunConfig, name: str) -> list[Item]:
    if name == "precision":
        return [(PRECISION_FLAGS[cfg.precision],)] if cfg.precision in PRECISION_FLAGS else []
    value = getattr(cfg, name)
    if value is None or value is False:
        return []
    flag = MEGATRON_FLAGS[name]
    items: list[Item] = []
    if name in _WITH:
        items.append(_WITH[name])
    items.append((flag,) if value is True else (flag, _word(value)))
    if name == "recompute_granularity" and value == "full":
        items += [RECOMPUTE_FULL[:2], RECOMPUTE_FULL[2:]]
    return items


def flag_groups(cfg: RunConfig) -> tuple[tuple[str, tuple[Item, ...]], ...]:
    """((group, ((flag, value), (switch,), ...)), ...): every group that has a flag, in order."""
    out = []
    for group, names in GROUPS.items():
        items = [it for n in names for it in _field_items(cfg, n)]
        items += [(f, v) for f, v in ENGINE_FLAGS.get(group, {}).items()]
        if items:
            out.append((group, tuple(items)))
    return tuple(out)


def flag_words(cfg: RunConfig) -> list[str]:
    """The flags of ``flag_groups`` as one argument list."""
    return [w for _, items in flag_groups(cfg) for it in items for w in it]


def engine_flag_problems(values: dict[str, Any]) -> list[str]:
    """Flags of ``ENGINE_FLAGS`` (and the recompute pair) given another value than the engine's."""
    fixed = {f: v for g in ENGINE_FLAGS.values() for f, v in g.items()}
    fixed.update({RECOMPUTE_FULL[0]: RECOMPUTE_FULL[1], RECOMPUTE_FULL[2]: RECOMPUTE_FULL[3]})
    bad = []
    for flag, given in values.items():
        if given is None or flag not in fixed:
            continue
        want = fixed[flag]
        same = str(given) == want
        try:
            same = same or float(given) == float(want)
        except ValueError:
            pass
        if not same:
            bad.append(f"{flag} {given} (labkit's engine always uses {flag} {want})")
    return bad


def _absent(name: str) -> Any:
    f = next(f for f in dataclasses.fields(RunConfig) if f.name == name)
    return False if isinstance(f.default, bool) else f.default


def config_from_flags(flags: dict[str, Any], *, precision: str, base: RunConfig | None,
                      **launcher: Any) -> RunConfig:
    """The RunConfig of a flag-mode launch.

    Without ``base``: the flags, ``precision``, the launcher's fields (name, nodes,
    gpus_per_node, device) and RunConfig's defaults for the rest. With ``base`` (the run's
    ``config.json``, which carries the fields that have no flag): ``base`` itself, once every
    field with a flag agrees with it (an absent flag means the field's default, or False);
    a disagreement is a ConfigError naming each field, both values and the fix.
    """
    if base is None:
        return RunConfig(precision=precision, **launcher, **flags)
    given = {n: flags.get(n, _absent(n)) for n in MEGATRON_FLAGS}
    given["precision"] = precision
    diffs = []
    for name, value in given.items():
        want = getattr(base, name)
        if value != want:
            flag = MEGATRON_FLAGS.get(name, "--bf16/--fp16")
            shown = "absent" if name not in flags and name != "precision" else repr(value)
            diffs.append(f"{name}: {flag} {shown} but config.json has {want!r}")
    if diffs:
        raise ConfigError("the command line's Megatron-LM flags and the run's config.json "
                          "disagree: " + "; ".join(diffs) + ". Change the RunConfig and submit "
                          "(or `labkit render`) again instead of editing the job script's flags")
    return base
