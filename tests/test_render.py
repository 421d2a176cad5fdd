"""Rendered job scripts: golden files, `bash -n` on each, and hostile paths that stay inert.

On a golden mismatch the diff is printed; accept an intended change with
``LABKIT_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/test_render.py``.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from labkit.config import RunConfig
from labkit.errors import ConfigError
from labkit.render import render_hostfile, render_local, render_sbatch, sbatch_options
from labkit.run import JobSpec
from labkit.site import ClusterProfile, load_cluster

RUN_DIR = Path("/shared/labkit/runs/demo")

CFG_CPU = RunConfig(name="tp2pp2", nodes=2, gpus_per_node=2, tensor_model_parallel_size=2,
                    pipeline_model_parallel_size=2)
CFG_GPU = RunConfig.for_profile("gpu", name="gpt2_tp2", tensor_model_parallel_size=2,
                                nccl_debug=True)
SPEC_CPU, SPEC_GPU = JobSpec.from_config(CFG_CPU), JobSpec.from_config(CFG_GPU)
@pytest.fixture(autouse=True)
def _student(monkeypatch):
    """Job names carry the Unix user (labkit-<user>-<run>): the goldens are rendered as one
    fixed user, whoever runs the tests."""
    monkeypatch.setattr("labkit.site.current_user", lambda: "student")


MINI = load_cluster("local-minicluster").replace(torchrun="/opt/venv/bin/torchrun",
                                                 code_dir="/opt/labkit/code",
                                                 slurm_conf="/var/lib/labkit-slurm/slurm.conf")


def _cases() -> dict[str, str]:
    return {
        "sbatch_minicluster_tp2pp2.sh": render_sbatch(SPEC_CPU, MINI, RUN_DIR),
        "sbatch_generic_gres_gpu.sh": render_sbatch(SPEC_GPU, load_cluster("generic-gres"),
                                                    RUN_DIR),
        "sbatch_pyxis_gpu.sh": render_sbatch(SPEC_GPU, load_cluster("pyxis-container"), RUN_DIR),
        "sbatch_apptainer_gpu.sh": render_sbatch(SPEC_GPU, ClusterProfile(
            name="apptainer", gpu_request="gpus-per-node", modules=("apptainer",),
            container={"runtime": "apptainer", "image": "/shared/images/pytorch.sif",
                       "mounts": ["/shared"]}, code_dir="/shared/labkit/code"), RUN_DIR),
        "local_2nodes.sh": render_local(SPEC_CPU, RUN_DIR, program="/opt/labkit/code/pretrain_gpt.py",
                                        torchrun="torchrun"),
        "hostfile_2x8.txt": render_hostfile(["node1", "node2"], 8),
    }


@pytest.mark.parametrize("name", sorted(_cases()))
def test_golden(name, assert_golden):
    assert_golden(name, _cases()[name])


@pytest.mark.parametrize("name", sorted(n for n in _cases() if n.endswith(".sh")))
def test_bash_syntax(name, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text(_cases()[name])
    p = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_render_is_deterministic():
    assert _cases() == _cases()


def test_sbatch_contract_lines():
    s = render_sbatch(SPEC_CPU, MINI, RUN_DIR)
    for needle in ("--ntasks-per-node=1", '--nnodes "$SLURM_NNODES"',
                   '--node_rank "$SLURM_NODEID"', "--nproc_per_node 2",
                   'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1',
                   "MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))",
                   "#SBATCH --output=/shared/labkit/runs/demo/log.txt",
                   "export LABKIT_LOG_CAPTURED=1", "export GLOO_SOCKET_IFNAME=eth0",
                   'echo "$rc" > "$RUN_DIR/exit_code"'):
        assert needle in s, needle
    assert "NCCL_DEBUG" not in s
    g = render_sbatch(SPEC_GPU, load_cluster("generic-gres"), RUN_DIR)
    assert "export NCCL_DEBUG=INFO" in g and "#SBATCH --gres=gpu:8" in g
    assert "module load cuda/12.4" in g and "NCCL_IB_HCA=mlx5" in g


def test_percent_in_run_dir_is_literal():
    opts = sbatch_options(SPEC_CPU, MINI, Path("/runs/100%_j"))
    assert "--output=/runs/100%%_j/log.txt" in opts


def test_hostile_run_dir_is_quoted():
    """Paths reach the shell only through shlex.quote'd assignments (the real runs with such a
    path are in test_backend_local.py and test_slurm.py)."""
    hostile = Path("/runs/run 1/a'b \"c\" $(touch PWNED); `touch PWNED2`; x")
    for script in (render_sbatch(SPEC_CPU, MINI, hostile), render_local(SPEC_CPU, hostile)):
        assert f"export RUN_DIR={shlex.quote(str(hostile))}" in script
        lines = [ln for ln in script.splitlines() if "PWNED" in ln]
        assert all(ln.startswith(("export RUN_DIR=", "#SBATCH --output=")) for ln in lines)


ARGS = ["--json-out", "/runs/a b/busbw.jsonl", "$(touch PWNED)", "it's `x`; y", ""]
# A torchrun that prints what the program would receive: argv after its 10 option words and
# the program itself.
FAKE_TORCHRUN = "#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps(sys.argv[12:]))\n"


def _fake_torchrun(tmp_path: Path) -> Path:
    fake = tmp_path / "torchrun"
    fake.write_text(FAKE_TORCHRUN)
    fake.chmod(0o755)
    return fake


def test_program_args_reach_the_local_program_verbatim(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec = JobSpec("bench", nodes=1, gpus_per_node=1)
    script = render_local(spec, run_dir, program="prog.py", program_args=ARGS,
                          torchrun=str(_fake_torchrun(tmp_path)))
    p = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == ARGS
    assert not list(tmp_path.rglob("PWNED"))


def test_program_args_reach_the_slurm_program_verbatim(tmp_path):
    """The srun line's ``bash -c '...' program ARGS`` (run here without srun)."""
    script = render_sbatch(JobSpec("bench", nodes=2, gpus_per_node=2), MINI, RUN_DIR,
                           program="prog.py", program_args=ARGS)
    lines = script.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("srun "))
    last = lines.index("srun_pid=$!")
    cmd = "\n".join(lines[first:last]).split(" ", 3)[3]  # without srun and its two options
    assert cmd.startswith("bash -c 'trap \"\" USR1; exec ")  # torchrun ignores the warning
    cmd = cmd.removesuffix(" &")  # the job script waits for it in the background
    env = {**os.environ, "TORCHRUN": str(_fake_torchrun(tmp_path)), "PROGRAM": "prog.py",
           "SLURM_NNODES": "2", "SLURM_NODEID": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == ARGS
    assert not list(tmp_path.rglob("PWNED"))


def test_default_program_args_are_megatron_flags_for_the_training_script_only():
    """pretrain_gpt.py gets the run's Megatron-LM flags (config.json in $LABKIT_CONFIG); any
    other program given a run gets --config (the rule in labkit/render.py's docstring)."""
    sbatch = render_sbatch(SPEC_CPU, MINI, RUN_DIR)
    assert sbatch.count("""\"$PROGRAM" "$@"' program "${MEGATRON_ARGS[@]}" &\n""") == 1
    assert 'export LABKIT_CONFIG="$RUN_DIR/config.json"\n' in sbatch
    assert "    --tensor-model-parallel-size 2\n    --pipeline-model-parallel-size 2\n" in sbatch
    assert '"$PROGRAM" "${MEGATRON_ARGS[@]}" &' in render_local(SPEC_CPU, RUN_DIR)
    other = render_local(SPEC_CPU, RUN_DIR, program="/opt/tools/allreduce_job.py")
    assert '"$PROGRAM" --config "$RUN_DIR/config.json" &' in other
    assert "MEGATRON_ARGS" not in other and "LABKIT_CONFIG" not in other
    bare = render_local(JobSpec("r", nodes=1, gpus_per_node=2), RUN_DIR)  # a JobSpec: no flags
    assert '"$PROGRAM" --config "$RUN_DIR/config.json" &' in bare
    with pytest.raises(ConfigError, match="list of arguments"):
        render_local(SPEC_CPU, RUN_DIR, program_args="--iters 3")


def test_scripts_are_rendered_from_a_jobspec_only():
    """A RunConfig becomes its JobSpec where the run enters (JobSpec.from_config, once);
    the renderer takes the JobSpec and names that fix when handed the RunConfig."""
    for render in (lambda c: render_sbatch(c, MINI, RUN_DIR), lambda c: render_local(c, RUN_DIR),
                   lambda c: sbatch_options(c, MINI, RUN_DIR)):
        with pytest.raises(ConfigError, match=r"not RunConfig.*JobSpec\.from_config\(cfg\)"):
            render(CFG_CPU)
    bench = render_local(JobSpec("bw", nodes=2, gpus_per_node=2), RUN_DIR, program="b.py",
                         program_args=["-b", "1K"])
    assert "# 2 node(s) x 2 process(es) = world size 4 | cpu\n" in bench
    assert '"$PROGRAM" -b 1K &' in bench


@pytest.mark.parametrize("bad,field", [(dict(name="a b"), "name"), (dict(name="x\n"), "name"),
                                       (dict(nodes=0), "nodes"), (dict(gpus_per_node=True),
                                                                  "gpus_per_node"),
                                       (dict(device="tpu"), "device")])
def test_jobspec_refuses_bad_values(bad, field):
    with pytest.raises(ConfigError, match=field):
        JobSpec(**{"name": "ok", **bad})


def test_hostfile_rejects_nonsense():
    with pytest.raises(ValueError, match="slots"):
        render_hostfile([], 2)


def test_profile_errors_name_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="Valid keys are"):
        ClusterProfile.from_dict({"partiton": "gpu"})
    with pytest.raises(ConfigError, match="time_limit"):
        ClusterProfile(time_limit="soon")
    with pytest.raises(ConfigError, match="runtime"):
        ClusterProfile(container={"image": "x.sif"})
    with pytest.raises(ConfigError, match="Cluster profiles shipped"):
        load_cluster(tmp_path / "nope.yaml")
    assert ClusterProfile().replace(time_limit="00:01:00").time_limit == "00:01:00"


def test_shipped_profiles_load():
    for p in (Path(__file__).parents[1] / "code" / "clusters").glob("*.yaml"):
        assert load_cluster(p).name == p.stem


def test_cli_render(tmp_path, capsys, monkeypatch):
    from labkit.cli import main as cli

    monkeypatch.setenv("LABKIT_RUN_ROOT", str(tmp_path / "runs"))
    p = tmp_path / "c.json"
    CFG_CPU.to_json(p)
    assert cli(["render", str(p), "--backend", "slurm", "--cluster", "generic-gres"]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --account=workshop" in out and "/shared/labkit/runs/tp2pp2" in out
    assert cli(["render", str(p)]) == 0
    assert "--nnodes \"$NNODES\"" in capsys.readouterr().out
    assert cli(["render", str(p), "--hostfile"]) == 0
    assert capsys.readouterr().out == "node1 slots=2\nnode2 slots=2\n"
    assert cli(["render", str(p), "--backend", "slurm", "--cluster", "nope"]) == 2
