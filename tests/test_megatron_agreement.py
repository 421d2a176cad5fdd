"""Every config megatron-core rejects, labkit's RunConfig rejects too (with its own message).

Property-based (hypothesis, hundreds of random RunConfig-like dicts). For each, megatron-core's
own code judges it, without process groups:

* ``TransformerConfig(...)`` (and its base ``ModelParallelConfig``) built exactly as
  ``code/pretrain_gpt.py`` maps a RunConfig (heads vs TP, query groups vs TP, sequence parallel
  vs TP, recompute settings, pipeline dtype, ...);
* ``transformer_block.get_num_layers_to_build(config, vp_stage, pp_rank=0)``: layers vs PP and
  virtual stages;
* ``num_microbatches_calculator.ConstantNumMicroBatchesCalculator``: global batch vs micro
  batch x DP.

Three rules live in code that needs live process groups or in Megatron-LM's training code, so
they are mirrored here, with their source: Megatron-LM's ``validate_args`` (layers per pipeline
stage divisible by layers per virtual stage), ``parallel_state.initialize_model_parallel``
("world_size (N) is not divisible by tp*pp*cp") and the interleaved schedule's microbatch rule
(``schedules.forward_backward_pipelining_with_interleaving``: ``microbatch_group_size_per_vp_stage``
must lie in [PP, M] and M mod it must be 0 or >= PP).

labkit may be stricter (e.g. it wants query groups divisible by TP, hidden divisible by heads,
at least 2 virtual stages): the property is one-way, megatron rejects => labkit rejects.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from megatron.core.num_microbatches_calculator import (  # noqa: E402
    ConstantNumMicroBatchesCalculator,
)
from megatron.core.transformer.transformer_block import get_num_layers_to_build  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

from labkit.config import RunConfig  # noqa: E402
from labkit.errors import ConfigError  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def megatron_rejects(c: dict[str, Any]) -> str | None:
    """Why megatron-core refuses this config, or None if it accepts it."""
    tp, pp = c["tensor_model_parallel_size"], c["pipeline_model_parallel_size"]
    world = c["nodes"] * c["gpus_per_node"]
    layers, vs = c["num_layers"], c["num_layers_per_virtual_pipeline_stage"]
    # Megatron-LM's validate_args (mirrored: it is training code, not megatron-core) derives
    # the virtual stages from layers per virtual stage, after checking they divide evenly.
    if vs and pp > 1 and (layers // pp) % vs:
        return ("number of layers per pipeline stage must be divisible number of layers per "
                "virtual pipeline stage")
    vpp = (layers // pp) // vs if (vs and pp > 1) else None
    heads = c["num_attention_heads"]
    ffn = c["ffn_hidden_size"] or 4 * c["hidden_size"]
    full = c["recompute_granularity"] == "full"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tcfg = TransformerConfig(
                num_layers=layers, hidden_size=c["hidden_size"], num_attention_heads=heads,
                num_query_groups=c["num_query_groups"], ffn_hidden_size=ffn,
                gated_linear_unit=c["swiglu"], tensor_model_parallel_size=tp,
                pipeline_model_parallel_size=pp,
                virtual_pipeline_model_parallel_size=vpp or None,
                sequence_parallel=c["sequence_parallel"],
                pipeline_dtype=DTYPES[c["precision"]], params_dtype=DTYPES[c["precision"]],
                bf16=c["precision"] == "bf16", fp16=c["precision"] == "fp16",
                recompute_granularity=c["recompute_granularity"],
                recompute_method="uniform" if full else None,
                recompute_num_layers=1 if full else None,
                use_cpu_initialization=True, hidden_dropout=0.0, attention_dropout=0.0,
                bias_activation_fusion=False, masked_softmax_fusion=False,
                persist_layer_norm=False, bias_dropout_fusion=False,
                gradient_accumulation_fusion=False,
            )
            get_num_layers_to_build(tcfg, vp_stage=0 if vpp else None, pp_rank=0)
    except (ValueError, AssertionError, ZeroDivisionError) as e:
        return f"TransformerConfig / layers: {e}"
    if vs and pp > 1 and not vpp:
        return "no virtual stage (layers per PP rank < layers per virtual stage)"
    # parallel_state.initialize_model_parallel (mirrored: needs process groups)
    if world % (tp * pp):
        return f"world_size ({world}) is not divisible by {tp * pp}"
    dp = world // (tp * pp)
    try:
        calc = ConstantNumMicroBatchesCalculator(c["global_batch_size"], c["micro_batch_size"],
                                                 dp, False, rank=1)
    except AssertionError as e:
        return f"microbatch calculator: {e}"
    m = calc.get()
    if vpp:  # the interleaved schedule's checks (mirrored: they run inside the schedule)
        group = tcfg.microbatch_group_size_per_vp_stage
        if group > m or group < pp:
            return f"interleaving: microbatch group {group} not in [PP={pp}, M={m}]"
        if 0 < m % group < pp:
            return f"interleaving: M={m} mod {group} in (0, PP={pp})"
    return None


def labkit_rejects(c: dict[str, Any]) -> str | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            RunConfig(**c)
    except ConfigError as e:
        return str(e)
    return None


@st.composite
def run_dicts(draw) -> dict[str, Any]:
    heads = draw(st.integers(1, 16))
    head_dim = draw(st.sampled_from([4, 8, 16]))
    hidden = heads * head_dim if draw(st.booleans()) else draw(st.integers(8, 256))
    layers = draw(st.integers(1, 24))
    return dict(
        nodes=draw(st.integers(1, 4)),
        gpus_per_node=draw(st.sampled_from([1, 2, 3, 4, 8])),
        device=draw(st.sampled_from(["cuda", "cuda", "cpu"])),
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=draw(st.one_of(st.none(), st.integers(1, 16))),
        ffn_hidden_size=draw(st.one_of(st.none(), st.integers(8, 512))),
        swiglu=draw(st.booleans()),
        tensor_model_parallel_size=draw(st.sampled_from([1, 1, 2, 3, 4, 8])),
        pipeline_model_parallel_size=draw(st.sampled_from([1, 1, 2, 3, 4])),
        num_layers_per_virtual_pipeline_stage=draw(st.one_of(st.none(), st.integers(1, 6))),
        sequence_parallel=draw(st.booleans()),
        recompute_granularity=draw(st.sampled_from([None, "selective", "full"])),
        precision=draw(st.sampled_from(["fp32", "bf16", "fp16"])),
        micro_batch_size=draw(st.integers(1, 4)),
        global_batch_size=draw(st.integers(1, 64)),
        seq_length=64, max_position_embeddings=64, vocab_size=1000,
    )


@st.composite
def near_valid_dicts(draw) -> dict[str, Any]:
    """Configs built to satisfy the layout rules, so that megatron-core accepts many of them;
    labkit must not be asked only about hopeless ones."""
    tp = draw(st.sampled_from([1, 2, 4]))
    pp = draw(st.sampled_from([1, 2, 3, 4]))
    dp = draw(st.integers(1, 3))
    gpn = draw(st.sampled_from([g for g in (1, 2, 3, 4, 6, 8, 12) if (tp * pp * dp) % g == 0
                                or g % tp == 0]))
    world = tp * pp * dp
    nodes = max(1, world // gpn) if world % gpn == 0 else 1
    gpn = world // nodes
    vs = draw(st.one_of(st.none(), st.integers(1, 3))) if pp > 1 else None
    layers = pp * (vs or 1) * draw(st.integers(1, 4))
    groups_per_tp = draw(st.integers(1, 3))
    heads = tp * groups_per_tp * draw(st.sampled_from([1, 2]))
    mbs = draw(st.integers(1, 3))
    m = pp * draw(st.integers(1, 3)) if vs else draw(st.integers(1, 6))
    return dict(
        nodes=nodes, gpus_per_node=gpn, device="cuda", num_layers=layers,
        hidden_size=heads * draw(st.sampled_from([4, 8])), num_attention_heads=heads,
        num_query_groups=draw(st.sampled_from([None, tp * groups_per_tp, tp])),
        ffn_hidden_size=draw(st.one_of(st.none(), st.sampled_from([16 * tp, 48 * tp]))),
        swiglu=draw(st.booleans()), tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp, num_layers_per_virtual_pipeline_stage=vs,
        sequence_parallel=tp > 1 and draw(st.booleans()),
        recompute_granularity=draw(st.sampled_from([None, "selective", "full"])),
        precision=draw(st.sampled_from(["fp32", "bf16"])), micro_batch_size=mbs,
        global_batch_size=mbs * dp * m, seq_length=64, max_position_embeddings=64,
        vocab_size=1000,
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(run_dicts(), near_valid_dicts()))
def test_every_config_megatron_rejects_labkit_rejects(c):
    why = megatron_rejects(c)
    event("megatron-core rejects" if why else "megatron-core accepts")  # --hypothesis-show-statistics
    if why is not None:
        assert labkit_rejects(c) is not None, f"megatron-core rejects ({why}) but labkit accepts {c}"


# Each rule on its own: megatron_rejects really detects it (so the property above can fail),
# and labkit's message carries the numbers.
BASE = dict(nodes=1, gpus_per_node=4, device="cuda", num_layers=8, hidden_size=64,
            num_attention_heads=4, num_query_groups=None, ffn_hidden_size=None, swiglu=False,
            tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
            num_layers_per_virtual_pipeline_stage=None, sequence_parallel=False,
            recompute_granularity=None, precision="bf16", micro_batch_size=1,
            global_batch_size=8, seq_length=64, max_position_embeddings=64, vocab_size=1000)


@pytest.mark.parametrize("change,labkit_says", [
    (dict(num_attention_heads=6, hidden_size=96), "num_attention_heads 6 is not divisible by TP 4"),
    (dict(num_query_groups=3, num_attention_heads=6, hidden_size=96,
          tensor_model_parallel_size=2), "num_query_groups 3 is not divisible by TP 2"),
    (dict(sequence_parallel=True, tensor_model_parallel_size=1),
     "sequence_parallel=True needs TP > 1"),
    (dict(num_layers=7), "num_layers 7 is not divisible by PP 2"),
    (dict(num_layers_per_virtual_pipeline_stage=3), "num_layers 8 is not divisible by PP 2 x"),
    (dict(gpus_per_node=3), "does not divide world size 3"),
    (dict(gpus_per_node=8, global_batch_size=7),
     "global_batch_size 7 is not divisible by micro_batch_size 1 x DP 2"),
    (dict(num_layers_per_virtual_pipeline_stage=2, global_batch_size=3),
     "interleaved schedule needs the number of microbatches (3"),
])
def test_each_megatron_rule_is_detected_and_labkit_names_the_numbers(change, labkit_says):
    if "num_attention_heads" in change and "tensor_model_parallel_size" not in change:
        change = {**change, "tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 1}
    c = {**BASE, **change}
    assert megatron_rejects(c) is not None, c
    msg = labkit_rejects(c)
    assert msg is not None and labkit_says in msg, msg


def test_base_config_is_accepted_by_both():
    assert megatron_rejects(BASE) is None
    assert labkit_rejects(BASE) is None
