"""RunConfig: presets, JSON round trip, summary, and every validation rule with its numbers."""

from __future__ import annotations

import dataclasses
import json

import pytest

from labkit.config import FIELD_NAMES, MEGATRON_FLAGS, PRESETS, PROFILES, RunConfig
from labkit.errors import ConfigError


def make(**kw):
    return RunConfig(**{"name": "t", **kw})


@pytest.mark.parametrize("preset", list(PRESETS))
def test_presets_build_and_round_trip(preset):
    cfg = RunConfig.from_preset(preset, name=f"p_{preset}", nodes=1, gpus_per_node=1,
                                micro_batch_size=1, global_batch_size=4)
    text = cfg.to_json()
    back = RunConfig.from_json(text)
    assert back == cfg
    assert back.to_json() == text


@pytest.mark.parametrize("profile", list(PROFILES))
def test_profiles_are_valid(profile):
    cfg = RunConfig.for_profile(profile, name="x")
    assert cfg.world_size == cfg.nodes * cfg.gpus_per_node


def test_round_trip_through_file_keeps_every_field(tmp_path):
    cfg = make(nodes=2, gpus_per_node=2, tensor_model_parallel_size=2,
               pipeline_model_parallel_size=2, num_layers=8,
               num_layers_per_virtual_pipeline_stage=2, global_batch_size=16,
               memory_limit_gb=1.5, recompute_granularity="full", torch_profiler_ranks=(0, 3),
               extra={"notebook": "06"})
    path = tmp_path / "c.json"
    cfg.to_json(path)
    back = RunConfig.from_json(path)
    assert back == cfg and back.torch_profiler_ranks == (0, 3)
    assert set(json.loads(path.read_text())) == set(FIELD_NAMES)


def test_derived_numbers_and_summary():
    cfg = make(nodes=2, gpus_per_node=4, tensor_model_parallel_size=2,
               pipeline_model_parallel_size=2, micro_batch_size=2, global_batch_size=16,
               seq_length=128)
    assert (cfg.world_size, cfg.tp, cfg.pp, cfg.dp) == (8, 2, 2, 2)
    assert cfg.num_microbatches == 4
    assert cfg.tokens_per_iteration == 2048
    s = cfg.summary()
    for needle in ("world size 8", "DP=2", "4 microbatch", "2,048"):
        assert needle in s


def test_padded_vocab_matches_megatron():
    # Megatron pads to a multiple of make_vocab_size_divisible_by x TP: GPT-2's 50257 -> 50304.
    assert make(vocab_size=50257, max_position_embeddings=128).padded_vocab_size == 50304
    cfg = make(vocab_size=50257, tensor_model_parallel_size=2)
    assert cfg.padded_vocab_size == 50432


def rules_broken(**kw) -> str:
    with pytest.raises(ConfigError) as e:
        make(**kw)
    return str(e.value)


@pytest.mark.parametrize("kw, needles", [
    (dict(tensor_model_parallel_size=3, nodes=2, gpus_per_node=2), ["3 x 1 = 3", "world size 4"]),
    (dict(global_batch_size=6, micro_batch_size=4), ["global_batch_size 6", "4 x DP 2 = 8"]),
    (dict(num_layers=6, pipeline_model_parallel_size=4, nodes=2, global_batch_size=8),
     ["num_layers 6", "PP 4"]),
    (dict(num_attention_heads=3, hidden_size=96, tensor_model_parallel_size=2),
     ["num_attention_heads 3", "TP 2"]),
    (dict(hidden_size=100, num_attention_heads=8), ["hidden_size 100", "8"]),
    (dict(num_query_groups=3), ["num_query_groups 3", "num_attention_heads 4"]),
    (dict(num_query_groups=1, tensor_model_parallel_size=2), ["num_query_groups 1", "TP 2"]),
    (dict(sequence_parallel=True), ["sequence_parallel", "TP > 1"]),
    (dict(num_layers_per_virtual_pipeline_stage=1), ["needs PP > 1"]),
    (dict(num_layers=8, pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=3),
     ["PP 2 x num_layers_per_virtual_pipeline_stage 3 = 6"]),
    (dict(num_layers=8, pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=2,
          global_batch_size=3, micro_batch_size=1), ["microbatches (3", "PP 2"]),
    (dict(seq_length=256), ["seq_length 256", "max_position_embeddings 128"]),
    (dict(micro_batch_size=0), ["micro_batch_size=0 must be positive"]),
    (dict(precision="fp8"), ["precision='fp8'"]),
    (dict(recompute_granularity="some"), ["recompute_granularity='some'"]),
    (dict(attention_backend="sdpa"), ["attention_backend='sdpa'"]),
    (dict(device="tpu"), ["device='tpu'"]),
    (dict(backend="k8s"), ["backend='k8s'"]),
    (dict(precision="bf16"), ["precision='bf16' does not run on device='cpu'"]),
    (dict(name="a b;rm -rf"), ["name='a b;rm -rf'"]),
    (dict(torch_profiler_ranks=(5,)), ["torch_profiler_ranks"]),
])
def test_each_rule_names_its_numbers(kw, needles):
    msg = rules_broken(**kw)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"


