"""Hostile input, third round: text that reaches a job script, host names, the environment,
records the class commands read, arguments that used to fail as tracebacks.

Each attack here once ran a command, crashed a command or moved someone's run; each now gets
one clear LabkitError naming the value and the fix, before anything is written or submitted.
"""

from __future__ import annotations

import pytest

from labkit.backends.spec import JobSpec
from labkit.errors import ConfigError

PWN = "TP=1\ntouch /tmp/PWNED"


# ---- text that reaches a job script: the one validation door ------------------------------

@pytest.mark.parametrize("kw,named", [
    ({"layout": PWN}, "layout="),
    ({"layout": "TP=1\rx"}, "layout="),
    ({"megatron_flags": (("x$(touch /tmp/PWNED)", (("--a", "1"),)),)}, "group"),
    ({"megatron_flags": (("training\nid", (("--a", "1"),)),)}, "group"),
    ({"megatron_flags": (("training", (("--a", "1\ntouch /tmp/PWNED"),)),)}, "megatron_flags"),
    ({"megatron_flags": 5}, "megatron_flags=5"),
])
def test_jobspec_refuses_text_that_would_run_as_shell(kw, named):
    with pytest.raises(ConfigError, match=named):
        JobSpec("x", **kw)


def test_jobspec_of_a_run_config_still_passes_the_door():
    from labkit.config import RunConfig

    spec = JobSpec.from_config(RunConfig(name="ok"))
    assert spec.layout.startswith("TP=") and spec.megatron_flags


@pytest.mark.parametrize("kw,named", [
    ({"ops": ["all_reduce\ntouch /tmp/PWNED #"]}, r"ops\[0\]="),
    ({"ops": "all_reduce"}, "must be a list"),
    ({"scopes": ["world", "intra\x00"]}, r"scopes\[1\]="),
    ({"min_bytes": "1K\nid"}, "min_bytes="),
])
def test_submit_bench_refuses_control_characters_before_writing(run_root, kw, named):
    from labkit.comm import submit_bench

    with pytest.raises(ConfigError, match=named):
        submit_bench("bw", **kw)
    assert not any(run_root.iterdir())
