"""A damaged dataset stops a run before training: one line naming the shard, exit 2, final.json failed,
no traceback, on one process and on two FSDP ranks (started without torchrun, as srun starts them).
`rrtrain prep --verify` reports the same damage. Budget: about 40 s."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from faultutil import finish
from trainutil import final, start_ranks, train

SHARD = "train/shard.00000.mds"


def flip_bytes(d: Path) -> str:
    with open(d / SHARD, "r+b") as f:
        f.seek(4000)
        data = bytearray(f.read(2000))
        f.seek(4000)
        f.write(bytes(b ^ 0xFF for b in data))
    return "corrupted"


def truncate(d: Path) -> str:
    size = (d / SHARD).stat().st_size
    with open(d / SHARD, "r+b") as f:
        f.truncate(size // 2)
    return "truncated"


def delete(d: Path) -> str:
    (d / SHARD).unlink()
    return "missing"


def tamper_index(d: Path) -> str:
    index = json.loads((d / "train" / "index.json").read_text())
    index["shards"][0]["samples"] -= 1  # an index that no longer describes its shard
    (d / "train" / "index.json").write_text(json.dumps(index))
    return "index records"


def unlisted(d: Path) -> str:
    shutil.copy(d / SHARD, d / "train" / "shard.00001.mds")  # a shard the index does not list
    return "is not in train/index.json"


DAMAGE = {"flip": flip_bytes, "truncate": truncate, "delete": delete, "index": tamper_index, "unlisted": unlisted}


def damaged_copy(src: Path, dst: Path, how: str) -> str:
    shutil.copytree(src, dst)
    return DAMAGE[how](dst)


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_damaged_shard_stops_the_run_and_verify_reports_it(tmp_path, stories_data, how, capsys):
    from data_prep.cli import main as prep_main

    data = tmp_path / "data"
    words = damaged_copy(stories_data, data, how)
    assert prep_main(["--verify", str(data)]) == 2
    err = capsys.readouterr().err
    assert words in err and ("shard.0000" in err), err

    run = tmp_path / "run"
    proc = train(run, data, "train.max_steps=3", expect=2, timeout=300)
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "shard.0000" in proc.stderr and words in proc.stderr, proc.stderr
    fin = final(run)
    assert fin["status"] == "failed" and "shard.0000" in fin["reason"] and fin["step"] == 0


def test_intact_dataset_verifies(stories_data, capsys):
    from data_prep.cli import main as prep_main

    assert prep_main(["--verify", str(stories_data)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["ok"] and summary["problems"] == 0 and summary["train_shards"] >= 1


def test_damaged_shard_stops_every_fsdp_rank(tmp_path, stories_data):
    data = tmp_path / "data"
    damaged_copy(stories_data, data, "flip")
    run = tmp_path / "run"
    procs = start_ranks(run, data, "train.max_steps=3", "train.micro_batch=8", "parallel.backend=fsdp",
                        "parallel.timeout_s=60")
    for rank, (code, _, err) in enumerate(finish(procs, timeout=200)):
        assert code == 2, (rank, err)
        assert err.count("\n") == 1 and "Traceback" not in err and SHARD in err, (rank, err)
    assert final(run)["status"] == "failed" and SHARD in final(run)["reason"]
