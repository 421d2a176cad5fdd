"""The GPU path of code/pretrain_gpt.py, checked without a GPU: every choice that differs on
CUDA is made by a function tested here, and the model is built in bf16/fp16 for real.

The runs on a GPU that prove the same things are in tests/test_gpu.py (``make gpu-check``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CODE = REPO / "code"
sys.path.insert(0, str(CODE))

from labkit.config import RunConfig  # noqa: E402
from labkit.planner import stage_memory  # noqa: E402
from labkit.planner.memory import attention_kernel, keeps_attention_scores  # noqa: E402
from labkit.rules import fused_norms_missing  # noqa: E402


def _cfg(**kw) -> RunConfig:
    base = dict(nodes=1, gpus_per_node=2, num_layers=4, hidden_size=64, num_attention_heads=4,
                seq_length=64, max_position_embeddings=64, micro_batch_size=2,
                global_batch_size=8)
    base.update(kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return RunConfig(**base)


# --- attention: one decision for the engine and the planner ---------------------------------
def test_attention_kernel_follows_the_backend():
    assert attention_kernel(_cfg(attention_backend="unfused")) == "local"
    assert attention_kernel(_cfg(attention_backend="flash")) == "sdpa"  # CPU: never TE
    gpu = _cfg(attention_backend="flash", device="cuda", precision="bf16")
    assert attention_kernel(gpu, transformer_engine=False) == "sdpa"
    assert attention_kernel(gpu, transformer_engine=True) == "te"
    assert attention_kernel(gpu.replace(attention_backend="unfused"),
                            transformer_engine=True) == "local"
    assert keeps_attention_scores("local") and not keeps_attention_scores("sdpa")


def test_planner_activations_follow_the_attention_kernel():
    base = _cfg(seq_length=512, max_position_embeddings=512, device="cuda", precision="bf16")
    unfused = stage_memory(base, 0)
    flash = stage_memory(base.replace(attention_backend="flash"), 0)
    s, b, a, layers = 512, 2, 4, 4
    # unfused keeps fp32 softmax + a bf16 copy (6 bytes) per score, flash 4 bytes per row
    per_layer = (6 * a * s * s * b - 4 * a * s * b)
    assert (unfused.activations - flash.activations) * 1e9 == pytest.approx(layers * per_layer,
                                                                            rel=1e-9)
    # megatron's unfused attention also keeps its score buffer (b x a x s x s, bf16) allocated
    assert (unfused.startup - flash.startup) * 1e9 == pytest.approx(b * a * s * s * 2)


def test_engine_builds_the_spec_the_planner_assumes():
    pytest.importorskip("megatron.core")
    from engine_attention import SDPAttention, layer_spec

    spec, line = layer_spec(_cfg(attention_backend="flash"))
    assert spec.submodules.self_attention.submodules.core_attention is SDPAttention
    assert line.startswith("attention: sdpa = torch scaled_dot_product_attention")
    spec, line = layer_spec(_cfg(attention_backend="unfused"))
    assert spec.submodules.self_attention.submodules.core_attention.__name__ == \
        "DotProductAttention"
    assert line.startswith("attention: local = megatron-core DotProductAttention")


# --- choices that differ on CUDA ----------------------------------------------------------------
def test_pipeline_p2p_is_unbatched_on_every_device():
    import engine_model

    for device, precision in (("cpu", "fp32"), ("cuda", "bf16")):
        plain = _cfg(device=device, precision=precision, pipeline_model_parallel_size=2)
        inter = plain.replace(num_layers_per_virtual_pipeline_stage=1)
        for cfg in (plain, inter):
            tcfg = engine_model.transformer_config(cfg, on_cuda=device == "cuda")
            assert tcfg.batch_p2p_comm is False, (device, cfg.vpp)
            assert tcfg.overlap_p2p_comm is False, (device, cfg.vpp)
            assert tcfg.deallocate_pipeline_outputs is True


def test_dp_reduces_gradients_during_backward():
    import engine_model

    assert engine_model.ddp_config(_cfg()).overlap_grad_reduce is True  # DP 2
    tp2 = _cfg(tensor_model_parallel_size=2)
    assert engine_model.ddp_config(tp2).overlap_grad_reduce is False  # DP 1: nothing to reduce
    assert engine_model.ddp_config(_cfg(device="cuda", precision="bf16")).grad_reduce_in_fp32


def test_cuda_env_and_timeout():
    from engine_memory import DIST_TIMEOUT_S, cuda_env, dist_timeout

    tp2 = _cfg(tensor_model_parallel_size=2, device="cuda", precision="bf16")
    assert cuda_env(tp2, on_cuda=True) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert cuda_env(tp2.replace(tensor_model_parallel_size=1), on_cuda=True) == {}
    assert cuda_env(_cfg(tensor_model_parallel_size=2), on_cuda=False) == {}
    assert dist_timeout().total_seconds() == DIST_TIMEOUT_S < 600  # under NCCL's 10 min


def test_batches_stay_unpinned_on_cpu():
    import torch
    from engine_data import to_device

    batch = {"tokens": torch.arange(4).view(1, 4)}
    assert to_device(batch, on_cuda=False) is batch
    assert not batch["tokens"].is_pinned()


def test_sequence_parallel_on_cuda_needs_te_or_apex(monkeypatch):
    import importlib.util

    cfg = _cfg(device="cuda", precision="bf16", tensor_model_parallel_size=2,
               sequence_parallel=True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("transformer_engine", "apex")
                        else real(name, *a))
    (msg,) = fused_norms_missing(cfg)
    assert "Transformer Engine or Apex" in msg and "sequence_parallel=False" in msg
    with pytest.warns(UserWarning, match="sequence_parallel=True needs Transformer Engine"):
        RunConfig(**{**cfg.to_dict(), "name": "sp"})
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "apex" else real(name, *a))
    assert fused_norms_missing(cfg) == []


def test_engine_refuses_sequence_parallel_without_fused_norms(tmp_path):
    cfg = _cfg(device="cuda", precision="bf16", tensor_model_parallel_size=2,
               sequence_parallel=True, gpus_per_node=2, name="sp")
    if not fused_norms_missing(cfg):
        pytest.skip("Transformer Engine or Apex is installed here")
    (tmp_path / "sp").mkdir()
    cfg.to_json(tmp_path / "sp" / "config.json")
    out = subprocess.run([sys.executable, str(CODE / "pretrain_gpt.py"), "--config",
                          str(tmp_path / "sp" / "config.json")], capture_output=True, text=True,
                         timeout=120, env={"WORLD_SIZE": "2", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 2
    # The GPU check comes first on a machine without CUDA; with CUDA the TE/Apex message.
    assert "torch sees no GPU" in out.stderr or "Transformer Engine or Apex" in out.stderr
    assert (tmp_path / "sp" / "exit_code").read_text().strip() == "2"


def test_adam_step_fix_only_for_torch_adam_under_the_distributed_optimizer():
    import torch
    from engine_ckpt import needs_adam_step_fix

    class Opt:  # megatron-core's optimizer interface: .config and .optimizer
        def __init__(self, inner, distributed):
            self.optimizer = inner
            self.config = type("C", (), {"use_distributed_optimizer": distributed})()

    p = [torch.nn.Parameter(torch.zeros(2))]
    assert needs_adam_step_fix(Opt(torch.optim.AdamW(p), True))
    assert not needs_adam_step_fix(Opt(torch.optim.AdamW(p), False))
    assert not needs_adam_step_fix(Opt(torch.optim.SGD(p, lr=0.1), True))  # e.g. a FusedAdam


# --- bf16 / fp16: the model really built, in a fresh process ------------------------------------
_BUILD = r"""
import json, os, sys
sys.path.insert(0, {code!r}); sys.path.insert(0, {repo!r})
import cpu_compat, torch
cpu_compat.apply()
# one process: its store lives in it (no TCP port to pick, nothing another process can take)
torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0,
                                     world_size=1)
