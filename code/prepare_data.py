"""Corpus -> byte-level BPE tokenizer (GPT-2 files) -> megatron-core indexed dataset.

Runbook:

    python code/prepare_data.py                      # default corpus, no download (make data)
    python code/prepare_data.py --input notes.txt more.jsonl --out data/mine
    python code/prepare_data.py --input corpus.jsonl --tokenizer data/tokenizer --out data/mine

The default corpus is English that ships with every CPython: ``pydoc_data.topics`` (the help()
pages) and the docstrings of the standard library's modules, several MB in all. The tokenizer
is trained with the ``tokenizers`` package and saved in GPT-2 format (``vocab.json`` +
``merges.txt``), so Megatron-LM's GPT2BPETokenizer reads it as well. Documents are separated by
``<|endoftext|>`` (the end-of-document token, as in GPT-2).

Writes under ``--out`` (default ``data/``):
    tokenizer/vocab.json, tokenizer/merges.txt   (unless --tokenizer names existing files)
    corpus_text_document.bin / .idx              (megatron-core IndexedDatasetBuilder)
    prepare_data.json                            (what was built from what: makes reruns a no-op)

Idempotent: a second run with the same inputs and options prints that nothing changed.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "data"
EOD = "<|endoftext|>"
PREFIX = "corpus_text_document"
# Standard-library folders whose docstrings are tests, vendored code or non-English noise.
_SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "turtledemo", "__pycache__",
              "ensurepip", "distutils", "tkinter", "pydoc_data"}


# --- corpus ---------------------------------------------------------------------------------
def default_documents() -> Iterator[str]:
    """The help() topics, then one document per standard-library module (its docstrings)."""
    from pydoc_data.topics import topics

    for key in sorted(topics):
        yield topics[key].strip()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        if _SKIP_DIRS & set(path.relative_to(stdlib).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        docs = [ast.get_docstring(node) for node in ast.walk(tree)
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                     ast.AsyncFunctionDef))]
        text = "\n\n".join(d.strip() for d in docs if d and len(d) > 40)
        if text:
            yield text


def file_documents(paths: list[Path]) -> Iterator[str]:
    """A .jsonl file gives one document per line (its ``text`` field); other files are one each."""
    for path in paths:
        if path.suffix == ".jsonl":
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    text = json.loads(line)["text"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    sys.exit(f"prepare_data: {path} line {n} is not a JSON object with a 'text' "
                             f"field: {line[:80]!r}. Each jsonl line must look like "
                             '{"text": "..."}')
                if text.strip():
                    yield text.strip()
        else:
            text = path.read_text(encoding="utf-8", errors="replace").strip()
            if text:
                yield text


# --- build steps ----------------------------------------------------------------------------
def train_tokenizer(docs: list[str], vocab_size: int, out_dir: Path) -> None:
    """Train a byte-level BPE and save GPT-2 format vocab.json + merges.txt in ``out_dir``."""
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer(add_prefix_space=False)
    tok.train_from_iterator(docs, vocab_size=vocab_size, min_frequency=2,
                            special_tokens=[EOD], show_progress=False)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_model(str(out_dir))


def load_tokenizer(tok_dir: Path):  # -> tokenizers.Tokenizer
    """Read GPT-2 vocab.json + merges.txt; the ids come from these files."""
    from tokenizers import ByteLevelBPETokenizer

    vocab, merges = tok_dir / "vocab.json", tok_dir / "merges.txt"
    missing = [p.name for p in (vocab, merges) if not p.is_file()]
    if missing:
        sys.exit(f"prepare_data: tokenizer folder {tok_dir} lacks {', '.join(missing)}; give a "
                 f"folder with GPT-2 vocab.json and merges.txt, or leave out --tokenizer to "
                 f"train one")
    tok = ByteLevelBPETokenizer(str(vocab), str(merges), add_prefix_space=False)
    if tok.token_to_id(EOD) is None:
        sys.exit(f"prepare_data: {vocab} has no {EOD!r} token; the dataset needs it to separate "
                 f"documents. Use a GPT-2-style vocabulary that has it.")
    return tok


def write_dataset(docs: list[str], tok, prefix: Path) -> int:
    """Tokenize ``docs`` (each followed by EOD) into ``prefix``.bin/.idx; returns the token count."""
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    eod = tok.token_to_id(EOD)
    dtype = DType.optimal_dtype(tok.get_vocab_size())
    tmp_bin = prefix.with_name(prefix.name + ".bin.tmp")
    builder = IndexedDatasetBuilder(str(tmp_bin), dtype=dtype)
    total = 0
    for start in range(0, len(docs), 256):
        for enc in tok.encode_batch(docs[start:start + 256]):
            ids = enc.ids + [eod]
            builder.add_item(torch.tensor(np.asarray(ids, dtype=np.int64)))
            builder.end_document()
            total += len(ids)
    tmp_idx = prefix.with_name(prefix.name + ".idx.tmp")
    builder.finalize(str(tmp_idx))
    # Rename at the end so an interrupted run never leaves a half-written dataset behind.
    tmp_bin.replace(prefix.with_suffix(".bin"))
    tmp_idx.replace(prefix.with_suffix(".idx"))
    return total


# --- idempotence ----------------------------------------------------------------------------
def _fingerprint(inputs: list[Path], tokenizer: Path | None, vocab_size: int) -> str:
    h = hashlib.sha256()
    h.update(f"v1 vocab={vocab_size} python={sys.version}".encode())
    for path in inputs:
        h.update(str(path.resolve()).encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    if tokenizer is not None:
        for name in ("vocab.json", "merges.txt"):
            p = tokenizer / name
            h.update(hashlib.sha256(p.read_bytes()).digest() if p.is_file() else b"-")
    return h.hexdigest()


def prepare(out: Path = DEFAULT_OUT, inputs: list[Path] | None = None,
            tokenizer: Path | None = None, vocab_size: int = 4096) -> dict:
    """Build (or find up to date) the tokenizer and dataset under ``out``; returns the manifest."""
    inputs = [Path(p) for p in inputs or []]
    bad = [str(p) for p in inputs if not p.is_file()]
    if bad:
        sys.exit(f"prepare_data: input file(s) not found: {', '.join(bad)}")
    if vocab_size < 300:
        sys.exit(f"prepare_data: --vocab-size {vocab_size} is too small for a byte-level BPE "
                 f"(256 byte tokens + specials); use >= 300, e.g. 4096")
    out = Path(out)
    manifest_path = out / "prepare_data.json"
    tok_dir = Path(tokenizer) if tokenizer else out / "tokenizer"
    key = _fingerprint(inputs, Path(tokenizer) if tokenizer else None, vocab_size)
    prefix = out / PREFIX
    outputs = [prefix.with_suffix(".bin"), prefix.with_suffix(".idx"),
               tok_dir / "vocab.json", tok_dir / "merges.txt"]
    if manifest_path.is_file() and all(p.is_file() for p in outputs):
        old = json.loads(manifest_path.read_text())
        if old.get("fingerprint") == key:
            print(f"prepare_data: nothing changed; {prefix}.bin/.idx ({old['tokens']:,} tokens) "
                  f"and {tok_dir} are up to date")
            return old

    t0 = time.time()
    docs = list(file_documents(inputs)) if inputs else list(default_documents())
    if not docs:
        sys.exit("prepare_data: the inputs hold no text")
    chars = sum(len(d) for d in docs)
    print(f"prepare_data: {len(docs):,} documents, {chars / 1e6:.1f} M characters")
    if tokenizer is None:
        train_tokenizer(docs, vocab_size, tok_dir)
        print(f"prepare_data: trained byte-level BPE, vocab {vocab_size} -> {tok_dir}")
    tok = load_tokenizer(tok_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokens = write_dataset(docs, tok, prefix)
    manifest = {"fingerprint": key, "documents": len(docs), "characters": chars,
                "tokens": tokens, "vocab_size": tok.get_vocab_size(), "eod_id": tok.token_to_id(EOD),
                "tokenizer_dir": str(tok_dir), "data_prefix": str(prefix),
                "inputs": [str(p) for p in inputs] or ["<python stdlib docs>"]}
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"prepare_data: wrote {prefix}.bin/.idx: {tokens:,} tokens "
          f"({time.time() - t0:.1f} s)")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", nargs="+", type=Path, metavar="FILE",
                    help="text or jsonl ({'text': ...} per line) files; default: CPython's docs")
    ap.add_argument("--tokenizer", type=Path, metavar="DIR",
                    help="existing folder with GPT-2 vocab.json + merges.txt (no training)")
    ap.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary (default 4096)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default data/)")
    a = ap.parse_args(argv)
    prepare(a.out, a.input, a.tokenizer, a.vocab_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
