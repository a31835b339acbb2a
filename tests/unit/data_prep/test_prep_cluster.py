"""`rrtrain prep --executor local --tasks N` (data_prep.cluster): the documents split across array tasks give the
dataset one process gives, byte for byte (same manifest, fingerprint and shards), for a directory (split by files)
and for one stream (split by chunks); a task's bad input is one line, exit 2, and OUT never appears."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from data_prep.cluster import ClusterOptions, run_prep_tasks, split_files
from data_prep.options import PrepOptions
from data_prep.prep import run_prep
from data_prep.synthetic import StoryCorpus
from prep_helpers import read_split
from rrtrain.core.errors import UsageError


def _opts(source, out, **keys) -> PrepOptions:
    return PrepOptions(source=str(source), out=str(out), seq_len=32, progress=False, min_val_samples=4,
                       val_fraction=0.05, **keys)


def _local(tasks: int) -> tuple:
    """`--executor local --tasks N` as `rrtrain prep` runs it (the sweep side's local executor)."""
    from rrtrain.cli.prep import array_runner

    cluster = ClusterOptions(executor="local", tasks=tasks)
    return cluster, array_runner(cluster, None)


def _same(a_dir, b_dir, a: dict, b: dict) -> None:
    assert a == b  # the whole manifest: fingerprint, source_fingerprint, counts, split rule
    for split in ("train", "val"):
        assert (a_dir / split / "index.json").read_bytes() == (b_dir / split / "index.json").read_bytes()
        assert (read_split(str(a_dir), split) == read_split(str(b_dir), split)).all()
    assert sorted(os.listdir(b_dir)) == sorted(os.listdir(a_dir))  # nothing of the tasks left inside
    assert os.stat(b_dir).st_mode & 0o777 == 0o700


def test_three_tasks_equal_one_process_for_a_stream(tmp_path):
    one, three = tmp_path / "one", tmp_path / "three"
    stream = dict(num_docs=160, chunk_docs=16)  # 10 chunks over 3 tasks
    a = run_prep(_opts("synthetic:stories", one, **stream))
    b = run_prep_tasks(_opts("synthetic:stories", three, **stream), *_local(3))
    _same(one, three, a, b)


def test_three_tasks_equal_one_process_for_a_directory_and_a_bad_file_is_one_line(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    docs = list(StoryCorpus(150, seed=3))
    for i in range(5):  # five files, one compressed, one below: split by files, read in prep's sorted order
        body = "".join(json.dumps({"text": d}) + "\n" for d in docs[i * 30:(i + 1) * 30]).encode()
        name = corpus / ("sub" if i == 3 else "") / (f"f{i}.jsonl.gz" if i == 1 else f"f{i}.jsonl")
        name.write_bytes(gzip.compress(body) if name.suffix == ".gz" else body)
    a = run_prep(_opts(corpus, tmp_path / "d1"))
    b = run_prep_tasks(_opts(corpus, tmp_path / "d3"), *_local(3))
    _same(tmp_path / "d1", tmp_path / "d3", a, b)

    (corpus / "f9.jsonl.gz").write_bytes(gzip.compress(b'{"text": "x"}\n' * 100)[:-20])  # truncated
    with pytest.raises(UsageError) as err:
        run_prep_tasks(_opts(corpus, tmp_path / "bad"), *_local(3))
    assert "f9.jsonl.gz" in str(err.value) and "\n" not in str(err.value) and "task 2 of 3" in str(err.value)
    assert not (tmp_path / "bad").exists() and not [n for n in os.listdir(tmp_path) if n.startswith(".bad")]


def test_split_files_is_contiguous_balanced_and_never_empty():
    paths = [f"f{i}" for i in range(5)]
    assert split_files(paths, [10, 10, 10, 10, 10], 3) == [["f0", "f1"], ["f2", "f3"], ["f4"]]
    assert split_files(paths, [100, 1, 1, 1, 1], 3) == [["f0"], ["f1"], ["f2", "f3", "f4"]]  # no task left idle
    assert split_files(paths[:2], [5, 5], 4) == [["f0"], ["f1"]]  # fewer files than tasks: one task each
    for n in range(1, 7):
        groups = split_files(paths, [3, 1, 4, 1, 5], n)
        assert sum(groups, []) == paths and all(groups) and len(groups) == min(n, 5)


def test_cli_bad_tasks_is_one_line(tmp_path, capsys):
    from rrtrain.cli.prep import main

    assert main(["--source", "synthetic:stories", "--out", str(tmp_path / "o"), "--tasks", "0"]) == 2
    assert capsys.readouterr().err.strip() == "rrtrain prep: error: --tasks must be at least 1, got 0"
    assert not (tmp_path / "o").exists()
