"""A rendered job script edited by hand: its flags read back into a checked RunConfig
(labkit.script_edit), and the exercise check built on it. Nothing is trained here: notebook 01
submits an edited script in the notebooks tier."""

from __future__ import annotations

import pytest

from labkit import exercises as ex
from labkit import script_edit as se
from labkit.config import RunConfig
from labkit.errors import ConfigError
from labkit.exercises import FIXME


@pytest.fixture
def base(run_root) -> RunConfig:
    return RunConfig.for_profile("cpu", name="edit_me", nodes=1, gpus_per_node=2, train_iters=4)


def _swap(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def test_a_changed_flag_becomes_its_field_and_the_script_labkit_renders_carries_it(base):
    copy = se.editable_copy(base)
    assert copy.name == "edit_me.job.sh" and copy.read_text() == se.render_script(base)
    assert se.script_flags(copy.read_text())["--micro-batch-size"] == "2"
    edited = _swap(copy.read_text(), "--micro-batch-size 2", "--micro-batch-size 1")
    edit = se.read_edit(base, edited)
    assert edit.changes == {"micro_batch_size": (2, 1)}
    assert edit.config == base.replace(micro_batch_size=1)
    assert str(edit) == "--micro-batch-size 2 -> 1 (micro_batch_size)"
    # what labkit would submit for it: the very flags of the edited copy
    assert se.script_flags(se.render_script(edit.config)) == se.script_flags(edited)
    copy.write_text(edited)  # edited in an editor: the path works as well as the text
    assert se.read_edit(base, copy).config == edit.config
    assert se.read_edit(base, se.render_script(base)).changes == {}


def test_switches_and_implied_flags_read_back(base):
    text = se.render_script(base)
    edit = se.read_edit(base, _swap(text, "--seed 1234", "--seed 1234\n    --recompute-granularity full"
                                    "\n    --recompute-method uniform\n    --use-distributed-optimizer"))
    assert edit.changes == {"recompute_granularity": (None, "full"),
                            "use_distributed_optimizer": (False, True)}


@pytest.mark.parametrize("old,new,said", [
    ("--micro-batch-size 2", "--micro-batch-size 3",
     "(--micro-batch-size 3) break a rule of the run: global_batch_size 8 is not divisible by "
     "micro_batch_size 3 x DP 2"),
    ("--micro-batch-size 2", "--micro-batchsize 1", "did you mean --micro-batch-size?"),
    ("NNODES=1", "NNODES=2", "outside its Megatron-LM flag arrays (-NNODES=1; +NNODES=2)"),
    ("--adam-beta2 0.95", "--adam-beta2 0.999", "always uses --adam-beta2 0.95"),
    ("--micro-batch-size 2", "--micro-batch-size 1 --micro-batch-size 2", "given twice"),
    ("corpus_text_document", "other_document", "set data_path in the RunConfig"),
])
def test_edits_labkit_refuses_say_why_and_what_to_change(base, old, new, said):
    with pytest.raises(ConfigError, match=None) as e:
        se.read_edit(base, _swap(se.render_script(base), old, new))
    assert said in str(e.value), str(e.value)


def test_the_exercise_check(base, monkeypatch):
    monkeypatch.delenv(ex.STRICT_ENV, raising=False)
    monkeypatch.delenv("LABKIT_METRICS_FILE", raising=False)
    text = se.render_script(base)
    want = {"micro_batch_size": 1}
    task = "Each rank takes one sample at a time; the global batch stays."
    assert "not answered yet" in str(se.check_script_edit(FIXME, base=base, want=want, task=task))
    res = se.check_script_edit(text, base=base, want=want, task=task)
    assert not res and "no flag of the script changed yet" in str(res)
    both = _swap(_swap(text, "--micro-batch-size 2", "--micro-batch-size 1"),
                 "--global-batch-size 8", "--global-batch-size 4")
    res = se.check_script_edit(both, base=base, want=want, task=task)
    assert not res and "--global-batch-size should stay as rendered" in str(res), str(res)
    bad = se.check_script_edit(_swap(text, "--micro-batch-size 2", "--micro-batch-size 3"),
                               base=base, want=want, task=task)
    assert not bad and "labkit refused your edit" in str(bad)
    assert res.value.config == base.replace(micro_batch_size=1)  # the notebook goes on with it
    good = se.check_script_edit(_swap(text, "--micro-batch-size 2", "--micro-batch-size 1"),
                                base=base, want=want, task=task)
    assert good and good.value.config == base.replace(micro_batch_size=1)
    assert str(good).endswith("labkit read your edit, --micro-batch-size 2 -> 1 "
                              "(micro_batch_size), and the run it asks for passes every rule.")


def test_the_copy_lies_in_the_sites_own_run_root_on_slurm(base, run_root, tmp_path):
    """A class site gives each student a run root of their own; the repository's runs/ (and
    $LABKIT_RUN_ROOT) may not be theirs to write."""
    import getpass

    from labkit.site import ClusterProfile

    site = ClusterProfile(run_root=str(tmp_path / "class" / "{user}" / "runs"))
    copy = se.editable_copy(base.replace(backend="slurm"), cluster=site)
    assert copy.parent == tmp_path / "class" / getpass.getuser() / "runs" and not list(run_root.glob("*"))