from megatron.core import parallel_state as ps
from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
import engine_model
from labkit.config import RunConfig
os.environ["LABKIT_DIST_TIMEOUT_S"] = "123"
engine_model.init_model_parallel(RunConfig(name="b", nodes=1, gpus_per_node=1))
model_parallel_cuda_manual_seed(1)
tp_group = ps.get_tensor_model_parallel_group()
out = {{"tp_timeout_s": tp_group._get_backend(torch.device("cpu")).options._timeout.total_seconds()}}
for precision in ("bf16", "fp16"):
    cfg = RunConfig(name="b", nodes=1, gpus_per_node=1, device="cuda", precision=precision,
                    num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32,
                    max_position_embeddings=32, micro_batch_size=2, global_batch_size=2,
                    attention_backend="flash")
    model, _ = engine_model.build_model(cfg, on_cuda=False)
    inner = model[0].module
    tensors = list(inner.named_parameters()) + list(inner.named_buffers())
    r = {{"wrapper": type(inner).__name__,
         "dtypes": sorted({{str(t.dtype) for n, t in tensors if t.is_floating_point()}}),
         "n": len(tensors)}}
    if precision == "bf16":
        tok = torch.randint(0, 4000, (2, 32))
        pos = torch.arange(32).repeat(2, 1)
        loss = model[0](tok, pos, None, labels=tok)
        r["loss_dtype"] = str(loss.dtype)
        r["loss"] = float(loss.float().mean())
    out[precision] = r
