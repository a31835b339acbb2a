"""Tokenize chunks of documents in order, in this process or in a pool of worker processes.

At most `2 * workers` chunks are in flight, so the corpus streams through in bounded memory
(`Pool.imap` would read the whole input ahead). Workers are spawned, not forked: the parent has
used Rust threads (BPE training), and forking a threaded process can deadlock. Each tokenizer runs
single-threaded so that `--workers N` means N cores.
"""

from __future__ import annotations

import collections
import multiprocessing as mp
import os
import signal
from typing import Iterable, Iterator

import numpy as np

from data_prep import tokenizer as tk
from rrtrain.core.child_python import safe_path_while_starting

_WORKER_TOK: tk.Tokenizer | None = None


def _single_threaded() -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ.setdefault("RAYON_NUM_THREADS", "1")


def _init_worker(spec: str, saved_file: str | None, eos_id: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and tears the pool down
    _single_threaded()
    global _WORKER_TOK
    _WORKER_TOK = tk.reload(spec, saved_file, eos_id)


def _pack_result(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    flat = np.concatenate(arrays) if arrays else np.zeros(0, np.uint32)
    return flat.astype(np.uint32, copy=False), lengths


def _encode_chunk(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    assert _WORKER_TOK is not None
    return _pack_result(_WORKER_TOK.encode_batch(texts))


def _unpack(flat: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    bounds = np.cumsum(lengths)[:-1]
    return np.split(flat, bounds) if len(lengths) else []


def encode_chunks(chunks: Iterable[list[str]], tok: tk.Tokenizer, saved_file: str | None,
                  workers: int) -> Iterator[tuple[list[str], list[np.ndarray]]]:
    """Yield (texts, token arrays) per chunk, in input order."""
    if workers <= 1:
        _single_threaded()
        for texts in chunks:
            yield texts, tok.encode_batch(texts)
        return
    ctx = mp.get_context("spawn")
    with safe_path_while_starting():  # the workers start as `python -c`: nothing from the current directory
        pool = ctx.Pool(workers, initializer=_init_worker, initargs=(tok.spec, saved_file, tok.eos_id))
    try:
        inflight: collections.deque = collections.deque()
        it = iter(chunks)
        exhausted = False
        while True:
            while not exhausted and len(inflight) < 2 * workers:
                try:
                    texts = next(it)
                except StopIteration:
                    exhausted = True
                    break
                inflight.append((texts, pool.apply_async(_encode_chunk, (texts,))))
            if not inflight:
                break
            texts, res = inflight.popleft()
            flat, lengths = res.get()
            yield texts, _unpack(flat, lengths)
        pool.close()
        pool.join()
    finally:
        pool.terminate()
