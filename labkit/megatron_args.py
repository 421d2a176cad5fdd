"""A RunConfig as Megatron-LM command-line flags, grouped the way Megatron-LM's example scripts
group them, and back.

``flag_groups(cfg)`` gives the flags of every field that has one (``MEGATRON_FLAGS``, plus
``--bf16``/``--fp16`` for ``precision``) and the fixed choices of labkit's engine that
Megatron-LM leaves to a flag with another default (``ENGINE_FLAGS``: cosine decay, Adam betas,
no dropout, ...), so that an upstream Megatron-LM ``pretrain_gpt.py`` given the same words
trains the same model the same way. A None field and a False switch give no flag (Megatron-LM's
default is the same). The data group is always there, because Megatron-LM needs it: the
dataset prefix, the GPT-2 BPE files (``--tokenizer-type GPT2BPETokenizer --vocab-file
--merge-file``) and the split, resolved as the engine resolves them (``data_paths``); a path
under labkit's data folder (the default corpus, when the run gives no ``data_path``) is written
``$DATA_DIR/...``, which the job script sets to the site's folder (``labkit.render``).
``config_from_flags`` is the way back that ``code/pretrain_gpt.py`` uses in flag mode; the job
scripts' rule for the fields without a flag is in ``labkit.render``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
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
    # code/engine_data.py: GPT-2 BPE files, train/valid split 98/2 (Megatron-LM: 969,30,1).
    "data": {"--tokenizer-type": "GPT2BPETokenizer", "--split": "98,2,0"},
}
DATA_DIR_REF = "$DATA_DIR"
"""The data folder in a flag's value: the job script's ``DATA_DIR`` (the site's ``data/``)."""
DEFAULT_CORPUS = "corpus_text_document"
"""The default dataset prefix's name in the data folder (``make data`` writes it)."""
TOKENIZER_FILES = {"--vocab-file": "vocab.json", "--merge-file": "merges.txt"}
"""The GPT-2 BPE files in a tokenizer folder, by the Megatron-LM flag that names each."""
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


def data_paths(data_path: str | None, tokenizer_dir: str | None,
               data_dir: str | Path) -> tuple[Path, Path]:
    """(dataset prefix, tokenizer folder) of a run, as ``code/engine_data.resolve_data`` picks
    them: ``data_path`` else ``DATA_DIR/corpus_text_document``; ``tokenizer_dir`` else the
    ``tokenizer`` folder beside the prefix."""
    prefix = Path(data_path) if data_path else Path(data_dir) / DEFAULT_CORPUS
    return prefix, Path(tokenizer_dir) if tokenizer_dir else prefix.parent / "tokenizer"


def _data_items(cfg: RunConfig) -> list[Item]:
    prefix, tok = data_paths(cfg.data_path, cfg.tokenizer_dir, DATA_DIR_REF)
    return [(MEGATRON_FLAGS["data_path"], str(prefix)), ("--tokenizer-type", "GPT2BPETokenizer"),
            *[(flag, str(tok / name)) for flag, name in TOKENIZER_FILES.items()]]


def flag_groups(cfg: RunConfig) -> tuple[tuple[str, tuple[Item, ...]], ...]:
    """((group, ((flag, value), (switch,), ...)), ...): every group that has a flag, in order.
    Data paths under the default folder start with ``$DATA_DIR`` (``with_data_dir``)."""
    out = []
    for group, names in GROUPS.items():
        if group == "data":
            items = _data_items(cfg) + [("--split", ENGINE_FLAGS["data"]["--split"])]
            out.append((group, tuple(items)))
            continue
        items = [it for n in names for it in _field_items(cfg, n)]
        items += [(f, v) for f, v in ENGINE_FLAGS.get(group, {}).items()]
        if items:
            out.append((group, tuple(items)))
    return tuple(out)


def with_data_dir(word: str, data_dir: str | Path) -> str:
    """A flag's value with ``$DATA_DIR`` replaced by the data folder."""
    ref = DATA_DIR_REF + "/"
    return str(Path(data_dir) / word[len(ref):]) if word.startswith(ref) else word


def flag_words(cfg: RunConfig, data_dir: str | Path) -> list[str]:
    """The flags of ``flag_groups`` as one argument list, ``$DATA_DIR`` being ``data_dir``."""
    return [with_data_dir(w, data_dir) for _, items in flag_groups(cfg) for it in items for w in it]


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


def _data_fields(prefix_flag: Any, files: dict[str, str], data_dir: str | Path,
                 base: RunConfig | None) -> tuple[dict[str, Any], list[str]]:
    """(data_path and tokenizer_dir, disagreements) of the data flags; with ``base`` each given
    flag must name what the engine reads for it, without it the flags say where the data is."""
    if base is not None:
        prefix, tok = data_paths(base.data_path, base.tokenizer_dir, data_dir)
        want = {MEGATRON_FLAGS["data_path"]: prefix,
                **{f: tok / name for f, name in TOKENIZER_FILES.items()}}
        given = {MEGATRON_FLAGS["data_path"]: prefix_flag, **files}
        return {}, [f"{f} {v} but the engine reads {want[f]} (config.json: data_path "
                    f"{base.data_path!r}, tokenizer_dir {base.tokenizer_dir!r})"
                    for f, v in given.items() if v is not None and Path(str(v)) != want[f]]
    default = Path(data_dir) / DEFAULT_CORPUS
    data_path = None if prefix_flag is None or Path(str(prefix_flag)) == default else str(prefix_flag)
    prefix = data_paths(data_path, None, data_dir)[0]
    bad = [f"{f} {v}: labkit's engine reads {name} in a tokenizer folder"
           for f, v in files.items() if Path(v).name != (name := TOKENIZER_FILES[f])]
    dirs = sorted({str(Path(v).parent) for v in files.values()})
    if len(dirs) > 1:
        bad.append(f"--vocab-file and --merge-file are in different folders ({', '.join(dirs)}); "
                   f"labkit's engine reads both from one tokenizer folder")
    tok = Path(dirs[0]) if dirs else None
    tokenizer_dir = None if tok is None or tok == prefix.parent / "tokenizer" else str(tok)
    return {"data_path": data_path, "tokenizer_dir": tokenizer_dir}, bad


def config_from_flags(flags: dict[str, Any], *, precision: str, base: RunConfig | None,
                      data_dir: str | Path, files: dict[str, str] | None = None,
                      **launcher: Any) -> RunConfig:
    """The RunConfig of a flag-mode launch.

    Without ``base``: the flags, ``precision``, the launcher's fields (name, nodes,
    gpus_per_node, device) and RunConfig's defaults for the rest. With ``base`` (the run's
    ``config.json``, which carries the fields that have no flag): ``base`` itself, once every
    field with a flag agrees with it (an absent flag means the field's default, or False);
    a disagreement is a ConfigError naming each field, both values and the fix. The data flags
    (``--data-path``, and ``files``: ``--vocab-file``/``--merge-file``) are paths, checked
    against what the engine reads (``data_paths`` with the engine's ``data_dir``); an absent one
    leaves it to the config, and the default corpus given by path is still the default.
    """
    flags = dict(flags)
    data, data_bad = _data_fields(flags.pop("data_path", None), dict(files or {}), data_dir, base)
    if base is None:
        if data_bad:
            raise ConfigError("the data flags do not fit labkit's engine: " + "; ".join(data_bad))
        return RunConfig(precision=precision, **launcher, **flags, **data)
    given = {n: flags.get(n, _absent(n)) for n in MEGATRON_FLAGS if n != "data_path"}
    given["precision"] = precision
    diffs = []
    for name, value in given.items():
        want = getattr(base, name)
        if value != want:
            flag = MEGATRON_FLAGS.get(name, "--bf16/--fp16")
            shown = "absent" if name not in flags and name != "precision" else repr(value)
            diffs.append(f"{name}: {flag} {shown} but config.json has {want!r}")
    diffs += data_bad
    if diffs:
        raise ConfigError("the command line's Megatron-LM flags and the run's config.json "
                          "disagree: " + "; ".join(diffs) + ". Change the RunConfig and submit "
                          "(or `labkit render`) again instead of editing the job script's flags")
    return base
