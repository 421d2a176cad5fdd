"""The Python API given the wrong kind of thing: one clear LabkitError, never an AttributeError."""

from __future__ import annotations

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
