"""Hostile and careless input: configs, site profiles, the environment and rendered scripts.

Property tests (hypothesis) feed RunConfig JSON and site YAML of every shape: the answer is a
valid object or a LabkitError naming the field, never another exception, never a hang. Every
backend's script is rendered with hostile strings in every field a user controls, checked with
``bash -n`` and run with only stub commands on PATH: nothing but the intended commands runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stub_commands import NOT_FOUND
from stub_commands import install as install_stubs
from stub_commands import records as stub_records

from labkit.cli import main as cli
from labkit.config import FIELD_NAMES, RunConfig
from labkit.errors import ConfigError, LabkitError
from labkit.render import render_local, render_sbatch, sbatch_options
from labkit.run import JobSpec
from labkit.site import FIELD_NAMES as SITE_FIELDS
from labkit.site import ClusterProfile, load_cluster

# A generous bound for "never hangs", in CPU seconds of this process (time.process_time): the
# real answer takes milliseconds, and other processes loading the machine do not count, so a busy
# machine cannot fail these tests while a blow-up (an alias bomb, a billion-rank plan) still does.
CEILING_S = 10.0
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-10**40, max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
    st.sampled_from(["false", "true", "NaN", "x\n", "$(id)", "1e400", "", "fp32", "cuda"]))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=10)


def _names_a_key(err: LabkitError, keys: list[str]) -> bool:
    msg = str(err)
    return any(k in msg for k in keys) or "JSON" in msg or "YAML" in msg


@SETTINGS
@given(st.dictionaries(st.sampled_from(FIELD_NAMES + ("tp", "profile", "bogus")), _values,
                       max_size=6))
def test_runconfig_json_is_valid_or_names_the_field(doc):
    text = json.dumps(doc)  # NaN and Infinity go in as the bare words JSON does not allow
    t0 = time.process_time()
    try:
        cfg = RunConfig.from_json(text)
    except ConfigError as e:
        assert _names_a_key(e, list(doc) + ["name"]), str(e)
    else:
        json.loads(cfg.to_json())  # what is accepted is written back as strict JSON
        assert RunConfig.from_json(cfg.to_json()) == cfg
    assert time.process_time() - t0 < CEILING_S


@SETTINGS
@given(st.dictionaries(st.sampled_from(SITE_FIELDS + ("bogus",)), _values, max_size=6))
def test_site_yaml_is_valid_or_names_the_field(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("site") / "site.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    t0 = time.process_time()
    try:
        load_cluster(path)
    except ConfigError as e:
        assert _names_a_key(e, list(doc) + ["mapping"]), str(e)
    assert time.process_time() - t0 < CEILING_S


@pytest.mark.parametrize("text", [
    "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
    "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
    "env: {X: *d}\n",
    "name: &n site\npartition: *n\n",
    "env: " + "[" * 5000 + "]" * 5000 + "\n",
    "\ufeffname: ok\nrun_root: \"/shared/x\\nrm -rf ~\"\n",
    "sbatch_extra: [\"--comment=a\\ntouch /tmp/PWNED\"]\n",
    "- just\n- a list\n",
])
def test_site_yaml_bombs_and_newlines_are_refused(tmp_path, text):
    path = tmp_path / "site.yaml"
    path.write_text(text)
    t0 = time.process_time()
    with pytest.raises(ConfigError, match="alias|anchor|nests|control character|mapping"):
        load_cluster(path)
    assert time.process_time() - t0 < CEILING_S


@pytest.mark.parametrize("text, needle", [
    ('{"lr": NaN}', "lr: NaN"), ('{"gpu_memory_gb": Infinity}', "gpu_memory_gb: Infinity"),
    ('{"memory_limit_gb": true}', "memory_limit_gb=True"), ('{"swiglu": "false"}', "swiglu"),
    ('{"name": "a", "name": "b"}', "'name' appears twice"),
    ('{"train_iters": 10000000000000000000000000000000000000000}', "train_iters"),
    ('{"name": "run\\n"}', "name="), ('{"tp": 2}', "did you mean 'tensor_model_parallel_size'"),
    ('{"torch_profiler_ranks": 5}', "torch_profiler_ranks"), ('{"hidden_size": 4e300}',
                                                               "hidden_size"),
    ('{"hidden_size": 10000000001}', "hidden_size"), ("[" * 50_000, "nests deeper"),
    ('{"seed": ' + "9" * 5000 + "}", "5000 digits"),
])
def test_silently_accepted_values_are_refused(text, needle):
    with pytest.raises(ConfigError) as e:
        RunConfig.from_json(text)
    assert needle in str(e.value)


def test_config_files_in_other_encodings(tmp_path, capsys):
    for enc, data in (("utf-16", '{"name": "x"}'.encode("utf-16")),
                      ("latin-1", '{"name": "caf\xe9"}'.encode("latin-1"))):
        path = tmp_path / f"{enc}.json"
        path.write_bytes(data)
        assert cli(["check", str(path)]) == 2
        err = capsys.readouterr().err
        assert "not UTF-8" in err and len(err.strip().splitlines()) == 1, err
    assert cli(["check", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_absurd_numbers_answer_at_once(capsys):
    t0 = time.process_time()
    assert cli(["plan", "--world-size", "1000000000"]) == 2
    assert cli(["plan", "--world-size", "0"]) == 2
    assert cli(["plan", "--world-size", "1000003", "--gpus-per-node", "1"]) == 2
    assert time.process_time() - t0 < 3 * CEILING_S
    err = capsys.readouterr().err
    assert "Traceback" not in err and "must be" in err


def test_environment_values(monkeypatch, capsys):
    monkeypatch.setenv("LABKIT_RUN_ROOT", "")
    assert cli(["status"]) == 2
    assert "LABKIT_RUN_ROOT is set but empty" in capsys.readouterr().err
    monkeypatch.setenv("LABKIT_RUN_ROOT", "/tmp/a\nb")
    assert cli(["status"]) == 2
    assert "control character" in capsys.readouterr().err


def test_log_that_is_not_a_file(tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert cli(["parse", str(fifo)]) == 1
    assert "not a regular file" in capsys.readouterr().err
    assert cli(["parse", str(tmp_path)]) == 1
    assert "a directory" in capsys.readouterr().err


# --- rendered scripts with hostile strings in every field -------------------------------------
HOSTILE = "a'b \"c\" $(touch PWNED) `touch PWNED2`; touch PWNED3 & x|y >z *?[a] ~ {a,b} \\ ! é"
# run_root may hold {user} (filled in per user) and no other {...}: the path leaves braces out.
HOSTILE_PATH = HOSTILE.replace("{a,b} ", "")
WORD = "w$(touch_PWNED4);`touch_PWNED5`|&>'\"*"  # a word without spaces (partition, account...)

def _sandbox(tmp_path: Path, script: str, stubs: list[str], env: dict[str, str]) -> list[list[str]]:
    """Run ``script`` with only ``stubs`` on PATH (each logs its argv); returns the argv lists."""
    bin_dir, log, rc = tmp_path / "stub-bin", tmp_path / "stub-log", tmp_path / "bashenv"
    install_stubs(bin_dir, stubs)
    log.mkdir()
    rc.write_text(NOT_FOUND)
    path = tmp_path / "job.sh"
    path.write_text(script)
    assert subprocess.run(["/bin/bash", "-n", str(path)], capture_output=True).returncode == 0
    p = subprocess.run(["/bin/bash", str(path)], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path, env={"PATH": str(bin_dir), "STUB_LOG": str(log),
                                          "BASH_ENV": str(rc), "HOME": str(tmp_path), **env})
    calls = stub_records(log)
    assert not [c for c in calls if c[0] == "UNEXPECTED"], (calls, p.stderr)
    made = [q for q in tmp_path.rglob("*") if q.name.startswith(("PWNED", "touch_PWNED"))]
    assert not made, p.stderr
    return calls


@pytest.fixture
def hostile_dir(tmp_path) -> Path:
    d = tmp_path / "runs" / HOSTILE_PATH / "run1"
    d.mkdir(parents=True)
    return d


PROGRAM_ARGS = [HOSTILE, "--flag=$(touch PWNED6)", "", "'", '"', "\\"]


@pytest.mark.parametrize("runtime", [None, "pyxis", "apptainer"])
def test_sbatch_script_with_hostile_fields_runs_only_what_it_should(tmp_path, hostile_dir,
                                                                    runtime):
    container = None if runtime is None else {"runtime": runtime, "image": WORD,
                                              "mounts": [f"/a{WORD}:/b"]}
    site = ClusterProfile(name=HOSTILE, partition=WORD, account=WORD, qos=WORD, mem=WORD,
                          modules=(HOSTILE, WORD), env={"NCCL_X": HOSTILE, "Y": WORD},
                          torchrun=str(tmp_path / HOSTILE / "torchrun"), code_dir=HOSTILE,
                          run_root=str(hostile_dir.parent), container=container,
                          sbatch_extra=(f"--comment={HOSTILE}",))
    spec = JobSpec.from_config(RunConfig(name="hostile.run-1", nodes=2, gpus_per_node=2))
    script = render_sbatch(spec, site, hostile_dir, program=tmp_path / HOSTILE / "prog.py",
                           program_args=PROGRAM_ARGS)
    calls = _sandbox(tmp_path, script, ["module", "scontrol", "head", "grep", "date", "srun"],
                     {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node1"})
    # Pipes (scontrol | head, scontrol | grep) run side by side: their order in the log is either.
    names = [c[0] for c in calls]
    assert names[:2] == ["module", "module"] and names.count("srun") == 1, calls
    assert {"scontrol", "head"} <= set(names), calls
    assert calls[0][1:] == ["load", HOSTILE] and calls[1][1:] == ["load", WORD]
    srun = calls[names.index("srun")]
    assert srun[-len(PROGRAM_ARGS):] == PROGRAM_ARGS  # verbatim, as "$@" of the rank command
    if runtime == "pyxis":
        assert f"--container-image={WORD}" in srun
    assert (hostile_dir / "exit_code").read_text().strip() == "0"
    directives = [ln for ln in script.splitlines() if ln.startswith("#SBATCH")]
    assert len(directives) == len(sbatch_options(spec, site, hostile_dir))  # one line each


def test_local_script_with_hostile_fields_runs_only_what_it_should(tmp_path, hostile_dir):
    spec = JobSpec.from_config(RunConfig(name="hostile.run-2", nodes=2, gpus_per_node=1))
    torchrun = str(tmp_path / "stub-bin" / "torchrun")
    script = render_local(spec, hostile_dir, program=tmp_path / HOSTILE / "prog.py",
                          program_args=PROGRAM_ARGS, torchrun=torchrun,
                          env={"X": HOSTILE})
    calls = _sandbox(tmp_path, script, ["seq", "torchrun"], {})
    assert sorted(c[0] for c in calls) == ["seq", "torchrun", "torchrun"], calls
    for c in calls[1:]:
        assert c[-len(PROGRAM_ARGS):] == PROGRAM_ARGS
        assert c[-len(PROGRAM_ARGS) - 1] == str(tmp_path / HOSTILE / "prog.py")
    assert (hostile_dir / "exit_code").read_text().strip() == "0"


@pytest.mark.parametrize("field, value", [
    ("run_root", "/x\n#SBATCH --wrap=id"), ("sbatch_extra", ["--comment=x\nid"]),
    ("modules", ["a\nid"]), ("setup", ["echo\rid"]), ("env", {"X": "a\nid"}),
    ("torchrun", "torchrun\n id"), ("name", "site\n"), ("partition", "p\nid"),
    ("container", {"runtime": "pyxis", "image": "img\nid"}), ("code_dir", "/c\x00"),
    ("program", "/opt/megatron/pretrain_gpt.py\nid"),
])
def test_newlines_in_a_site_profile_are_refused(field, value):
    with pytest.raises(ConfigError, match=f"{field}.*(control character|without spaces)"):
        ClusterProfile(**{field: value})


def test_an_endless_line_is_cut_with_a_note(tmp_path):
    from labkit.logs.lines import MAX_LINE_BYTES, iter_file

    log = tmp_path / "log.txt"
    with open(log, "wb") as f:
        f.write(b"first\n" + b"x" * (3 * MAX_LINE_BYTES) + b" Traceback\nlast\n")
    lines = list(iter_file(log))
    assert [len(x) <= MAX_LINE_BYTES + 100 for x in lines] == [True] * 3
    assert lines[0] == b"first\n" and lines[2] == b"last\n"
    assert b"line cut at" in lines[1] and str(3 * MAX_LINE_BYTES + 11).encode() in lines[1]