print(json.dumps(out), flush=True)
ps.destroy_model_parallel()
torch.distributed.destroy_process_group()
from engine_stop import end_process
end_process(0)  # not the interpreter's teardown: code/engine_stop.py says why
"""


def test_bf16_and_fp16_models_are_all_half_and_bf16_runs_forward():
    script = _BUILD.format(code=str(CODE), repo=str(REPO))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["bf16"]["wrapper"] == "Float16Module" and r["fp16"]["wrapper"] == "Float16Module"
    # Every floating parameter and buffer, position embeddings and LayerNorms included.
    assert r["bf16"]["dtypes"] == ["torch.bfloat16"]
    assert r["fp16"]["dtypes"] == ["torch.float16"]
    assert r["bf16"]["n"] > 10
    # Float16Module hands the last stage's per-token loss back in fp32.
    assert r["bf16"]["loss_dtype"] == "torch.float32"
    assert 7.0 < r["bf16"]["loss"] < 10.0  # ~ln(4096) = 8.3 for an untrained model
    # megatron's model-parallel groups get the engine's timeout (LABKIT_DIST_TIMEOUT_S), not
    # megatron's 30-minute default
    assert r["tp_timeout_s"] == 123.0


# --- the GPU path's speed: fusions, switches, the model-parallel timeout ------------------------
def test_torch_compile_fusions_only_on_cuda_and_asked(monkeypatch):
    import engine_model

    monkeypatch.setenv("LABKIT_FUSIONS", "1")
    names = ("bias_activation_fusion", "bias_dropout_fusion", "cross_entropy_loss_fusion")
    gpu = _cfg(device="cuda", precision="bf16")
    for cfg in (gpu, gpu.replace(swiglu=True)):  # bias-GELU and bias-SwiGLU both validate
        tcfg = engine_model.transformer_config(cfg, on_cuda=True)
        assert all(getattr(tcfg, n) for n in names), cfg.swiglu
        assert tcfg.cross_entropy_fusion_impl == "native"  # megatron-core's own, not TE's
        # the fusions that need Apex or Transformer Engine stay off
        assert not (tcfg.masked_softmax_fusion or tcfg.gradient_accumulation_fusion
                    or tcfg.persist_layer_norm)
    assert engine_model.fusions_line(tcfg).startswith("fusions: bias-SwiGLU, bias-dropout-add")
    cpu = engine_model.transformer_config(_cfg(), on_cuda=False)
    assert not any(getattr(cpu, n) for n in names)
    assert engine_model.fusions_line(cpu) == "fusions: none (plain PyTorch element-wise ops)"
    for value in ("0", None):  # asked off, or not asked: off (slower on an H100, measured)
        if value is None:
            monkeypatch.delenv("LABKIT_FUSIONS")
        else:
            monkeypatch.setenv("LABKIT_FUSIONS", value)
        assert not any(getattr(engine_model.transformer_config(gpu, on_cuda=True), n) for n in names)


def test_megatron_jit_fuser_is_torch_compile():
    """What the fusions above compile with (megatron-core 0.16: torch.compile for torch >= 2.2)."""
    import torch
    from megatron.core import jit

    assert jit.jit_fuser is torch.compile


def test_engine_switches_and_cpu_env(monkeypatch):
    from engine_memory import cpu_env, run_switch

    assert cpu_env(on_cuda=False) == {"CUDA_VISIBLE_DEVICES": ""}  # a cpu run hides any GPU
    assert cpu_env(on_cuda=True) == {}
    for value, on in (("0", False), ("false", False), ("no", False), ("1", True), ("", True)):
        monkeypatch.setenv("LABKIT_INSTRUMENT", value)
        assert run_switch("LABKIT_INSTRUMENT") is on, value
    monkeypatch.delenv("LABKIT_INSTRUMENT")
    assert run_switch("LABKIT_INSTRUMENT") is True
    assert run_switch("LABKIT_INSTRUMENT", default=False) is False  # unset: the default
    monkeypatch.setenv("LABKIT_INSTRUMENT", "1")
    assert run_switch("LABKIT_INSTRUMENT", default=False) is True


def test_cpu_peak_memory_restarts_before_the_last_iteration():
    from engine_log import MemoryMeter

    meter = MemoryMeter(on_cuda=False)
    block = bytearray(300 * 2**20)
    block[:: 4096] = b"x" * len(block[:: 4096])  # touch every page: resident
    high = meter.read()["max allocated"]
    del block
    meter.reset_peak()
    low = meter.read()["max allocated"]
    assert high - low > 250, (high, low)  # MB: the 300 MB block is no longer the peak


# --- real trainings: the attention backend changes the engine, not the loss -----------------------
STATIC_RE = re.compile(r"\[labkit\] static memory on \(tensor, pipeline\) rank \((\d+), (\d+)\) "
                       r"after iteration \d+: ([\d.]+) GB in live tensors, planner ([\d.]+) GB")


def static_memory(log: str) -> dict[tuple[int, int], tuple[float, float]]:
    """(tp, pp) -> (measured, planned) GB from the engine's static-memory lines."""
    return {(int(t), int(p)): (float(m), float(q)) for t, p, m, q in STATIC_RE.findall(log)}


