"""code/cpu_compat.py: what it redirects, that it is idempotent, and that CUDA machines skip it.

The patches change torch process-wide, so each check runs in a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CODE = Path(__file__).resolve().parents[1] / "code"
sys.path.insert(0, str(CODE))

import cpu_compat  # noqa: E402


def _run(body: str) -> dict:
    script = f"import json, sys\nsys.path.insert(0, {str(CODE)!r})\nimport torch, cpu_compat\n{body}"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_guard_applies_only_without_cuda():
    assert cpu_compat.needs_cpu_redirect(cuda_available=False) is True
    assert cpu_compat.needs_cpu_redirect(cuda_available=True) is False


def test_apply_redirects_megatrons_cuda_assumptions_once():
    r = _run("""
first = cpu_compat.apply()
second = cpu_compat.apply()
from megatron.core.tensor_parallel import random as mp_random
z = torch.zeros(3, device="cuda")
t = torch.tensor([1.0], dtype=torch.float, device=torch.device("cuda"))
state_is_cpu = bool(torch.equal(mp_random._get_cuda_rng_state(), torch.get_rng_state()))
torch.cuda.manual_seed(7); a = torch.rand(2)
torch.cuda.manual_seed(7); b = torch.rand(2)
print(json.dumps({"first": first, "second": second, "dev": [str(z.device), str(t.device)],
    "current": str(torch.cuda.current_device()), "type": torch.ones(1).type(),
    "cuda_is_self": torch.ones(1).cuda().device.type, "rng_same": bool((a == b).all()),
    "rng_is_cpu": state_is_cpu,
    "applied": cpu_compat.applied()}))
""")
    for name in ("torch.cuda.current_device", "torch.cuda.synchronize", "torch.cuda.manual_seed",
                 "torch.zeros(device='cuda')", "torch.tensor(device='cuda')", "torch.Tensor.cuda",
                 "torch.Tensor.type",
                 "megatron.core.tensor_parallel.random._get_cuda_rng_state",
                 "megatron.core.tensor_parallel.random._set_cuda_rng_state"):
        assert name in r["first"], name
    assert r["second"] == []  # idempotent
    assert r["applied"] == r["first"]
    assert r["dev"] == ["cpu", "cpu"]
    assert r["current"] == "cpu"
    # megatron's optimizer checks param.type() == 'torch.cuda.FloatTensor' for fp32 params.
    assert r["type"] == "torch.cuda.FloatTensor"
    assert r["cuda_is_self"] == "cpu"
    assert r["rng_same"] and r["rng_is_cpu"]


def test_not_applied_where_cuda_exists():
    r = _run("""
torch.cuda.is_available = lambda: True   # what a GPU node reports
patched = cpu_compat.apply()
print(json.dumps({"patched": patched, "zeros_wrapped":
    hasattr(torch.zeros, "__labkit_cpu_redirect__")}))
""")
    assert r == {"patched": [], "zeros_wrapped": False}


def test_megatrons_fused_kernels_stay_eager_and_dynamo_unimported():
    """megatron-core decorates its fused kernels with ``torch.compile`` at import; on the CPU
    path (fusions off) that only costs start-up: they stay the plain functions (importing the
    engine's modules does not import torch._dynamo), and ``torch.compile`` is torch's own again
    afterwards."""
    r = _run("""
compile_ = torch.compile
patched = cpu_compat.apply()
from megatron.core import jit
from megatron.core.fusions import fused_bias_gelu
import engine_model  # what a rank imports to build and train the model
x = torch.randn(4, 8); b = torch.randn(8)
print(json.dumps({"patched": patched, "dynamo": "torch._dynamo" in sys.modules,
    "compile_restored": torch.compile is compile_,
    "fuser_is_eager": jit.jit_fuser(len) is len,
    "plain": type(fused_bias_gelu.bias_gelu).__name__,
    "same": bool(torch.equal(fused_bias_gelu.bias_gelu(b, x), fused_bias_gelu.bias_gelu(b, x)))}))
""")
    assert "megatron.core.jit.jit_fuser -> eager" in r["patched"]
    assert r == {**r, "dynamo": False, "compile_restored": True, "fuser_is_eager": True,
                 "plain": "function", "same": True}
