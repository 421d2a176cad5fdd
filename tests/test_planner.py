"""The planner's contracts: plan JSON, memory bookkeeping, bubble, layouts, CLI (pure, fast)."""

from __future__ import annotations

import json
import sys
import warnings

import pytest

from labkit import cli
from labkit.config import RunConfig
from labkit.planner import (
    HARDWARE,
    bubble_fraction,
    comm_volume,
    estimate_iteration_time,
    format_layouts,
    param_counts,
    plan,
    plan_layouts,
    stage_memory,
    stage_params,
)
from labkit.planner.memory import (
    ALLOCATOR_FACTOR,
    CONTEXT_GB,
    CPU_CAP_OVERHEAD_GB,
    in_flight_microbatches,
)

STAGE_KEYS = {"weights", "gradients", "optimizer", "startup", "activations", "logits", "total"}


def _cfg(**kw) -> RunConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return RunConfig(**kw)


def test_plan_json_is_exactly_the_design_contract():
    d = plan(_cfg(nodes=2, gpus_per_node=2, tensor_model_parallel_size=2,
                  pipeline_model_parallel_size=2)).to_dict()
    # DESIGN.md section 5, plus the one documented extra key "required_gb".
    assert set(d) == {"layout", "num_microbatches", "memory_gb", "gpu_memory_gb", "fits",
                      "flops_per_iteration", "hardware_flops_per_iteration", "bubble_fraction",
                      "required_gb"}
    assert d["layout"] == {"world_size": 4, "tp": 2, "pp": 2, "dp": 1, "vpp": 1}
    assert d["num_microbatches"] == 4
    assert set(d["memory_gb"]) == {"first_stage", "last_stage", "peak"}
    for stage in ("first_stage", "last_stage"):
        st = d["memory_gb"][stage]
        assert set(st) == STAGE_KEYS
        assert st["total"] == pytest.approx(sum(v for k, v in st.items() if k != "total"))
    assert d["memory_gb"]["peak"] == max(d["memory_gb"]["first_stage"]["total"],
                                         d["memory_gb"]["last_stage"]["total"])
    assert d["bubble_fraction"] == pytest.approx(1 / 4)
    assert d["fits"] is True
    json.dumps(d)  # plain JSON types only


def test_bytes_per_parameter_by_precision_and_optimizer():
    # Megatron-LM's own rule (theoretical_memory_usage.py) for bf16: 18 bytes per parameter, or
    # 6 + 12/DP with the distributed optimizer. fp32 has no master copy: 4 + 4 + 8.
    base = dict(num_layers=4, hidden_size=256, num_attention_heads=4, nodes=1, gpus_per_node=4,
                global_batch_size=8, micro_batch_size=2)
    for fields, per_param in [
        (dict(precision="bf16", device="cuda"), 18),
        (dict(precision="bf16", device="cuda", use_distributed_optimizer=True), 6 + 12 / 4),
        (dict(precision="fp32"), 16),
        (dict(precision="fp32", use_distributed_optimizer=True), 8 + 8 / 4),
    ]:
        cfg = _cfg(**base, **fields)
        st = stage_memory(cfg, 0)
        n = stage_params(cfg, 0)
        assert (st.weights + st.gradients + st.optimizer) * 1e9 == pytest.approx(n * per_param)


def test_first_stage_has_embeddings_last_stage_logits():
    cfg = _cfg(nodes=1, gpus_per_node=2, pipeline_model_parallel_size=2, vocab_size=4096)
    first, last = stage_memory(cfg, 0), stage_memory(cfg, 1)
    assert first.logits == 0 and last.logits > 0
    # fp32 run: the in-place cross entropy keeps one fp32 copy of s x b x V logits.
    assert last.logits * 1e9 == cfg.seq_length * cfg.micro_batch_size * 4096 * 4
    # bf16 adds the output layer's half-precision logits.
    half = _cfg(nodes=1, gpus_per_node=2, pipeline_model_parallel_size=2, vocab_size=4096,
                precision="bf16", device="cuda")
    assert stage_memory(half, 1).logits * 1e9 == half.seq_length * half.micro_batch_size * 4096 * 6
    # Tied embeddings with PP > 1: the last stage holds a copy of the word embeddings.
    counts = param_counts(cfg)
    assert counts[(0, 1)] - counts[(0, 0)] == (
        2 * cfg.hidden_size - cfg.max_position_embeddings * cfg.hidden_size)


