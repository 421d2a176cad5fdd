"""Every real log reads the same behind the wrappings real logs come in.

Each log of tests/fixtures/logs/real is rewritten the ways real logs show the same lines: behind
nested launcher prefixes (``srun --label``, torchrun's ``--tee`` and torch's ``[rankN]:``,
``mpirun --tag-output``, a pdsh/NCCL host of any shape, host:pid:tid), behind a harness's stream
name, a Kubernetes pod, time stamps and levels of several formats (Python logging's, ISO 8601,
glog's, a time of day) with colour codes real and copied as text, glued onto a progress bar, after
a bar's carriage-return redraw or before one, and with its iteration records hard-wrapped at 80
columns. Each way must give back the facts of the log as it is: layout, every iteration record,
memory rows, NCCL version and transports, nccl-tests tables, failures (kind, rank, count), findings.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from labkit.logs import parse_log

REAL = Path(__file__).parent / "fixtures" / "logs" / "real"
LOGS = sorted(p.name for p in REAL.glob("*.txt"))

# Prefixes as real logs print them (each seen in a public log; see the corpus README).
PREFIXES = {
    "srun_tee_rank_mpirun_host": "3: [default3]:[rank3]:[1,3]<stdout>:gpu-a01.cluster.example.org: ",
    "digits_host_pid": "1000123:4242:4300 ",
    "harness_pod_logging": "stdout: [pod/train-worker-0/pytorch] 2024-05-01 12:00:00,123 - root - INFO - ",
    "colour_and_time_stamps": (  # one of these before each line, in turn
        "^[[32m[2024-05-01 12:00:00,123] [INFO]^[[0m ",  # colour codes copied as text
        "\x1b[32m2024-05-01T12:00:00.123456Z\x1b[0m ",  # real ANSI escapes, ISO 8601
        "I0501 12:00:00.123456 4242 train.py:77] ",  # glog
        "[12:00:00] ",  # a time of day
    ),
    "ipv6_host": "fe80::1ff:fe23:4567:890a: ",
}
BAR = " 45%|####5     | 9/20 [00:03<00:04,  2.50it/s]"
_RECORD = re.compile(r"iteration\s{0,40}\d{1,12}\s{0,40}/\s{0,40}\d{1,12}\s\|.{80,}\|\s*$")


def _facts(path: Path, prefix_rank: int | None = None) -> dict:
    """The facts of a log; a rank the prefix names (``prefix_rank``) counts as no rank (the
    prefix says it, where the log itself did not)."""
    d = parse_log(path).to_dict()
    for row in d["memory"] + d["failures"]:
        if row["rank"] == prefix_rank:
            row["rank"] = None
    return {"layout": d["layout"], "iterations": d["iterations"], "memory": d["memory"],
            "nccl": {k: d["nccl"][k] for k in ("version", "transports")},
            "nccl_tests": [{k: v for k, v in t.items() if k != "line"} for t in d["nccl"]["tests"]],
            "failures": sorted((f["kind"], -1 if f["rank"] is None else f["rank"]) for f in d["failures"]),
            "findings": sorted(f["kind"] for f in d["findings"])}


def _lines(name: str) -> list[str]:
    return (REAL / name).read_bytes().decode("utf-8", "replace").splitlines()


def _write(tmp_path: Path, lines: list[str]) -> Path:
    out = tmp_path / "log.txt"
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


@pytest.mark.parametrize("name", LOGS)
def test_prefixes_give_the_same_facts(name, tmp_path):
    lines = _lines(name)
    want: dict[int | None, dict] = {}  # the log's own facts, by the rank the prefix names
    for label, prefix in PREFIXES.items():
        rank = 3 if label.startswith("srun") else None
        each = (prefix,) if isinstance(prefix, str) else prefix
        got = _facts(_write(tmp_path, [each[i % len(each)] + line for i, line in enumerate(lines)]), rank)
        if rank not in want:
            want[rank] = _facts(REAL / name, rank)
        assert got == want[rank], label


@pytest.mark.parametrize("name", LOGS)
def test_progress_bar_glue_and_hard_wrap_give_the_same_facts(name, tmp_path):
    want = _facts(REAL / name)
    lines = _lines(name)
    # a line glued after a bar, after a bar's redraw, and before one (a carriage return between)
    ways = (BAR + "{}", BAR + "\r{}", "{}\r" + BAR, "{}")
    glued = [ways[i % 4].format(line) if line.strip() else line for i, line in enumerate(lines)]
    assert _facts(_write(tmp_path, glued)) == want, "glued onto a progress bar or its redraws"
    wrapped: list[str] = []
    for line in lines:
        if _RECORD.search(line) and "\r" not in line:
            wrapped += [line[i:i + 80] for i in range(0, len(line), 80)]
        else:
            wrapped.append(line)
    assert _facts(_write(tmp_path, wrapped)) == want, "iteration records hard-wrapped at 80 columns"


@pytest.mark.parametrize("layout", ["nccl_first", "interleaved"])
def test_loop_lines_without_trigger_words_are_read_beside_other_tools(layout, tmp_path):
    """nanoGPT's step lines hold no trigger word; a nanoGPT log that also holds NCCL's lines (two
    real logs, one after the other, or line by line, so some steps sit beside a trigger) still
    gives every step, and the NCCL facts of the NCCL log."""
    steps = (REAL / "nanogpt_2023_iter_lines_torchrun_nanogpt110.txt").read_text().splitlines()
    nccl = (REAL / "nccl_2.22_p2p_cumem_nccl1538.txt").read_text().splitlines()
    if layout == "nccl_first":
        lines = nccl + steps
    else:
        lines = [x for pair in zip(steps, nccl, strict=False) for x in pair] + steps[len(nccl):]
    log = tmp_path / "log.txt"
    log.write_text("\n".join(lines) + "\n")
    d = parse_log(log).to_dict()
    assert [r["iteration"] for r in d["iterations"]] == list(range(1631, 1642))  # as the log prints
    assert d["iterations"][0]["lm_loss"] == 4.0863 and d["iterations"][-1]["elapsed_ms"] == 567.31
    assert d["nccl"]["transports"] == {"P2P": 11, "SHM": 0, "NET": 0}
