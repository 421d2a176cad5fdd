"""The job scripts pass a run to pretrain_gpt.py as Megatron-LM flags (config.json named in
$LABKIT_CONFIG for the fields without one), and flags and config give the same run.

The arguments are taken from the rendered scripts themselves (bash runs them with a torchrun
that prints what the program would receive); the engine test trains with the local backend's
own job script and compares its losses with a ``--config`` run of the same RunConfig.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.config import MEGATRON_FLAGS, RunConfig
from labkit.errors import ConfigError
from labkit.megatron_args import GROUPS, flag_groups, flag_words
from labkit.paths import DATA_DIR
from labkit.render import render_hostfile_launch, render_local, render_sbatch
from labkit.run import JobSpec
from labkit.site import ClusterProfile, load_cluster

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "code"))

# Prints the program's arguments (after torchrun's 10 option words and the program) and the
# config file the script names.
FAKE_TORCHRUN = ("#!/usr/bin/env python3\nimport json, os, sys\n"
                 "print(json.dumps({'args': sys.argv[12:], "
                 "'config': os.environ.get('LABKIT_CONFIG')}))\n")

CASES = {
    "tp2pp2": dict(nodes=2, gpus_per_node=2, tensor_model_parallel_size=2,
                   pipeline_model_parallel_size=2),
    "gpu_like": dict(gpus_per_node=4, tensor_model_parallel_size=2, precision="bf16",
                     device="cuda", recompute_granularity="full", num_query_groups=2,
                     swiglu=True, use_distributed_optimizer=True, memory_limit_gb=3.5,
                     eval_interval=5, save_interval=10, torch_profiler=True,
                     torch_profiler_ranks=(0, 1), data_path="/data/my corpus/x_text_document",
                     tokenizer_dir="/data/tok", lr=3e-4, attention_backend="flash"),
    "vpp": dict(gpus_per_node=2, pipeline_model_parallel_size=2, num_layers=8,
                num_layers_per_virtual_pipeline_stage=2, untie_embeddings_and_output_weights=True),
}


def _script_args(script: str, tmp_path: Path) -> dict:
    fake = tmp_path / "torchrun"
    fake.write_text(FAKE_TORCHRUN)
    fake.chmod(0o755)
    p = subprocess.run(["bash", "-c", script.replace("NNODES=2", "NNODES=1")],
                       capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "MASTER_PORT": "1"})
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.splitlines()[0])


def test_every_flagged_field_is_in_one_group():
    grouped = [n for names in GROUPS.values() for n in names]
    assert sorted(grouped) == sorted([*MEGATRON_FLAGS, "precision"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_script_flags_resolve_to_the_run_config(case, tmp_path, monkeypatch):
    import engine_args

    cfg = RunConfig(name=case, **CASES[case])
    run_dir = tmp_path / case
    run_dir.mkdir()
    cfg.to_json(run_dir / "config.json")
    script = render_local(JobSpec.from_config(cfg), run_dir, torchrun=str(tmp_path / "torchrun"))
    got = _script_args(script, tmp_path)
    assert got["config"] == str(run_dir / "config.json")
    words = flag_words(cfg, DATA_DIR)  # labkit's pretrain_gpt.py reads this checkout's data/
    assert got["args"][:len(words)] == words
    prefix = cfg.data_path or str(DATA_DIR / "corpus_text_document")
    tok = cfg.tokenizer_dir or str(Path(prefix).parent / "tokenizer")
    args = got["args"]
    data = ("--data-path", "--vocab-file", "--merge-file", "--tokenizer-type", "--split")
    assert {k: args[args.index(k) + 1] for k in data} == {
        "--data-path": prefix, "--vocab-file": f"{tok}/vocab.json",
        "--merge-file": f"{tok}/merges.txt", "--tokenizer-type": "GPT2BPETokenizer",
        "--split": "98,2,0"}
    assert "--config" not in got["args"]  # Megatron-LM refuses flags it does not know
    assert got["args"][-4:] == ["--save", str(run_dir / "checkpoints"),
                                "--load", str(run_dir / "checkpoints")]
    monkeypatch.setenv("LABKIT_CONFIG", got["config"])
    monkeypatch.setenv("WORLD_SIZE", str(cfg.world_size))
    if cfg.device == "cuda":  # parsed here, not run: the GPU check is not what is tested
        monkeypatch.setattr(engine_args.torch.cuda, "is_available", lambda: True)
    resolved, where, ckpt, _ = engine_args.parse_args(got["args"])
    assert resolved == cfg and where == run_dir and ckpt == run_dir / "checkpoints"
    # A flag edited in the script no longer matches config.json: stopped, the field named.
    edited = [("64" if w == "2" and got["args"][i - 1] == "--micro-batch-size" else w)
              for i, w in enumerate(got["args"])]
    with pytest.raises(ConfigError, match=r"micro_batch_size: --micro-batch-size 64 but "
                                          r"config.json has 2"):
        engine_args.parse_args(edited)
    with pytest.raises(ConfigError, match="--lr-decay-style linear"):
        engine_args.parse_args([*got["args"], "--lr-decay-style", "linear"])
    # Data the engine would not read: stopped, both paths named.
    with pytest.raises(ConfigError, match=rf"--data-path /elsewhere/x but the engine reads "
                                          rf"{prefix}"):
        engine_args.parse_args([*got["args"], "--data-path", "/elsewhere/x"])
    with pytest.raises(ConfigError, match=rf"--merge-file /t/merges.txt but the engine reads "
                                          rf"{tok}/merges.txt"):
        engine_args.parse_args([*got["args"], "--merge-file", "/t/merges.txt"])
    for flag, value in (("--tokenizer-type", "HuggingFaceTokenizer"), ("--split", "969,30,1")):
        with pytest.raises(ConfigError, match=f"{flag} {value}"):
            engine_args.parse_args([*got["args"], flag, value])


def test_without_labkit_config_the_flags_alone_make_the_run(tmp_path, monkeypatch):
    """Flag mode by hand (no config.json): the flagged fields still come out as rendered."""
    import engine_args

    cfg = RunConfig(name="byhand", **CASES["tp2pp2"])
    monkeypatch.delenv("LABKIT_CONFIG", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    resolved, where, _, _ = engine_args.parse_args([*flag_words(cfg, DATA_DIR), "--run-dir",
                                                    str(tmp_path / "byhand")])
    assert resolved == cfg and where == tmp_path / "byhand"
    # Data elsewhere: the flags alone say where (the tokenizer beside the corpus is the default).
    other = RunConfig(name="byhand", data_path="/d/x_text_document", tokenizer_dir="/tok",
                      **CASES["tp2pp2"])
    for c in (other, other.replace(tokenizer_dir=None)):
        resolved, _, _, _ = engine_args.parse_args([*flag_words(c, DATA_DIR), "--run-dir",
                                                    str(tmp_path / "byhand")])
        assert resolved == c
    with pytest.raises(ConfigError, match="different folders"):
        engine_args.parse_args([*flag_words(other, DATA_DIR), "--merge-file", "/a/merges.txt"])


def test_a_site_program_runs_the_training_script_only(tmp_path):
    """``program:`` in a site YAML: the training job runs it with the flags; the doctor's probe
    and the all-reduce benchmark (programs given by path) stay in code_dir."""
    import shutil

    from labkit.measured.comm import BENCH

    copy = tmp_path / "megatron lm" / "pretrain_gpt.py"
    copy.parent.mkdir()
    shutil.copy(REPO / "code" / "pretrain_gpt.py", copy)
    yaml = tmp_path / "site.yaml"
    yaml.write_text(f"name: upstream\ngpu_request: none\ncode_dir: /opt/labkit/code\n"
                    f"program: {json.dumps(str(copy))}\n"
                    f"hosts: [{{name: node1, slots: 2}}, {{name: node2, slots: 2}}]\n")
    site = load_cluster(yaml)
    assert site.program == str(copy)
    cfg = RunConfig(name="tp2pp2", **CASES["tp2pp2"])
    for text in (render_sbatch(JobSpec.from_config(cfg), site, Path("/runs/x")),
                 render_hostfile_launch(JobSpec.from_config(cfg), site, Path("/runs/x"))):
        assert f"export PROGRAM='{copy}'" in text
        assert '"${MEGATRON_ARGS[@]}"' in text and "--config" not in text
        assert "DATA_DIR=/opt/labkit/data" in text  # labkit's data beside code_dir
    bench = render_sbatch(JobSpec(name="ar", nodes=2), site, Path("/runs/ar"), program=BENCH,
                          program_args=["--sizes", "1"])
    assert f"export PROGRAM={BENCH}" in bench and str(copy) not in bench
    with pytest.raises(ConfigError, match="program="):
        ClusterProfile(program="/opt/x\n/pretrain_gpt.py")


def test_hostfile_scripts_pass_the_flags_and_name_the_config(tmp_path):
    cfg = RunConfig(name="tp2pp2", **CASES["tp2pp2"])
    site = ClusterProfile(name="two", hosts=({"name": "node1", "slots": 2},
                                             {"name": "node2", "slots": 2}), gpu_request="none")
    for launcher in ("pdsh", "deepspeed"):
        text = render_hostfile_launch(JobSpec.from_config(cfg), site.replace(launcher=launcher),
                                      Path("/runs/x"))
        assert '"$PROGRAM" "${MEGATRON_ARGS[@]}"' in text
        assert 'export LABKIT_CONFIG="$RUN_DIR/config.json"' in text
        (tmp_path / "job.sh").write_text(text)
        subprocess.run(["bash", "-n", str(tmp_path / "job.sh")], check=True)
    # The DeepSpeed launcher passes on only the variables listed in .deepspeed_env.
    env_line = next(ln for ln in text.splitlines() if ln.startswith("{ for v in "))
    assert "LABKIT_CONFIG" in env_line.split(";")[0].split()
    assert JobSpec.from_config(cfg).megatron_flags == flag_groups(cfg)


@pytest.mark.engine
def test_flags_on_the_local_backend_train_as_the_config(tmp_path, run_root):
    """TP=2 x PP=2: the local backend's own job script (flags) and ``--config`` give the same
    losses at every logged iteration."""
    from engine_runs import SMALL, ensure_data, losses, train

    from labkit.jobs import submit

    ensure_data()
    fields = {**SMALL, "train_iters": 6, "log_interval": 2, "tensor_model_parallel_size": 2,
              "pipeline_model_parallel_size": 2, "gpus_per_node": 4}
    cfg = RunConfig(name="flags", nodes=1, **fields)
    job = submit(cfg, backend="local")
    script = (job.run_dir / "job.sh").read_text()
    assert '"$PROGRAM" "${MEGATRON_ARGS[@]}"' in script and "--config" not in script
    assert job.wait(timeout=600, progress=False).name == "COMPLETED", job.tail(40)
    by_config = train(tmp_path, "config", **fields)
    flagged, configured = losses(job.run_dir), losses(by_config)
    assert sorted(flagged) == [2, 4, 6]
    assert flagged == configured