def test_in_flight_microbatches_follow_the_schedules():
    cfg = _cfg(num_layers=8, nodes=1, gpus_per_node=4, pipeline_model_parallel_size=4,
               global_batch_size=16, micro_batch_size=1)  # m = 16
    assert [in_flight_microbatches(cfg, r) for r in range(4)] == [4, 3, 2, 1]  # 1F1B: p - r
    few = cfg.replace(global_batch_size=2)  # m = 2 < p
    assert [in_flight_microbatches(few, r) for r in range(4)] == [2, 2, 2, 1]
    inter = cfg.replace(num_layers_per_virtual_pipeline_stage=1)  # v = 2 chunks of 1 layer
    # megatron's interleaved warm-up: 2(p - r - 1) + (v - 1)p, plus one in the steady state.
    assert [in_flight_microbatches(inter, r) for r in range(4)] == [11, 9, 7, 5]
    # Korthikanti: the first stage holds L·(1 + (p-1)/(p·v)) layers' worth; here 11 chunks of
    # one layer = 8 x (1 + 3/8) layers.
    assert 11 * 1 == 8 * (1 + 3 / 8)


def test_bubble_fraction():
    cfg = _cfg(num_layers=8, nodes=1, gpus_per_node=4, pipeline_model_parallel_size=4,
               global_batch_size=8, micro_batch_size=1)
    assert bubble_fraction(cfg) == pytest.approx(3 / 8)
    assert bubble_fraction(cfg.replace(num_layers_per_virtual_pipeline_stage=1)) == \
        pytest.approx(3 / 16)
    assert bubble_fraction(cfg.replace(pipeline_model_parallel_size=1)) == 0


def test_recompute_and_sequence_parallel_shrink_activations():
    base = _cfg(num_layers=4, hidden_size=256, num_attention_heads=8, seq_length=512,
                max_position_embeddings=512, nodes=1, gpus_per_node=2,
                tensor_model_parallel_size=2, precision="bf16", device="cuda")
    none = stage_memory(base, 0).activations
    sel = stage_memory(base.replace(recompute_granularity="selective"), 0).activations
    full = stage_memory(base.replace(recompute_granularity="full"), 0).activations
    sp = stage_memory(base.replace(sequence_parallel=True), 0).activations
    flash = stage_memory(base.replace(attention_backend="flash"), 0).activations
    assert full < sel < none and sp < none and flash < none


def test_fits_uses_the_documented_margin():
    cfg = _cfg(gpu_memory_gb=80.0, device="cpu")
    p = plan(cfg)
    assert p.required_gb == pytest.approx(p.peak_gb * ALLOCATOR_FACTOR + CONTEXT_GB["cpu"])
    tight = cfg.replace(gpu_memory_gb=round(p.required_gb * 0.99, 6))
    assert not plan(tight).fits
    assert plan(cfg.replace(gpu_memory_gb=round(p.required_gb * 1.01, 6))).fits
    # On CPU with a memory budget, what comes after model and optimizer build counts.
    capped = plan(cfg.replace(memory_limit_gb=1.0))
    later = max(s.optimizer + s.startup + s.activations + s.logits for s in (capped.first_stage,
                                                                 capped.last_stage))
    assert capped.gpu_memory_gb == 1.0
    assert capped.required_gb == pytest.approx(later * ALLOCATOR_FACTOR + CPU_CAP_OVERHEAD_GB)


def test_a_1_3b_model_does_not_fit_on_a_small_gpu_but_fits_when_split():
    cfg = RunConfig.from_preset("gpt-1.3b", device="cuda", precision="bf16", nodes=1,
                                gpus_per_node=8, gpu_memory_gb=16.0, micro_batch_size=1,
                                global_batch_size=8)
    assert not plan(cfg).fits  # ~1.3e9 x 18 bytes = 24 GB of states alone
    split = cfg.replace(tensor_model_parallel_size=4, pipeline_model_parallel_size=2,
                        use_distributed_optimizer=True)
    assert plan(split).fits


