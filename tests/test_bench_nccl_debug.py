"""NCCL's transport lines from the student's own benchmark: the all-reduce benchmark asks for
``NCCL_DEBUG=INFO`` on GPUs (never on CPU), and notebook 03 reads them, or, on CPU, says the
environment cannot show them and labels the sample it shows instead."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import shutil
from pathlib import Path

import pytest

from labkit import jobs
from labkit.config import RunConfig
from labkit.logs import parse_log
from labkit.measured import comm
from labkit.render import render_local

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "logs"
NCCL_SAMPLE = FIXTURES / "real" / "nccl_2.1x_socket_and_ipc_nccl952.txt"


def _bench():
    spec = importlib.util.spec_from_file_location("allreduce_bench",
                                                  REPO / "code" / "allreduce_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_bench_asks_nccl_for_its_transports_unless_the_user_set_it():
    env = _bench().nccl_debug_env
    assert env({}) == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    assert env({"NCCL_DEBUG": "TRACE", "NCCL_DEBUG_SUBSYS": "ALL"}) == {
        "NCCL_DEBUG": "TRACE", "NCCL_DEBUG_SUBSYS": "ALL"}
    parse = _bench().parse_args
    assert parse(["--nccl-debug"]).nccl_debug is True and parse([]).nccl_debug is False


@pytest.mark.parametrize(("device", "nccl"), [("cuda", True), ("cpu", False)])
def test_submit_bench_passes_nccl_debug_on_gpus_only(device, nccl, run_root, monkeypatch):
    """The job script labkit would run (rendered by the local backend's own renderer)."""
    seen = {}

    def capture(spec, **kw):  # the scheduler boundary: render, do not start GPU processes here
        seen["script"] = render_local(spec, run_root / spec.name, program=kw["program"],
                                      program_args=kw["program_args"])
        return None

    monkeypatch.setattr(jobs, "submit", capture)
    comm.submit_bench("bw", nodes=2, gpus_per_node=2, backend="local", device=device)
    script = seen["script"]
    assert ("export NCCL_DEBUG=INFO" in script) is nccl
    assert ("--nccl-debug" in script) is nccl
    assert ("--backend nccl" in script) is nccl


def test_nccl_transports_of_a_log(tmp_path):
    run = tmp_path / "bw"
    run.mkdir()
    shutil.copy(NCCL_SAMPLE, run / "log.txt")  # a log a user posted (NVIDIA/nccl issue 952)
    got = comm.nccl_transports(run)
    text = NCCL_SAMPLE.read_text()
    assert got["transports"]["NET"] == text.count("via NET/")
    assert got["transports"]["P2P"] == text.count("via P2P/")
    shutil.copy(FIXTURES / "labkit_engine_2026.txt", run / "log.txt")  # gloo: no NCCL line
    assert comm.nccl_transports(run) is None


def _cell(nb: Path, marker: str) -> str:
    cells = [c for c in json.loads(nb.read_text())["cells"]
             if c["cell_type"] == "code" and marker in "".join(c["source"])]
    assert len(cells) == 1, f"{nb.name}: {len(cells)} cells with {marker!r}"
    return "".join(cells[0]["source"])


@pytest.mark.parametrize("nb", ["03_communication.ipynb", "solutions/03_communication.ipynb"])
def test_notebook_03_on_cpu_says_it_cannot_show_nccl_and_labels_the_sample(nb, run_root):
    source = _cell(REPO / "notebooks" / nb, "nccl_transports(")
    ns = {"bench_cfg": RunConfig.for_profile("cpu", name="nb03_busbw"), "cluster": None,
          "gpus_per_node": 2, "nodes": 2, "backend": "local"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, nb, "exec"), ns)  # noqa: S102 - the notebook's own cell
    printed = out.getvalue()
    assert "cannot show NCCL transports" in printed
    assert "SAMPLE of the format, NOT A MEASUREMENT" in printed and "issue 952" in printed
    assert "YOUR OWN RUN" not in printed
    assert ns["transports"] == parse_log(NCCL_SAMPLE).to_dict()["nccl"]["transports"]
