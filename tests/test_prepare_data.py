"""code/prepare_data.py: GPT-2 BPE files, megatron-core indexed dataset, idempotence, user input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "code" / "prepare_data.py"
sys.path.insert(0, str(REPO / "tests"))

TEXT = ("Tensor parallelism splits each weight matrix across GPUs; pipeline parallelism splits "
        "the layers into stages. Data parallelism keeps a full copy of the model on each rank "
        "and averages the gradients. ") * 40


def _prepare(*args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                         timeout=600, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def user_data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("prep")
    (d / "a.txt").write_text(TEXT)
    (d / "b.jsonl").write_text("\n".join(json.dumps({"text": f"Document {i}: " + TEXT[:400]})
                                         for i in range(5)) + "\n")
    _prepare("--input", str(d / "a.txt"), str(d / "b.jsonl"), "--vocab-size", "400",
             "--out", str(d / "out"))
    return d


def test_user_text_and_jsonl_become_an_indexed_dataset(user_data):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    out = user_data / "out"
    manifest = json.loads((out / "prepare_data.json").read_text())
    assert manifest["documents"] == 6  # one txt file + five jsonl lines
    ds = IndexedDataset(str(out / "corpus_text_document"))
    assert len(ds) == 6
    eod = manifest["eod_id"]
    assert all(int(ds[i][-1]) == eod for i in range(len(ds)))  # each document ends with EOD
    assert sum(len(ds[i]) for i in range(len(ds))) == manifest["tokens"]


def test_tokenizer_files_are_gpt2_bpe(user_data):
    from tokenizers import ByteLevelBPETokenizer

    tok_dir = user_data / "out" / "tokenizer"
    vocab = json.loads((tok_dir / "vocab.json").read_text())
    assert isinstance(vocab, dict) and "<|endoftext|>" in vocab and len(vocab) <= 400
    merges = (tok_dir / "merges.txt").read_text().splitlines()
    assert merges[0].startswith("#version") and all(len(m.split()) == 2 for m in merges[1:])
    tok = ByteLevelBPETokenizer(str(tok_dir / "vocab.json"), str(tok_dir / "merges.txt"))
    text = "Pipeline parallelism splits the layers."
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text
    assert len(ids) < len(text.encode())  # merges were learned, not bytes only
    # The ids in the dataset are the ones the saved files give.
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(str(user_data / "out" / "corpus_text_document"))
    first = [int(x) for x in ds[0][:-1]]
    assert first == tok.encode(TEXT.strip()).ids


def test_second_run_changes_nothing(user_data):
    out = user_data / "out"
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("corpus_text_document.*")}
    r = _prepare("--input", str(user_data / "a.txt"), str(user_data / "b.jsonl"),
                 "--vocab-size", "400", "--out", str(out))
    assert "nothing changed" in r.stdout
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("corpus_text_document.*")} == before


def test_existing_tokenizer_is_reused(user_data):
    out2 = user_data / "out2"
    r = _prepare("--input", str(user_data / "a.txt"), "--tokenizer",
                 str(user_data / "out" / "tokenizer"), "--out", str(out2))
    assert "trained" not in r.stdout
    assert not (out2 / "tokenizer").exists()
    m1 = json.loads((user_data / "out" / "prepare_data.json").read_text())
    m2 = json.loads((out2 / "prepare_data.json").read_text())
    assert m2["eod_id"] == m1["eod_id"] and m2["vocab_size"] == m1["vocab_size"]


def test_bad_jsonl_names_the_line_and_the_fix(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    out = subprocess.run([sys.executable, str(SCRIPT), "--input", str(bad), "--out",
                          str(tmp_path / "o")], capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert f"{bad} line 2" in out.stderr and "'text'" in out.stderr


def test_default_corpus_matches_the_tiny_preset():
    from engine_runs import ensure_data

    from labkit.config import PRESETS

    data = ensure_data()
    manifest = json.loads((data / "prepare_data.json").read_text())
    assert manifest["vocab_size"] == PRESETS["tiny"]["vocab_size"]
    assert manifest["tokens"] > 300_000  # enough text for the notebooks' short runs
    assert (data / "tokenizer" / "vocab.json").is_file()
    assert (data / "tokenizer" / "merges.txt").is_file()
