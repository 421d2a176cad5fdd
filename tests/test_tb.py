"""TensorBoard events written by torch's SummaryWriter (as the engine does) read back."""

from __future__ import annotations

import pytest

from labkit.errors import LabkitError
from labkit.measured.tb import read_scalars, scalars_wide

TAGS = ("lm-loss", "learning-rate", "iteration-time", "throughput", "mem-max-allocated", "batch-size")


def _write(tb_dir, steps=5):
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(log_dir=str(tb_dir))
    for step in range(1, steps + 1):
        for i, tag in enumerate(TAGS):
            w.add_scalar(tag, 10.0 * i + 1.0 / step, step)
    w.close()


def test_read_scalars_of_engine_tags(tmp_path):
    _write(tmp_path / "tb")
    df = read_scalars(tmp_path / "tb")
    assert list(df.columns) == ["tag", "step", "value", "wall_time"]
    assert set(df["tag"]) == set(TAGS) and len(df) == 5 * len(TAGS)
    loss = df[df["tag"] == "lm-loss"]
    assert loss["step"].tolist() == [1, 2, 3, 4, 5]
    assert loss["value"].tolist() == pytest.approx([1.0, 0.5, 1 / 3, 0.25, 0.2])
    wide = scalars_wide(tmp_path / "tb")
    assert wide.loc[wide["step"] == 2, "batch-size"].item() == pytest.approx(50.5)


def test_several_runs_get_a_run_column(tmp_path):
    _write(tmp_path / "tb" / "a", 2)
    _write(tmp_path / "tb" / "b", 3)
    df = read_scalars(tmp_path / "tb")
    assert df.groupby("run").size().to_dict() == {"a": 2 * len(TAGS), "b": 3 * len(TAGS)}


def test_missing_or_empty_folder_is_a_clear_error(tmp_path):
    with pytest.raises(LabkitError, match="no TensorBoard folder"):
        read_scalars(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LabkitError, match="no TensorBoard event file"):
        read_scalars(tmp_path / "empty")


def test_tensorboard_command_serves_the_absolute_run_root(run_root, monkeypatch, tmp_path):
    from labkit.measured.tb import tensorboard_command

    cmd = tensorboard_command(port=6123)
    assert cmd[1:] == ["--logdir", str(run_root.resolve()), "--port", "6123", "--host", "localhost"]
    assert cmd[0].endswith("tensorboard")
    monkeypatch.chdir(tmp_path)
    assert tensorboard_command("rel")[2] == str(tmp_path / "rel")  # never a relative folder
