"""`rrtrain prep --executor slurm --tasks 3` on the local cluster: the documents are tokenized by a three-task job
array (on either node; OUT on the file system both share) and the dataset is the one one process writes, byte
for byte: the same manifest (fingerprint, source fingerprint, counts) and the same shards."""

from __future__ import annotations

import json
import os

from slurmutil import rrtrain
from trainutil import env

ARGS = ["--source", "synthetic:stories", "--num-docs", "700", "--seq-len", "32", "--min-val-samples", "4",
        "--val-fraction", "0.05", "--quiet"]  # 700 documents: three chunks of 256, one per task


def test_prep_on_a_slurm_array_equals_one_process(slurm_cluster, tmp_path):
    e = env()
    one = rrtrain("prep", *ARGS, "--out", str(tmp_path / "one"), env=e)
    assert one.returncode == 0, one.stderr
    three = rrtrain("prep", *ARGS, "--out", str(tmp_path / "three"), "--executor", "slurm", "--tasks", "3",
                    "--time-min", "5", env=e, timeout=600)
    assert three.returncode == 0, three.stdout + three.stderr
    assert "with 3 tasks" in three.stdout
    a, b = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("one", "three"))
    assert a == b
    for split in ("train", "val"):
        names = sorted(os.listdir(tmp_path / "one" / split))
        assert sorted(os.listdir(tmp_path / "three" / split)) == names
        for name in names:
            assert (tmp_path / "one" / split / name).read_bytes() == (tmp_path / "three" / split / name).read_bytes()
    assert sorted(os.listdir(tmp_path / "three")) == sorted(os.listdir(tmp_path / "one"))
