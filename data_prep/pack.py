"""Packing: documents (each followed by EOS, and preceded by BOS with `--bos`) concatenated and cut into rows of
`row_len` tokens.

Rows do not overlap: every token of the stream lands in exactly one row, in order. The tail that
does not fill a last row is dropped and counted (it is reported in the manifest).
"""

from __future__ import annotations

import numpy as np


class Packer:
    """Accumulates token ids and hands back full rows as one [n, row_len] array at a time."""

    def __init__(self, row_len: int, eos_id: int, dtype: np.dtype, bos_id: int | None = None) -> None:
        self.row_len = row_len
        self.eos = np.array([eos_id], dtype=dtype)
        self.bos = None if bos_id is None else np.array([bos_id], dtype=dtype)
        self.dtype = dtype
        self._parts: list[np.ndarray] = []
        self._pending = 0

    def add(self, ids: np.ndarray) -> np.ndarray | None:
        """Append one document (after its BOS, where there is one) and its EOS; return the rows it completed
        (or None)."""
        if self.bos is not None:
            self._parts.append(self.bos)
            self._pending += 1
        self._parts.append(ids.astype(self.dtype, copy=False))
        self._parts.append(self.eos)
        self._pending += len(ids) + 1
        if self._pending < self.row_len:
            return None
        stream = np.concatenate(self._parts)
        n = len(stream) // self.row_len
        rows = stream[: n * self.row_len].reshape(n, self.row_len)
        rest = stream[n * self.row_len :]
        self._parts = [rest] if len(rest) else []
        self._pending = len(rest)
        return rows

    @property
    def leftover(self) -> int:
        """Tokens held back that do not fill a row (dropped at the end)."""
        return self._pending
