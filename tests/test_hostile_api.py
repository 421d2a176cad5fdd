"""The Python API given the wrong kind of thing: one clear LabkitError, never an AttributeError."""

from __future__ import annotations

import re

import pytest

from labkit.errors import LabkitError
from labkit.logs import parse_log
from labkit.planner import plan, plan_layouts


@pytest.mark.parametrize("bad", [{"name": "x"}, None, "runs/x/config.json"])
def test_plan_names_what_it_needs(bad):
    with pytest.raises(LabkitError, match="plan\\(\\) needs a RunConfig, got"):
        plan(bad)


@pytest.mark.parametrize("nodes", ["2", 0, 2.0, True])
def test_plan_layouts_checks_its_shape(nodes):
    with pytest.raises(LabkitError, match="nodes="):
        plan_layouts(nodes=nodes, gpus_per_node=2)


def test_parse_log_of_bytes_says_bytes():
    with pytest.raises(LabkitError, match="got bytes.*parse_lines"):
        parse_log(b"iteration 1/ 2 |")


@pytest.mark.parametrize("kw,named", [
    ({"timeout": "x"}, "timeout='x'"), ({"timeout": -1}, "timeout=-1"),
    ({"timeout": float("nan")}, "timeout=nan"), ({"hang_timeout": "300"}, "hang_timeout='300'"),
    ({"wait": "no"}, "wait='no'"), ({"resume": 1}, "resume=1"), ({"reuse": None}, "reuse=None"),
])
def test_launch_checks_its_arguments_before_submitting(kw, named, run_root):
    from labkit.config import RunConfig
    from labkit.lab import launch

    with pytest.raises(LabkitError, match=f"launch\\(\\): {re.escape(named)} must be"):
        launch(RunConfig.from_preset("tiny", name="argcheck"), **kw)
    assert not any(run_root.iterdir())  # nothing submitted, nothing written


def test_launch_names_every_bad_argument_and_the_config(run_root):
    from labkit.config import RunConfig
    from labkit.lab import launch

    with pytest.raises(LabkitError) as e:
        launch(RunConfig.from_preset("tiny", name="two"), timeout="x", progress="yes")
    assert "timeout='x'" in str(e.value) and "progress='yes'" in str(e.value)
    with pytest.raises(LabkitError, match="launch\\(\\) needs a RunConfig, got dict"):
        launch({"name": "x"})
    assert not any(run_root.iterdir())


@pytest.mark.parametrize("kw,named", [
    ({"iteration": "5"}, "iteration='5'"), ({"iteration": 0}, "iteration=0"),
    ({"timeout": "60"}, "timeout='60'"), ({"poll_s": 0}, "poll_s=0"),
])
def test_wait_for_iteration_checks_its_arguments(kw, named):
    from labkit.lab import wait_for_iteration

    args = {"iteration": 5, **kw}
    with pytest.raises(LabkitError, match=f"wait_for_iteration\\(\\): {re.escape(named)} must be"):
        wait_for_iteration(object(), args.pop("iteration"), **args)
    with pytest.raises(LabkitError, match="needs the Job that launch"):
        wait_for_iteration("runs/x", 5)