def test_all_violations_reported_at_once():
    with pytest.raises(ConfigError) as e:
        make(num_attention_heads=3, hidden_size=100, seq_length=512, sequence_parallel=True)
    assert len(e.value.violations) >= 4


def test_unknown_keys_listed_against_valid_ones():
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict({"name": "x", "tensor_parallel": 2})
    msg = str(e.value)
    assert "tensor_parallel" in msg and "tensor_model_parallel_size" in msg
    assert "Valid fields are" in msg


def test_tp_across_nodes_is_a_warning_not_an_error():
    with pytest.warns(UserWarning, match="TP 4 > gpus_per_node 2"):
        cfg = make(nodes=2, gpus_per_node=2, tensor_model_parallel_size=4)
    assert cfg.dp == 1


def test_gpu_only_features_allowed_on_cuda():
    cfg = make(device="cuda", precision="bf16", attention_backend="flash",
               tensor_model_parallel_size=2)
    assert cfg.precision == "bf16"
    # sequence_parallel on CUDA also needs Transformer Engine or Apex: tests/test_engine_gpu_path.py


def test_frozen_and_replace_revalidates():
    cfg = make()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.nodes = 3  # type: ignore[misc]
    with pytest.raises(ConfigError):
        cfg.replace(micro_batch_size=3)
    with pytest.raises(ConfigError, match="unknown RunConfig field"):
        cfg.replace(tp=2)


def test_megatron_flags_are_mechanical():
    assert MEGATRON_FLAGS["tensor_model_parallel_size"] == "--tensor-model-parallel-size"
    assert MEGATRON_FLAGS["micro_batch_size"] == "--micro-batch-size"
    assert "name" not in MEGATRON_FLAGS


def test_bad_json_is_a_config_error(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        RunConfig.from_json(p)
    with pytest.raises(ConfigError, match="cannot read"):
        RunConfig.from_json(tmp_path / "missing.json")


def test_divisors_are_exact_and_never_hang():
    from labkit.rules import divisors, shown_divisors

    for n in range(1, 400):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0], n
    assert divisors(2**61 - 1) == [1, 2**61 - 1]  # a large prime: answered at once
    assert len(divisors(2**40 * 3**20)) == 41 * 21
    with pytest.raises(ConfigError, match="cannot list the divisors"):
        divisors((2**61 - 1) * (2**31 - 1) * 1_000_003**2)
    assert shown_divisors(720720).endswith("and 228 more")
    # An absurd world size is a clear error (bounded before any layout arithmetic), not a hang.
    msg = rules_broken(nodes=(2**61 - 1), gpus_per_node=1, tensor_model_parallel_size=2)
    assert "nodes=2305843009213693951 must be between 1 and 100,000" in msg
    msg = rules_broken(nodes=99_991, gpus_per_node=7, tensor_model_parallel_size=2)
    assert "does not divide world size 699937" in msg


def test_every_field_has_a_docstring_and_parallelism_comes_first():
    import ast
    import inspect

    import labkit.config as config

    tree = ast.parse(inspect.getsource(config.RunConfig))
    body = tree.body[0].body
    documented = {stmt.target.id for stmt, nxt in zip(body, body[1:], strict=False)
                  if isinstance(stmt, ast.AnnAssign) and isinstance(nxt, ast.Expr)
                  and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)}
    assert set(FIELD_NAMES) - documented == set()
    assert FIELD_NAMES[:4] == ("nodes", "gpus_per_node", "tensor_model_parallel_size",
                               "pipeline_model_parallel_size")
    assert "profile" not in FIELD_NAMES


def test_torch_profiler_switch_and_old_config_files(tmp_path):
    assert MEGATRON_FLAGS["torch_profiler"] == "--profile"  # Megatron-LM's switch
    assert "torch_profiler_ranks" not in MEGATRON_FLAGS
    with pytest.raises(ConfigError, match="did you mean 'torch_profiler'"):
        RunConfig.from_dict({"name": "t", "profile": True})
    with pytest.raises(ConfigError, match="did you mean 'torch_profiler_ranks'"):
        RunConfig.from_dict({"profile_ranks": [0]})
    # A config.json that an older labkit wrote under runs/ is still read.
    old = json.loads(make(nodes=2).to_json())
    old.pop("torch_profiler"), old.pop("torch_profiler_ranks")
    old.update(profile=True, profile_ranks=[0, 3])
    path = tmp_path / "config.json"
    path.write_text(json.dumps(old))
    cfg = RunConfig.from_json(path)
    assert cfg.torch_profiler is True and cfg.torch_profiler_ranks == (0, 3)
    assert "must be True or False" in rules_broken(torch_profiler="yes")


def test_a_bad_value_does_not_hide_the_other_broken_rules():
    """micro_batch_size 0 is reported, and so is the TP that does not divide the world."""
    with pytest.raises(ConfigError) as e:
        RunConfig(name="z", micro_batch_size=0, nodes=2, gpus_per_node=2,
                  tensor_model_parallel_size=3)
    v = e.value.violations
    assert v[0].startswith("micro_batch_size=0")
    assert any("TP x PP = 3 x 1 = 3 does not divide world size 4" in m for m in v)
    # no message shows a number the user did not write (the default micro batch is 2)
    assert not any("micro" in m for m in v[1:])
