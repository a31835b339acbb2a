"""A dataset written by someone else: its shard names must be plain file names, its index.json bounded and
typed, in `rrtrain prep --verify`, in the loader and in `rrtrain train` (one line, exit 2, never a traceback, a
hang or a file written where a shard's name points). Budget: about 15 s (three short `rrtrain train` starts)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from prep_helpers import write_id_dataset
from rrtrain.core.errors import UsageError
from trainutil import REPO, TINY, env, run_cmd

TRAIN = ["train.max_steps=1", "train.global_batch=4", "train.micro_batch=4", "data.eval_batches=1"]


def dataset(root: Path, compression: str | None = "zstd") -> Path:
    d = root / "ds"
    write_id_dataset(d, 40, 16, compression=compression)
    return d


def rewrite_index(d: Path, edit) -> None:  # noqa: ANN001 - a function of the parsed index
    """Edit train/index.json and give the manifest the matching fingerprint, as whoever writes the directory can."""
    from data_prep.manifest import dataset_fingerprint

    path = d / "train" / "index.json"
    index = json.loads(path.read_text())
    path.write_text(json.dumps(edit(index)))
    manifest = json.loads((d / "manifest.json").read_text())
    manifest["fingerprint"] = dataset_fingerprint(str(d), manifest["tokenizer_hash"], manifest["seq_len"])
    (d / "manifest.json").write_text(json.dumps(manifest))


def set_shard(key: str, value) -> callable:  # noqa: ANN001
    def edit(index: dict) -> dict:
        parent, _, leaf = key.rpartition(".")
        node = index["shards"][0]
        if parent:
            node = node[parent]
        node[leaf] = value
        return index
    return edit


def verify(d: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rrtrain", "prep", "--verify", str(d)], cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=60, **kw)


def train(d: Path, run_dir: Path) -> subprocess.CompletedProcess:
    return run_cmd([sys.executable, "-m", "rrtrain.train", TINY, f"data.path={d}", f"run.dir={run_dir}", *TRAIN],
                   env(), timeout=120)


def one_line(stderr: str, prog: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert "Traceback" not in stderr and len(lines) == 1 and lines[0].startswith(prog), stderr[-3000:]
    return lines[0]


def files_named(root: Path, name: str) -> list[Path]:
    return [p for p in root.rglob(name)]


def test_a_shard_name_that_is_a_path_is_refused_by_verify_and_training(tmp_path, capsys):
    """`raw_data.basename: ../../x` passed `prep --verify` ("ok": true) and training decompressed the shard to
    the path it names; now both refuse it and nothing named x is written anywhere. The verification runs in this
    process (prep's main), the training start as its own process."""
    from data_prep.cli import main

    d = dataset(tmp_path)
    rewrite_index(d, set_shard("raw_data.basename", "../../x"))
    assert main(["--verify", str(d)]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out)["ok"] is False
    assert "'raw_data': file name '../../x' is not a plain file name" in one_line(err, "rrtrain prep:")
    res = train(d, tmp_path / "run")
    assert res.returncode == 2
    assert "is not a plain file name" in one_line(res.stderr, "rrtrain train: error:")
    assert files_named(tmp_path, "x") == []


@pytest.mark.parametrize("key,name", [("zip_data.basename", "../shard.zstd"), ("raw_data.basename", "/tmp/x"),
                                      ("raw_data.basename", ".."), ("raw_data.basename", "a\0b"),
                                      ("raw_data.basename", 7)])
def test_every_shard_name_must_be_a_plain_file_name(tmp_path, key, name, capsys):
    from data_prep.cli import main

    d = dataset(tmp_path)
    rewrite_index(d, set_shard(key, name))
    assert main(["--verify", str(d)]) == 2
    err = capsys.readouterr().err
    assert "is not a plain file name" in one_line(err, "rrtrain prep:")


def test_the_loader_refuses_a_shard_name_that_is_a_path(tmp_path):
    """The loader checks on its own (it may be used without the verification), before streaming reads the index,
    and again on the shards streaming read (a remote index is never seen before that)."""
    from rrtrain.data import loader

    d = dataset(tmp_path)
    rewrite_index(d, set_shard("raw_data.basename", "../../x"))
    with pytest.raises(UsageError, match="not a plain file name"):
        loader.TrainLoader(str(d), micro_batch=4, global_batch=4, rank=0, world_size=1, local_rank=0, seed=0,
                           cache_dir=str(tmp_path / "cache"))
    remote = SimpleNamespace(shards=[SimpleNamespace(file_pairs=[(SimpleNamespace(basename="shard.00000.mds"),
                                                                  SimpleNamespace(basename="../../../x.zstd"))])])
    with pytest.raises(UsageError, match=r"split 'train': a shard's file name '../../../x.zstd' is not a plain"):
        loader._check_shard_names(remote, "s3://bucket/ds", "train")
    assert files_named(tmp_path, "x") == []


BAD_INDEXES = {
    "a shard that is a number": lambda index: {"shards": [1]},
    "samples that are text": set_shard("samples", "x"),
    "samples that are a bool": set_shard("samples", True),
    "shards that are not a list": lambda index: {"shards": {"a": 1}},
    "an index that is a list": lambda index: [index],
    "bytes that are text": set_shard("raw_data.bytes", "1003"),
    "hashes that are a list": set_shard("raw_data.hashes", ["xxh64"]),
    "raw_data that is text": set_shard("raw_data", "shard.00000.mds"),
    "compression that is a number": set_shard("compression", 3),
}


@pytest.mark.parametrize("case", sorted(BAD_INDEXES))
def test_an_index_of_the_wrong_types_is_one_line_in_verify(tmp_path, case, capsys):
    from data_prep.cli import main

    d = dataset(tmp_path, compression=None)
    rewrite_index(d, BAD_INDEXES[case])
    assert main(["--verify", str(d)]) == 2
    out = capsys.readouterr()
    assert "train/index.json is not a valid MDS index" in one_line(out.err, "rrtrain prep:")
    assert json.loads(out.out)["ok"] is False


@pytest.mark.parametrize("case", ["a shard that is a number", "samples that are text"])
def test_an_index_of_the_wrong_types_is_one_line_in_training(tmp_path, case):
    d = dataset(tmp_path, compression=None)
    rewrite_index(d, BAD_INDEXES[case])
    res = train(d, tmp_path / "run")
    assert res.returncode == 2
    assert "train/index.json is not a valid MDS index" in one_line(res.stderr, "rrtrain train: error:")


def limit_memory() -> None:
    """In the child: at most 3 GiB of address space, so a reader that would fill memory fails fast, not the host."""
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def test_an_index_that_is_a_fifo_or_dev_zero_is_one_line(tmp_path):
    """A FIFO hung `prep --verify` (and training) waiting for a writer; /dev/zero filled memory (MemoryError)."""
    d = dataset(tmp_path, compression=None)
    index = d / "train" / "index.json"
    index.unlink()
    os.mkfifo(index)
    res = verify(d, preexec_fn=limit_memory)
    assert res.returncode == 2
    assert "train/index.json cannot be read (not a regular file)" in res.stderr.splitlines()[0]
    assert "Traceback" not in res.stderr
    res = train(d, tmp_path / "run")
    assert res.returncode == 2 and "not a regular file" in one_line(res.stderr, "rrtrain train: error:")
    index.unlink()
    index.symlink_to("/dev/zero")
    res = verify(d, preexec_fn=limit_memory)
    assert res.returncode == 2 and "Traceback" not in res.stderr and "MemoryError" not in res.stderr
    assert "train/index.json cannot be read (not a regular file)" in res.stderr.splitlines()[0]


def test_an_oversized_index_is_refused_unread(tmp_path, monkeypatch):
    from rrtrain.data import verify as v

    d = dataset(tmp_path, compression=None)
    monkeypatch.setattr(v, "MAX_INDEX_BYTES", 100)
    with pytest.raises(UsageError, match=r"train/index.json cannot be read \(larger than 100 bytes\)"):
        v.read_index(str(d / "train"), "train")


def test_a_shard_that_is_a_fifo_does_not_block_verify(tmp_path, capsys):
    from data_prep.cli import main

    d = dataset(tmp_path, compression=None)
    shard = d / "train" / "shard.00000.mds"
    shard.unlink()
    os.mkfifo(shard)
    assert main(["--verify", str(d)]) == 2
    assert "shard train/shard.00000.mds is not a regular file" in capsys.readouterr().err


def test_a_clean_dataset_still_verifies(tmp_path, capsys):
    from data_prep.cli import main

    for compression in (None, "zstd"):
        d = dataset(tmp_path / str(compression), compression=compression)
        assert main(["--verify", str(d)]) == 0
        assert json.loads(capsys.readouterr().out)["ok"] is True
