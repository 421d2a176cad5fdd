"""The sandbox's stub commands log every call as one whole record, even when many run at once."""

from __future__ import annotations

import subprocess
from pathlib import Path

import stub_commands


def test_records_from_many_processes_at_once_stay_whole(tmp_path: Path):
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    stub_commands.install(bin_dir, ["srun", "scontrol"])
    log.mkdir()
    # 40 calls side by side, each with ~30 KB of arguments (far over one pipe buffer or one
    # stdio buffer), so a logger that writes a record in pieces to one shared file mixes them.
    calls = {i: [f"arg{i}-{j}-" + "x" * 300 + "\x1f\x1e '\"$" for j in range(100)]
             for i in range(40)}
    script = "".join(f"{'srun' if i % 2 else 'scontrol'} {' '.join(_quote(a) for a in args)} "
                     f"> /dev/null &\n" for i, args in calls.items()) + "wait\n"
    (tmp_path / "calls.sh").write_text(script)
    p = subprocess.run(["/bin/bash", str(tmp_path / "calls.sh")], capture_output=True, text=True,
                       env={"PATH": str(bin_dir), "STUB_LOG": str(log)}, timeout=120)
    assert p.returncode == 0, p.stderr
    got = stub_commands.records(log)
    assert len(got) == len(calls)
    want = sorted([("srun" if i % 2 else "scontrol"), *args] for i, args in calls.items())
    assert sorted(got) == want


def test_calls_one_after_another_come_back_in_order(tmp_path: Path):
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    stub_commands.install(bin_dir, ["module", "srun"])
    log.mkdir()
    script = "".join(f"module load m{i}\n" for i in range(30)) + "srun last\n"
    subprocess.run(["/bin/bash", "-c", script], env={"PATH": str(bin_dir), "STUB_LOG": str(log)},
                   check=True, timeout=120)
    want = [["module", "load", f"m{i}"] for i in range(30)] + [["srun", "last"]]
    assert stub_commands.records(log) == want


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"
