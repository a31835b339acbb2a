"""A dataset of someone else's (data.path = a co-tenant's prepared dataset) is checked once when a run starts, then
read for hours: its owner can swap a shard for a FIFO, truncate it or rewrite it meanwhile. The loader opens each
shard once through the file layer and reads it from that descriptor (never by path again, never a memory map), so
a swap is refused in one line or not seen at all, never a hang in open(); a truncated or rewritten shard is one
line naming it, never a library's traceback or SIGBUS. Each loader call runs in a thread with a deadline (a FIFO
opened for writing frees one that hung), so the suite cannot hang. Budget: well under 1 s per test (in-process
loaders over a 40-row dataset, no training step)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from prep_helpers import write_id_dataset
from faultutil import unblocked
from rrtrain.core.errors import UsageError
from rrtrain.data.loader import TrainLoader, eval_batches
from rrtrain.data.verify import verify_dataset

ROWS = 40  # 8 uint16 ids a row, 16 rows a shard: three train shards
DEADLINE_S = 15


def dataset(root: Path, compression: str | None = None) -> tuple[Path, dict[str, Any]]:
    d = root / "shared_data"
    manifest = write_id_dataset(d, ROWS, 16, shard_size=300, compression=compression)
    verify_dataset(str(d), manifest)  # the run's check at its start: everything after it is the co-tenant's move
    return d, manifest


def shards(d: Path, split: str = "train") -> list[Path]:
    found = sorted(p for p in (d / split).iterdir() if p.name.startswith("shard."))
    assert found and (split != "train" or len(found) > 1), found
    return found


def to_fifos(paths: list[Path]) -> None:
    """What the co-tenant does after the check: each shard renamed away and a FIFO made at its name."""
    for p in paths:
        p.rename(p.with_name(p.name + ".orig"))
        os.mkfifo(p, 0o644)


def loader(d: Path, cache: Path, **kw: Any) -> TrainLoader:
    return TrainLoader(str(d), micro_batch=4, global_batch=4, rank=0, world_size=1, local_rank=0, seed=0,
                       cache_dir=str(cache), **kw)


def epoch(train: TrainLoader) -> list[int]:
    """One epoch's row ids (every shard read), the loader closed after."""
    it = iter(train)
    try:
        return sorted(int(i) for _ in range(ROWS // 4) for i in next(it)[:, 0])
    finally:
        train.close()


def within(call: Callable[[], Any], fifos: list[Path]) -> Any:
    """`call()` given DEADLINE_S: the old loader blocked opening a shard that became a FIFO, for ever."""
    return unblocked(call, fifos, DEADLINE_S)


def one_line(err: pytest.ExceptionInfo, *words: str) -> str:
    message = str(err.value)
    assert "\n" not in message and all(w in message for w in words), message
    return message


def test_a_shard_made_a_fifo_after_the_check_is_one_line_not_a_hang(tmp_path: Path) -> None:
    d, _ = dataset(tmp_path)
    fifos = shards(d)
    to_fifos(fifos)
    with pytest.raises(UsageError) as err:
        within(lambda: epoch(loader(d, tmp_path / "cache")), fifos)
    one_line(err, str(fifos[0]), "not a regular file")


def test_a_shard_made_a_fifo_once_the_loader_opened_it_is_never_opened_again(tmp_path: Path) -> None:
    """The reviewer's reproduction: every shard swapped once the run has started; the run reads the files it
    opened (the co-tenant's rename changes no open descriptor) and finishes its epoch."""
    d, _ = dataset(tmp_path)
    train = loader(d, tmp_path / "cache")
    fifos = shards(d)
    to_fifos(fifos)
    assert within(lambda: epoch(train), fifos) == list(range(ROWS))
    val = shards(d, "val")
    to_fifos(val)
    with pytest.raises(UsageError) as err:  # a split opened after the swap: refused, not a hang
        within(lambda: eval_batches(str(d), micro_batch=4, n_batches=1, rank=0, world_size=1,
                                    cache_dir=str(tmp_path / "cache")), val)
    one_line(err, "not a regular file")


def test_a_compressed_shard_made_a_fifo_after_the_check_is_one_line_not_a_hang(tmp_path: Path) -> None:
    """A zstd dataset: its shards are decompressed into the private cache when first needed, read by the layer
    (streaming copied them by path, and hung on a FIFO)."""
    d, _ = dataset(tmp_path, compression="zstd")
    fifos = shards(d)
    to_fifos(fifos)
    with pytest.raises(UsageError) as err:
        within(lambda: epoch(loader(d, tmp_path / "cache")), fifos)
    one_line(err, "not a regular file")


def test_a_shard_truncated_while_the_run_reads_it_is_one_line_naming_it(tmp_path: Path) -> None:
    """Truncated in place (the inode the loader holds): a short read, one line, where a memory map is SIGBUS and
    streaming's reader an IndexError traceback."""
    d, _ = dataset(tmp_path)
    train = loader(d, tmp_path / "cache")
    for p in shards(d):
        os.truncate(p, 64)
    with pytest.raises(UsageError) as err:
        within(lambda: epoch(train), [])
    one_line(err, "shard", str(d / "train"), "truncated")
    again = dataset(tmp_path / "again")[0]
    os.truncate(shards(again)[0], 64)  # truncated before the loader opens it: its recorded length says so
    with pytest.raises(UsageError) as err:
        within(lambda: epoch(loader(again, tmp_path / "cache2")), [])
    one_line(err, str(shards(again)[0]), "64 bytes")


def test_a_shard_rewritten_with_ids_outside_the_vocabulary_is_one_line(tmp_path: Path) -> None:
    """Rewritten in place after the check (same length, ids past the vocabulary): one line naming the shard,
    never an embedding IndexError or a device-side assert."""
    d, manifest = dataset(tmp_path)
    train = loader(d, tmp_path / "cache", manifest={**manifest, "vocab_size": 50_000})
    for p in shards(d):
        raw = bytearray(p.read_bytes())
        raw[-16:] = np.full(8, 60_000, np.uint16).tobytes()  # the shard's last row
        p.write_bytes(bytes(raw))
    with pytest.raises(UsageError) as err:
        within(lambda: epoch(train), [])
    one_line(err, "token id 60000", "vocabulary of 50000", str(d / "train"))


def test_a_truncated_shard_read_by_a_worker_process_is_one_line(tmp_path: Path) -> None:
    """data.num_workers > 0: the worker's error comes back as the worker's one line, not torch's traceback text."""
    d, _ = dataset(tmp_path)
    train = loader(d, tmp_path / "cache", num_workers=1)
    for p in shards(d):
        os.truncate(p, 64)
    with pytest.raises(UsageError) as err:
        within(lambda: epoch(train), [])
    assert one_line(err, "truncated").startswith("shard ")