def test_plan_layouts_lists_valid_fitting_first_with_reasons():
    layouts = plan_layouts(nodes=1, gpus_per_node=10, model="gpt2-124m", gpu_memory_gb=80,
                           global_batch_size=20)
    by = {(lp.tp, lp.pp, lp.vpp): lp for lp in layouts}
    bad = by[(1, 5, 1)]
    assert not bad.valid and any("num_layers 12 is not divisible by PP 5" in r
                                 for r in bad.reasons)
    assert not by[(5, 1, 1)].valid and any("num_attention_heads 12 is not divisible by TP 5"
                                           in r for r in by[(5, 1, 1)].reasons)
    states = [(lp.valid, lp.fits) for lp in layouts]
    first_invalid = states.index((False, False))
    assert all(v for v, _ in states[:first_invalid]) and not any(v for v, _ in
                                                                 states[first_invalid:])
    fits = [f for _, f in states[:first_invalid]]
    assert fits == sorted(fits, reverse=True)
    # Interleaved candidates are there too (12 layers, PP 2: 2, 3 or 6 virtual stages).
    assert {lp.vpp for lp in layouts if lp.pp == 2 and lp.valid} == {1, 2, 3, 6}


def test_plan_layouts_flags_tp_across_nodes_and_accepts_a_runconfig():
    model = _cfg(num_layers=4, hidden_size=128, num_attention_heads=4, global_batch_size=8)
    layouts = plan_layouts(nodes=2, gpus_per_node=2, model=model, micro_batch_size=1)
    tp4 = [lp for lp in layouts if lp.tp == 4]
    assert tp4 and all(lp.tp_crosses_nodes for lp in tp4)
    assert not any(lp.tp_crosses_nodes for lp in layouts if lp.tp <= 2)
    assert all(lp.est_iteration_s > 0 for lp in layouts if lp.valid)
    # TP=2 on 3 GPUs per node: rank pair (2, 3) straddles nodes 0 and 1.
    odd = plan_layouts(nodes=2, gpus_per_node=3, model=model, micro_batch_size=1,
                       global_batch_size=12)
    assert all(lp.tp_crosses_nodes for lp in odd if lp.tp == 2)
    table = format_layouts(layouts)
    assert "TP crosses nodes" in table and table.splitlines()[0].split()[:4] == ["TP", "PP", "DP",
                                                                                   "VPP"]


def test_comm_volume_and_estimate():
    cfg = _cfg(nodes=2, gpus_per_node=2, tensor_model_parallel_size=2,
               pipeline_model_parallel_size=1)  # DP 2 across nodes, TP inside
    c = comm_volume(cfg)
    assert set(c) == {"tp", "pp", "dp"}
    assert c["tp"]["crosses_nodes"] is False and c["dp"]["crosses_nodes"] is True
    e = 4  # fp32
    sbh = cfg.seq_length * cfg.micro_batch_size * cfg.hidden_size * e
    m = cfg.num_microbatches
    # 4 all-reduces per layer and microbatch, each sending 2(t-1)/t of the message.
    assert c["tp"]["bytes_per_rank"] == pytest.approx(4 * cfg.num_layers * m * sbh)
    assert c["pp"]["bytes_per_rank"] == 0
    assert c["dp"]["bytes_per_rank"] == pytest.approx(stage_params(cfg, 0) * 4)
    est = estimate_iteration_time(cfg, "cpu-lab")
    assert est["estimate"] is True and "estimate" in est["note"]
    assert est["iteration_s"] == pytest.approx(est["compute_s"] + est["bubble_s"]
                                               + sum(est["comm_s"].values()))
    assert est["comm_s"]["dp"] == pytest.approx(c["dp"]["bytes_per_rank"]
                                                / (HARDWARE["cpu-lab"].inter_node_gbps * 1e9))


