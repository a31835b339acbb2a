"""Cost of verifying a dataset, per GB: xxh64 of a shard, sha1 for comparison, and the whole shard check
(xxh64 + MDS layout + token ids below the vocabulary) that every run does at start.

Run:  .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/benchmarks -k verify   (or `make bench`)

The shard (512 MiB of uint16 rows of 2,049 ids, GPT-2's vocabulary) is written and then read back from the
page cache, so the figures are CPU cost; a cold disk adds its read time. Figures go to docs/data.md.
"""

from __future__ import annotations

import os
import time

import numpy as np

from rrtrain.data.verify import file_digest, verify_shard

ROW_LEN, ROWS, VOCAB = 2049, 131072, 50257


def write_shard(path: str) -> int:
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        f.write(np.array([ROWS], np.uint32).tobytes())
        head = 4 * (ROWS + 2)
        f.write((head + ROW_LEN * 2 * np.arange(ROWS + 1, dtype=np.int64)).astype(np.uint32).tobytes())
        for i in range(0, ROWS, 8192):
            f.write(rng.integers(0, VOCAB, size=(min(8192, ROWS - i), ROW_LEN), dtype=np.uint16).tobytes())
    return os.path.getsize(path)


def test_verify_cost_per_gb(tmp_path):
    path = str(tmp_path / "shard.00000.mds")
    gb = write_shard(path) / 1e9
    t = time.perf_counter()
    xx = file_digest(path, "xxh64")
    t_xx = time.perf_counter() - t
    t = time.perf_counter()
    file_digest(path, "sha1")
    t_sha = time.perf_counter() - t
    shard = {"raw_data": {"basename": os.path.basename(path), "bytes": int(gb * 1e9), "hashes": {"xxh64": xx}},
             "samples": ROWS}
    t = time.perf_counter()
    assert verify_shard(str(tmp_path), "train", shard, {"dtype": "uint16", "seq_len": ROW_LEN - 1, "vocab_size": VOCAB}) < VOCAB
    t_all = time.perf_counter() - t
    print(f"\nverify {gb:.2f} GB shard: xxh64 {t_xx / gb:.2f} s/GB, sha1 {t_sha / gb:.2f} s/GB, "
          f"whole shard check {t_all / gb:.2f} s/GB (sha1/xxh64 = {t_sha / t_xx:.1f}x)")
