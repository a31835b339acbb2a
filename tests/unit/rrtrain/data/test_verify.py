"""Unit checks of the integrity helpers: token ids against the vocabulary, checkpoint checksums, RNG state
without pickle, full-disk detection, unwritable directories. Budget: about 2 s."""

from __future__ import annotations

import errno
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from rrtrain.training.checkpoint import checksum_files, file_problems, is_disk_full, rng_state, set_rng_state
from rrtrain.core.errors import UsageError
from rrtrain.core.io import unwritable_reason
from rrtrain.data.verify import check_tokens


def mds_bytes(rows: np.ndarray) -> np.ndarray:
    """An MDS shard's bytes for fixed-size rows: [uint32 n][uint32 offsets x (n+1)][rows]."""
    n, row_bytes = len(rows), rows.shape[1] * rows.dtype.itemsize
    head = 4 * (n + 2)
    offsets = head + row_bytes * np.arange(n + 1, dtype=np.uint32)
    return np.concatenate([np.array([n], np.uint32).view(np.uint8), offsets.astype(np.uint32).view(np.uint8),
                           rows.reshape(-1).view(np.uint8)])


def test_token_ids_checked_against_the_vocabulary():
    rows = np.arange(12, dtype=np.uint16).reshape(3, 4)
    assert check_tokens(mds_bytes(rows), "train/s", samples=3, dtype=np.dtype(np.uint16), row_len=4, vocab=12) == 11
    with pytest.raises(UsageError, match=r"train/s holds token id 11 \(first at sample 2\) outside .* vocabulary of 11"):
        check_tokens(mds_bytes(rows), "train/s", samples=3, dtype=np.dtype(np.uint16), row_len=4, vocab=11)
    with pytest.raises(UsageError, match="holds 3 samples but its index records 4"):
        check_tokens(mds_bytes(rows), "train/s", samples=4, dtype=np.dtype(np.uint16), row_len=4, vocab=12)
    with pytest.raises(UsageError, match="not laid out as rows of 5"):
        check_tokens(mds_bytes(rows), "train/s", samples=3, dtype=np.dtype(np.uint16), row_len=5, vocab=12)


def test_checksums_find_truncated_changed_and_missing_files(tmp_path):
    for name, size in (("a.pt", 1000), ("state/b.distcp", 3000), ("state/.metadata", 50)):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
    recorded = {**checksum_files(tmp_path, 0, 2), **checksum_files(tmp_path, 1, 2)}  # two ranks' shares
    assert sorted(recorded) == ["a.pt", "state/.metadata", "state/b.distcp"]
    assert file_problems(tmp_path, recorded, 0, 1) == []
    with open(tmp_path / "state/b.distcp", "r+b") as f:
        f.truncate(1500)
    with open(tmp_path / "a.pt", "r+b") as f:
        f.write(b"\xff")
    (tmp_path / "state/.metadata").unlink()
    assert file_problems(tmp_path, recorded, 0, 1) == [
        "a.pt does not match its xxh64 checksum", "state/.metadata is missing",
        "state/b.distcp is 1500 bytes, 3000 were written"]


def test_rng_state_round_trips_without_pickle(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    random.gauss(0, 1), np.random.standard_normal()  # cached Gaussians are part of the state
    torch.save(rng_state(), tmp_path / "rng.pt")
    want = (random.random(), np.random.standard_normal(), torch.rand(3))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    got = (random.random(), np.random.standard_normal(), torch.rand(3))
    assert got[0] == want[0] and got[1] == want[1] and torch.equal(got[2], want[2])


def test_disk_full_seen_through_wrappers(tmp_path):
    from torch.distributed.checkpoint.api import CheckpointException

    enospc = OSError(errno.ENOSPC, "No space left on device")
    assert is_disk_full(enospc)
    wrapped = RuntimeError("write failed")
    wrapped.__cause__ = enospc
    assert is_disk_full(wrapped)
    assert is_disk_full(CheckpointException("save failed", {1: (enospc, None)}))
    assert not is_disk_full(RuntimeError("shape mismatch"), tmp_path)  # a filesystem with room: not a full disk
    assert not is_disk_full(OSError(errno.EIO, "I/O error"))


def test_unwritable_reason(tmp_path: Path):
    assert unwritable_reason(tmp_path / "new" / "run") is None and (tmp_path / "new" / "run").is_dir()
    assert list((tmp_path / "new" / "run").iterdir()) == []  # the probe is gone
    (tmp_path / "file").write_text("x")
    assert unwritable_reason(tmp_path / "file") == "a file is in the way (it is not a directory)"
    why = unwritable_reason(tmp_path / "file" / "run")  # the file on the way named, without the privacy rule
    assert why == f"'{tmp_path / 'file'}' is not a directory (a file is in the way: choose another path)", why


@pytest.mark.slow
def test_compressed_shards_are_checked_without_importing_transformers(tmp_path):
    """A training rank checks zstd shards through streaming's decompressor; `import streaming` in full would
    pull in transformers and torchvision (seconds and ~1 GB per rank), which reading shards never needs."""
    import subprocess
    import sys

    from prep_helpers import write_id_dataset
    from trainutil import REPO, env

    data = tmp_path / "zstd"
    write_id_dataset(data, 40, compression="zstd")  # prep's own shard writer and manifest, in this process
    code = ("import sys\nfrom rrtrain.data.loader import read_manifest\nfrom rrtrain.data.verify import verify_run_data\n"
            f"verify_run_data({str(data)!r}, read_manifest({str(data)!r}), 0)\n"
            "print(sorted(m for m in ('transformers', 'torchvision') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]", proc.stdout
