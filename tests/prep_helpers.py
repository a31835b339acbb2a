"""Helpers shared by the data-prep and loader tests: small datasets built without mocks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def write_id_dataset(out: str | os.PathLike, n_train: int, n_val: int = 16, seq_len: int = 7,
                     shard_size: int = 2048, compression: str | None = None, first_id: int = 0) -> dict:
    """A dataset whose row i holds i in every position, written with the real shard writer and manifest.

    Row identity is then readable from any batch (batch[:, 0]), which is what the loader tests need. `first_id`:
    the train split's first row id (and first_id + 50,000 the val split's), to tell datasets apart in a mixture.
    """
    from data_prep.manifest import build_manifest, dataset_fingerprint, write_manifest
    from data_prep.writer import SplitWriter

    out = str(out)
    os.makedirs(out, exist_ok=True)
    splits = {}
    for split, n in (("train", n_train), ("val", n_val)):
        w = SplitWriter(os.path.join(out, split), seq_len + 1, np.dtype(np.uint16), compression=compression,
                        size_limit=shard_size, vocab_size=65536, count_tokens=False)
        offset = first_id + (0 if split == "train" else 50_000)
        w.write_rows(np.repeat(np.arange(offset, offset + n, dtype=np.uint16)[:, None], seq_len + 1, axis=1))
        w.close()
        splits[split] = {"samples": n, "tokens": n * (seq_len + 1), "documents": n, "dropped_tokens": 0}
    manifest = build_manifest(
        source="ids", source_fingerprint="ids", tokenizer="byte", tokenizer_hash="ids", tokenizer_file=None,
        vocab_size=65536, eos_id=0, seq_len=seq_len, dtype="uint16", compression=compression, splits=splits,
        unigram_entropy=0.0, seed=0, val_fraction=0.1, min_val_samples=1,
        fingerprint=dataset_fingerprint(out, "ids", seq_len), documents_skipped_empty=0)
    write_manifest(out, manifest)
    return manifest


def prep(*args: str) -> int:
    """Run `rrtrain prep` in this process (quiet); returns the exit status."""
    from data_prep.cli import main

    return main([*args, "--quiet"])


def prep_subprocess(*args: str, **kw) -> subprocess.CompletedProcess:
    """Run `python -m rrtrain prep` as users do, capturing output."""
    return subprocess.run([sys.executable, "-m", "rrtrain", "prep", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=kw.pop("timeout", 120), **kw)


def tree(path: str | os.PathLike) -> dict[str, bytes]:
    """Every file under `path` (relative name -> bytes), for byte-identity checks."""
    root = Path(path)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def read_split(path: str | os.PathLike, split: str) -> np.ndarray:
    """All rows of a split in storage order, through streaming's own StreamingDataset."""
    from rrtrain.data.shm import open_streaming_dataset

    # as the trainer opens one: other tests' runs may be probing for a free prefix, and this search must not
    # keep a dead run's names alive (see clean_stale_shm)
    ds = open_streaming_dataset(local=str(path), split=split, shuffle=False, batch_size=1)
    rows = np.stack([ds[i]["tokens"] for i in range(ds.num_samples)])
    del ds
    return rows
