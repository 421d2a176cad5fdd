"""A site profile's requeue and warning-signal fields: validated, and rendered as sbatch options."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.errors import ConfigError
from labkit.render import sbatch_options
from labkit.run.spec import JobSpec
from labkit.site import ClusterProfile

SPEC = JobSpec("faults", nodes=2, gpus_per_node=1)


def _opts(**fields) -> list[str]:
    return sbatch_options(SPEC, ClusterProfile(name="s", **fields), Path("/shared/runs/faults"))


def test_requeue_and_the_warning_signal_become_sbatch_options():
    opts = _opts(requeue=True, warning_s=90)
    assert "--requeue" in opts and "--signal=B:USR1@90" in opts
    assert "--open-mode=append" in opts  # every attempt appends to the same log.txt
    assert "--no-requeue" in _opts(requeue=False)
    default = _opts()
    assert not any(o in default for o in ("--requeue", "--no-requeue"))  # the site's JobRequeue
    assert "--signal=B:USR1@120" in default
    assert not any(o.startswith("--signal") for o in _opts(warning_s=0) + _opts(warning_s=None))


@pytest.mark.parametrize("fields,words", [
    (dict(requeue="yes"), ["requeue='yes'", "true, false or null"]),
    (dict(warning_s=-5), ["warning_s=-5", "0-65535"]),
    (dict(warning_s=70_000), ["warning_s=70000"]),
    (dict(warning_s="2m"), ["warning_s='2m'"]),
    (dict(warning_s=True), ["warning_s=True"]),
])
def test_bad_values_are_refused_with_the_fix(fields, words):
    with pytest.raises(ConfigError) as e:
        ClusterProfile(name="s", **fields)
    for w in words:
        assert w in str(e.value)
