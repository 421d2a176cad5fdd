"""`labkit check`: exit 0 for a valid config, 2 with the numbers for an invalid one, never a
traceback."""

from __future__ import annotations

import json
import subprocess
import sys

from labkit.config import RunConfig


def check(path, *extra):
    return subprocess.run([sys.executable, "-m", "labkit", "check", str(path), *extra],
                          capture_output=True, text=True)


def test_valid_config_exits_0(tmp_path):
    p = tmp_path / "ok.json"
    RunConfig(name="ok", nodes=2, gpus_per_node=2, tensor_model_parallel_size=2).to_json(p)
    r = check(p)
    assert r.returncode == 0, r.stderr
    assert "world size 4" in r.stdout


def test_invalid_config_exits_2_with_numbers(tmp_path):
    p = tmp_path / "bad.json"
    data = json.loads(RunConfig(name="bad").to_json())
    data.update(tensor_model_parallel_size=3, global_batch_size=7)
    p.write_text(json.dumps(data))
    r = check(p)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "3 x 1 = 3" in r.stderr and "world size 2" in r.stderr
    r = check(p, "--json")
    assert r.returncode == 2 and json.loads(r.stdout)["valid"] is False


def test_garbage_inputs_exit_2_without_traceback(tmp_path):
    for text in ("[]", "{", '{"nodes": "two"}', '{"colour": 1}'):
        p = tmp_path / "g.json"
        p.write_text(text)
        r = check(p)
        assert r.returncode == 2, (text, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr
    r = check(tmp_path / "missing.json")
    assert r.returncode == 2 and "Traceback" not in r.stderr
