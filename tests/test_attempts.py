"""The attempts of a requeued job, read from real logs of the mini-cluster (fixtures/attempts)."""

from __future__ import annotations

import json
from pathlib import Path

from labkit.run.attempts import attempts, summary

FIX = Path(__file__).parent / "fixtures" / "attempts"


def test_node_failure_then_resumed_attempt_that_completes():
    runs = attempts((FIX / "minicluster_node_failure_requeued.txt").read_text())
    assert [a.to_dict() for a in runs] == [
        dict(number=1, job_id="59572551", started="2026-11-26 17:56:36", nodes="node[1-2]",
             ended="2026-11-26 17:57:06", exit_code=None, reason="node failure",
             resumed_from=None, last_iteration=10, requeued=False),
        dict(number=2, job_id="59572551", started="2026-11-26 17:57:20", nodes="node[1-2]",
             ended="2026-11-26 17:58:12", exit_code=0, reason="completed", resumed_from=5,
             last_iteration=40, requeued=False),
    ]
    assert summary(runs).splitlines()[0] == (
        "attempt 1 of job 59572551 on node[1-2], 2026-11-26 17:56:36-17:57:06: node failure, "
        "last iteration 10")


def test_saved_on_the_warning_signal_requeued_itself_then_cancelled():
    runs = attempts((FIX / "minicluster_time_limit_warning_requeued.txt").read_text())
    first, second = runs
    assert (first.ended, first.exit_code, first.reason, first.requeued, first.last_iteration) == (
        "2026-11-26 17:55:46", 75, "saved on SIGUSR1 at iteration 210", True, 210)
    assert (second.started, second.resumed_from, second.ended, second.reason) == (
        "2026-11-26 17:56:04", 210, "2026-11-26 17:56:30", "cancelled")
    assert second.last_iteration > 210


def test_a_log_without_attempt_lines_has_none():
    assert attempts(" [2026-11-26 17:40:13] iteration        1/      30 | lm loss: 8.3 |\n") == []


def test_preempted_saved_on_the_warning_and_resumed_to_the_end():
    runs = attempts((FIX / "minicluster_preempted_requeued.txt").read_text())
    assert [(a.number, a.reason, a.exit_code, a.resumed_from, a.last_iteration, a.requeued)
            for a in runs] == [(1, "saved on SIGUSR1 (preemption) at iteration 20", 75, None, 20, True),
                               (2, "completed", 0, 20, 40, False)]


def test_labkit_parse_names_the_node_failure_and_the_requeue(capsys):
    from labkit.cli import main as cli

    log = str(FIX / "minicluster_node_failure_requeued.txt")
    assert cli(["parse", log]) == 0
    out = capsys.readouterr().out
    assert ("FAILURE node_failure (line 33): Slurm: node node2 failed under the job: srun: error: "
            "Node failure on node2") in out
    assert ("attempts (Slurm ran this job more than once):\nattempt 1 of job 59572551 on "
            "node[1-2], 2026-11-26 17:56:36-17:57:06: node failure, last iteration 10\nattempt 2 "
            "of job 59572551 on node[1-2], 2026-11-26 17:57:20-17:58:12 from iteration 5: "
            "completed, last iteration 40") in out
    assert cli(["parse", log, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [a["reason"] for a in doc["attempts"]] == ["node failure", "completed"]


def test_the_failed_node_is_named_whichever_slurm_line_comes_first(tmp_path):
    """srun's "Node failure on node2" and slurmstepd's "JOB .. ON node1 CANCELLED .. DUE TO NODE
    FAILURE" race to the log: the CI run of 270e788 wrote slurmstepd's first. The report names
    node2, the node that failed, not node1, the node that reported it."""
    from labkit.logs import parse_log

    lines = (FIX / "minicluster_node_failure_requeued.txt").read_text().splitlines(keepends=True)
    assert lines[32].startswith("srun: error: Node failure on node2")
    swapped = lines[:32] + lines[33:35] + [lines[32]] + lines[35:]  # slurmstepd's two lines first
    log = tmp_path / "log.txt"
    log.write_text("".join(swapped))
    for path in (FIX / "minicluster_node_failure_requeued.txt", log):
        nodes = [f for f in parse_log(path).to_dict()["failures"] if f["kind"] == "node_failure"]
        assert [(f["line"], f["message"]) for f in nodes] == [
            (33 if path != log else 35, "Slurm: node node2 failed under the job: srun: error: Node "
                                        "failure on node2")], nodes