@pytest.mark.engine
@pytest.mark.parametrize("layout", [dict(tensor_model_parallel_size=2),
                                    dict(pipeline_model_parallel_size=2)], ids=["tp2", "pp2"])
def test_flash_and_unfused_attention_agree(tmp_path, layout):
    from engine_runs import losses, train

    common = dict(train_iters=4, log_interval=1, lr_warmup_iters=1, **layout)
    runs = {}
    for backend in ("unfused", "flash"):
        run_dir = train(tmp_path, backend, attention_backend=backend, **common)
        log = (run_dir / "log.txt").read_text()
        kernel = "sdpa = torch scaled_dot_product_attention" if backend == "flash" else \
            "local = megatron-core DotProductAttention"
        assert f"[labkit] attention: {kernel}" in log
        assert log.count("[labkit] attention:") == 1
        runs[backend] = losses(run_dir)
        # the planner's static memory (with megatron's score buffer only when unfused)
        for rank, (measured, planned) in static_memory(log).items():
            assert planned == pytest.approx(measured, rel=0.10), (backend, rank)
    assert sorted(runs["flash"]) == [1, 2, 3, 4]
    for it in range(1, 5):
        assert runs["flash"][it] == pytest.approx(runs["unfused"][it], abs=2e-3), it


def test_cuda_oom_line_is_diagnosed_as_gpu_oom():
    import torch
    from engine_memory import oom_line

    from labkit.logs.failures import match_line

    # torch's CUDA allocator message (c10/cuda/CUDACachingAllocator.cpp format)
    exc = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
                                 "total capacity of 79.10 GiB of which 1.50 GiB is free.")
    line = oom_line(rank=0, tp_rank=0, pp_rank=0, phase="forward-backward", iteration=1,
                    exc=exc, limit_gb=12.0, on_cuda=True)
    assert "tried to allocate 2147483648 bytes (CUDA, device memory cap 12.0 GB)" in line
    assert match_line(line, 0).kind == "gpu_oom"
    cpu = oom_line(rank=0, tp_rank=0, pp_rank=0, phase="forward-backward", iteration=1,
                   exc=RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to "
                                    "allocate 64 bytes"), limit_gb=0.2)
    assert "(memory_limit_gb=0.2)" in cpu and match_line(cpu, 0).kind == "host_oom"