def _run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_plan_config_json(tmp_path, capsys):
    path = tmp_path / "c.json"
    _cfg(name="p", nodes=2, gpus_per_node=2, pipeline_model_parallel_size=2).to_json(path)
    rc, out, _ = _run_cli(capsys, "plan", str(path), "--json")
    assert rc == 0
    d = json.loads(out)
    assert d["layout"]["pp"] == 2 and d == json.loads(json.dumps(plan(RunConfig.from_json(
        path)).to_dict()))
    rc, out, _ = _run_cli(capsys, "plan", str(path))
    assert rc == 0 and "first stage" in out and "bubble" in out


def test_cli_plan_world_size_table_and_json(capsys):
    rc, out, err = _run_cli(capsys, "plan", "--world-size", "4", "--preset", "tiny",
                            "--gpu-memory-gb", "8")
    # the first line says what was assumed: a GPU memory size means GPUs, in the gpu profile's
    # precision and batch
    first, header = out.splitlines()[:2]
    assert rc == 0 and header.split()[:2] == ["TP", "PP"] and "microbatches" in header.split()
    assert first.startswith("tiny on 1 node(s) x 4 GPU(s) = 4 ranks; device cuda, precision bf16")
    assert "valid layouts" in first
    rc, out, _ = _run_cli(capsys, "plan", "--world-size", "4", "--preset", "tiny", "--json")
    rows = json.loads(out)
    assert rows and all(r["valid"] for r in rows)
    assert {(r["tp"], r["pp"]) for r in rows} >= {(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (1, 4)}
    rc, out, err = _run_cli(capsys, "plan", "--world-size", "8", "--preset", "gpt2-124m",
                            "--gpu-memory-gb", "80", "--json")
    rows = json.loads(out)
    assert "8 GPU(s)" in err and "precision bf16" in err
    pure_dp = next(r for r in rows if (r["tp"], r["pp"]) == (1, 1))
    # bf16 with Adam: 18 bytes per parameter of GPT-2 124M (+ position embeddings) ~ 2.2 GB.
    states = sum(pure_dp["plan"]["memory_gb"]["first_stage"][k]
                 for k in ("weights", "gradients", "optimizer"))
    assert states == pytest.approx(124.4e6 * 18 / 1e9, rel=0.03)


def test_cli_plan_errors_exit_2_with_the_numbers(tmp_path, capsys):
    rc, _, err = _run_cli(capsys, "plan")
    assert rc == 2 and "--world-size" in err
    rc, _, err = _run_cli(capsys, "plan", "--world-size", "6", "--nodes", "4")
    assert rc == 2 and "world size 6 is not nodes 4" in err
    rc, _, err = _run_cli(capsys, "plan", "--world-size", "0")
    assert rc == 2 and "--world-size" in err and "at least 1" in err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"nodes": 1, "gpus_per_node": 3, "tensor_model_parallel_size": 2}))
    rc, _, err = _run_cli(capsys, "plan", str(bad), "--json")
    assert rc == 2 and "does not divide world size 3" in err



def test_cli_plan_of_a_350m_model_on_16_gpus_plans_gpus_and_keeps_pure_data_parallel(capsys):
    rc, out, _ = _run_cli(capsys, "plan", "--world-size", "16", "--preset", "gpt2-350m",
                          "--gpu-memory-gb", "80")
    lines = out.splitlines()
    assert rc == 0
    assert lines[0].startswith("gpt2-350m on 2 node(s) x 8 GPU(s) = 16 ranks; device cuda, "
                               "precision bf16, global batch 64, micro batch 4, 80 GB per GPU")
    pure_dp = [ln.split() for ln in lines[3:] if ln.split()[:4] == ["1", "1", "16", "1"]]
    assert len(pure_dp) == 1 and pure_dp[0][8] == "yes", pure_dp  # valid, and it fits
    rc, out, _ = _run_cli(capsys, "plan", "--world-size", "16", "--preset", "gpt2-350m",
                          "--profile", "cpu")
    assert rc == 0 and "device cpu, precision fp32" in out.splitlines()[0]

def test_planner_does_not_import_torch():
    import subprocess

    code = ("import sys, labkit.planner as p; p.plan_layouts(nodes=2, gpus_per_node=2); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
