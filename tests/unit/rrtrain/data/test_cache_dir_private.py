"""The loader's shard cache (`data.cache_dir`, where a compressed or remote dataset is decompressed and its index
copied) must be the user's alone: streaming reads whatever index and shards it finds there as the dataset, so a
cache a co-tenant can write is training data they choose. A cache in a directory others can write is one line at
the loader, before streaming reads or writes it. Budget: well under 1 s (one small dataset, no training step)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from prep_helpers import write_id_dataset
from rrtrain.core.errors import UsageError
from rrtrain.data.loader import TrainLoader, eval_batches


@pytest.fixture(scope="module")
def compressed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A zstd dataset: read through the cache (an uncompressed local one is read in place)."""
    d = tmp_path_factory.mktemp("data") / "ds"
    write_id_dataset(d, 8, 4, compression="zstd")
    return d


def loader(data: Path, cache: Path) -> TrainLoader:
    return TrainLoader(str(data), micro_batch=2, global_batch=2, rank=0, world_size=1, local_rank=0, seed=0,
                       cache_dir=str(cache))


def refused(call, where: Path) -> None:  # noqa: ANN001 - a call that opens the dataset
    with pytest.raises(UsageError) as got:
        call()
    message = str(got.value)
    assert message.startswith("data cache ") and "\n" not in message and "can be written by" in message, message
    assert str(where) in message, message


def test_a_group_writable_cache_dir_is_refused_before_streaming_uses_it(compressed: Path, tmp_path: Path) -> None:
    shared = tmp_path / "proj-cache"
    shared.mkdir()
    os.chmod(shared, 0o775)  # a shared project's cache: a co-tenant could plant loader/train/index.json here
    refused(lambda: loader(compressed, shared), shared)
    refused(lambda: eval_batches(str(compressed), micro_batch=2, n_batches=1, rank=0, world_size=1,
                                 cache_dir=str(shared)), shared)
    assert os.listdir(shared) == []  # nothing written there, nothing read


def test_a_private_cache_is_made_the_users_alone_and_used(compressed: Path, tmp_path: Path) -> None:
    old = os.umask(0o002)  # a shared project's umask: the cache is made the user's alone all the same
    try:
        got = loader(compressed, tmp_path / "cache")
    finally:
        os.umask(old)
    assert next(iter(got)).shape == (2, 8)
    got.close()
    assert stat.S_IMODE(os.stat(tmp_path / "cache" / "loader").st_mode) == 0o700
