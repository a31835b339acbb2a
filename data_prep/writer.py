"""MDS shard writing for one split: rows of token ids, with per-split counts and token frequencies.

The narrowest unsigned dtype that holds the vocabulary is used (uint16 up to 65,536 ids, else
uint32); shard hashes are always written so that readers can validate downloads and so that the
dataset fingerprint (a hash over index.json files) covers the shard contents.
"""

from __future__ import annotations

import numpy as np

from rrtrain.core.errors import UsageError
from rrtrain.core.lazy_import import streaming_module

HASHES = ["sha1", "xxh64"]
COLUMN = "tokens"


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32 (ids above uint32 are refused)."""
    if vocab_size <= 1 << 16:
        return np.dtype(np.uint16)
    if vocab_size <= 1 << 32:
        return np.dtype(np.uint32)
    raise UsageError(f"vocabulary size {vocab_size} is too large for uint32 token ids")


def parse_size(text: str) -> int:
    """'64mb', '20kb', '1048576' -> bytes."""
    t = text.strip().lower()
    for suffix, mult in (("gb", 1 << 30), ("mb", 1 << 20), ("kb", 1 << 10), ("b", 1)):
        if t.endswith(suffix):
            t, scale = t[: -len(suffix)], mult
            break
    else:
        scale = 1
    try:
        value = int(float(t) * scale)
    except ValueError as err:
        raise UsageError(f"bad size '{text}' (e.g. 64mb, 512kb)") from err
    if value <= 0:
        raise UsageError(f"size must be positive, got '{text}'")
    return value


class SplitWriter:
    """Writes one split's rows to MDS shards and counts what it wrote."""

    def __init__(self, out_dir: str, row_len: int, dtype: np.dtype, *, compression: str | None,
                 size_limit: int, vocab_size: int, count_tokens: bool) -> None:
        # the writer's own module, not `streaming`'s package: that imports transformers (5 s of CPU per prep)
        MDSWriter = streaming_module("streaming.base.format.mds.writer").MDSWriter  # noqa: N806 - its class

        self.row_len = row_len
        self.samples = 0
        self.documents = 0
        self.counts = np.zeros(vocab_size, dtype=np.int64) if count_tokens else None
        self._uncounted: list[np.ndarray] = []  # rows not yet in `counts`: bincount is O(vocab) per call
        self._uncounted_tokens = 0
        self._writer = MDSWriter(
            out=out_dir,
            columns={COLUMN: f"ndarray:{dtype.name}:{row_len}"},
            compression=compression,
            hashes=HASHES,
            size_limit=size_limit,
        )

    def write_rows(self, rows: np.ndarray) -> None:
        """Write [n, row_len] rows as n samples."""
        for row in rows:
            self._writer.write({COLUMN: row})
        self.samples += len(rows)
        if self.counts is not None:
            self._uncounted.append(rows.ravel())
            self._uncounted_tokens += rows.size
            if self._uncounted_tokens >= max(1 << 20, len(self.counts)):
                self._count()

    def _count(self) -> None:
        if self.counts is not None and self._uncounted:
            ids = np.concatenate(self._uncounted)
            self.counts += np.bincount(ids, minlength=len(self.counts))[: len(self.counts)]
        self._uncounted, self._uncounted_tokens = [], 0

    @property
    def tokens(self) -> int:
        return self.samples * self.row_len

    def close(self) -> None:
        self._count()
        self._writer.finish()


def unigram_entropy(counts: np.ndarray) -> float:
    """Entropy in nats of the empirical token distribution: the loss of the best context-free model."""
    total = counts.sum()
    if total == 0:
        return 0.0
    p = counts[counts > 0] / total
    return float(-(p * np.log(p)).sum())
