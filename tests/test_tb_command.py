"""The TensorBoard command notebook 04 prints: one a student can paste in a terminal opened in
the repository, with no absolute path of this machine."""

from __future__ import annotations

import shlex
import subprocess

from labkit.measured.tb import tensorboard_command, tensorboard_command_line
from labkit.paths import REPO_ROOT


def test_with_labkit_run_root_it_names_the_variable(run_root):
    line = tensorboard_command_line(port=6123)
    assert '--logdir "$LABKIT_RUN_ROOT" --port 6123 --host localhost' in line
    assert str(run_root) not in line
    # The shell expands it to the run root tensorboard_command serves.
    out = subprocess.run(["bash", "-c", f"printf '%s\\n' {line.split(' --logdir ')[1]}"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == str(run_root.resolve()) == tensorboard_command()[2]


def test_without_it_the_run_root_is_relative_to_the_repository(monkeypatch):
    monkeypatch.delenv("LABKIT_RUN_ROOT", raising=False)
    line = tensorboard_command_line()
    argv = shlex.split(line)
    assert str(REPO_ROOT) not in line and argv[2] == "runs"
    assert str((REPO_ROOT / argv[2]).resolve()) == tensorboard_command()[2]
    assert (REPO_ROOT / argv[0]).exists() or "/" not in argv[0]
