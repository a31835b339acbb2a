"""manifest.json: what a prepared dataset holds, and a fingerprint the trainer pins in checkpoints.

The fingerprint hashes the shards' index.json files (which carry every shard's sha1/xxh64), the
tokenizer's vocabulary hash and seq_len, so a resumed run refuses data that changed in any way that
matters, while a byte-identical re-prep keeps the same fingerprint.
"""

from __future__ import annotations

import json
from typing import Any

from rrtrain.core import files
from rrtrain.data.verify import dataset_fingerprint  # noqa: F401  (one definition: `rrtrain prep --verify` checks it)

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SPLITS = ("train", "val")


def build_manifest(*, source: str, source_fingerprint: str, tokenizer: str, tokenizer_hash: str,
                   tokenizer_file: str | None, vocab_size: int, eos_id: int, seq_len: int, dtype: str,
                   compression: str | None, splits: dict[str, dict[str, int]], unigram_entropy: float,
                   seed: int, val_fraction: float, min_val_samples: int, fingerprint: str,
                   documents_skipped_empty: int, source_compression: list[str] | None = None,
                   bos_id: int | None = None) -> dict[str, Any]:
    """The manifest as a plain dict; key order is fixed so the file is byte-identical for a seed.

    `source_compression` (the compressions of the source's files, e.g. ["gzip", "zstd"]) is recorded only when
    there is one, so a plain source's manifest is what it always was; `source_fingerprint` is over the
    decompressed documents, the same for a corpus compressed any way or not at all. `bos_id` (`--bos`: the token
    before each document) likewise only when there is one, after `eos_id`."""
    head: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "source": source,
        "source_fingerprint": source_fingerprint,
    }
    if source_compression:
        head["source_compression"] = list(source_compression)
    body: dict[str, Any] = {
        "tokenizer": tokenizer,
        "tokenizer_hash": tokenizer_hash,
        "tokenizer_file": tokenizer_file,
        "vocab_size": vocab_size,
        "eos_id": eos_id,
    }
    if bos_id is not None:
        body["bos_id"] = bos_id
    return head | body | {
        "seq_len": seq_len,
        "dtype": dtype,
        "compression": compression,
        "splits": splits,
        "unigram_entropy": unigram_entropy,
        "seed": seed,
        "val_fraction": val_fraction,
        "min_val_samples": min_val_samples,
        "documents_skipped_empty": documents_skipped_empty,
        "fingerprint": fingerprint,
    }


def write_manifest(out_dir: str, manifest: dict[str, Any]) -> None:
    files.atomic_write_beneath(out_dir, MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode("utf-8"))
