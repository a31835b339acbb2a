"""`rrtrain prep` end to end: shards hold exactly the packed token stream; sources agree; output is deterministic."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from data_prep.synthetic import StoryCorpus
from data_prep.writer import token_dtype, unigram_entropy
from prep_helpers import prep, read_split, tree
from rrtrain.data.loader import TrainLoader

EOS = 256  # byte tokenizer


@pytest.fixture(scope="module")
def docs() -> list[str]:
    extra = ["Ünïcödé café — 日本語 🙂 line one\nline two", "short", "x" * 700, "ünï 🚀 " * 40]
    return list(StoryCorpus(150, seed=4))[:120] + extra + list(StoryCorpus(30, seed=5))


def _write_sources(root, docs: list[str]) -> dict[str, str]:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(root, exist_ok=True)
    paths = {}
    paths["jsonl"] = os.path.join(root, "c.jsonl")
    with open(paths["jsonl"], "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d, "id": 1}) + "\n")
    paths["txt"] = os.path.join(root, "c.txt")
    with open(paths["txt"], "w", encoding="utf-8") as f:
        f.write("\n\n".join(docs) + "\n")
    paths["parquet"] = os.path.join(root, "c.parquet")
    pq.write_table(pa.table({"text": docs}), paths["parquet"], row_group_size=37)
    paths["dir"] = os.path.join(root, "dir")
    os.makedirs(paths["dir"])
    with open(os.path.join(paths["dir"], "a.jsonl"), "w", encoding="utf-8") as f:
        for d in docs[:50]:
            f.write(json.dumps({"text": d}) + "\n")
    pq.write_table(pa.table({"text": docs[50:]}), os.path.join(paths["dir"], "b.parquet"))
    paths["saved"] = os.path.join(root, "saved")
    datasets.Dataset.from_dict({"text": docs}).save_to_disk(paths["saved"])
    return paths


def _segments(rows: np.ndarray) -> list[list[int]]:
    """Split a packed stream at EOS; the last element is the unterminated tail (maybe empty)."""
    segs, cur = [], []
    for t in rows.reshape(-1).tolist():
        if t == EOS:
            segs.append(cur)
            cur = []
        else:
            cur.append(t)
    return segs + [cur]


def test_shards_hold_exactly_the_packed_stream(tmp_path, docs):
    src = _write_sources(tmp_path / "src", docs)
    out = tmp_path / "out"
    assert prep("--source", src["jsonl"], "--tokenizer", "byte", "--seq-len", "63", "--out", str(out),
                "--shard-size", "6kb", "--val-fraction", "0.2", "--min-val-samples", "8", "--seed", "3") == 0
    man = json.loads((out / "manifest.json").read_text())
    assert len([f for f in os.listdir(out / "train") if f.endswith(".mds")]) >= 4  # real shard boundaries
    rows = {s: read_split(out, s) for s in ("train", "val")}
    for s in ("train", "val"):
        assert rows[s].shape == (man["splits"][s]["samples"], 64)
        assert rows[s].size == man["splits"][s]["tokens"]
        assert rows[s].dtype == np.uint16
    assert man["splits"]["val"]["samples"] >= 8
    # every document appears once, whole and in order, in exactly one split; only the tails are cut
    encoded = [list(d.encode("utf-8")) for d in docs]
    segs = {s: _segments(rows[s]) for s in rows}
    idx = {"train": 0, "val": 0}
    tails = {}
    for doc in encoded:
        for s in ("train", "val"):
            i = idx[s]
            if i < len(segs[s]) - 1 and segs[s][i] == doc:
                idx[s] += 1
                break
        else:
            for s in ("train", "val"):  # a doc cut by the end of a split: a prefix of that split's tail
                if idx[s] == len(segs[s]) - 1 and s not in tails and doc[: len(segs[s][-1])] == segs[s][-1]:
                    tails[s] = doc
                    break
            else:
                assert tails, "a document is missing from both splits"
    assert idx["train"] == len(segs["train"]) - 1 and idx["val"] == len(segs["val"]) - 1
    total = sum(len(d) + 1 for d in encoded)
    stored = sum(man["splits"][s]["tokens"] + man["splits"][s]["dropped_tokens"] for s in ("train", "val"))
    assert stored == total  # nothing lost or duplicated at shard or row boundaries
    assert man["splits"]["train"]["documents"] + man["splits"]["val"]["documents"] == len(docs)
    counts = np.bincount(rows["train"].reshape(-1), minlength=man["vocab_size"])
    assert man["unigram_entropy"] == pytest.approx(unigram_entropy(counts), abs=1e-6)
    assert man["vocab_size"] == 258 and man["eos_id"] == EOS and man["dtype"] == "uint16"
    assert man["format_version"] == 1 and len(man["fingerprint"]) == 64 and man["seq_len"] == 63


def test_every_source_kind_gives_the_same_dataset(tmp_path, docs):
    src = _write_sources(tmp_path / "src", docs)
    fingerprints = {}
    for kind, path in src.items():
        out = tmp_path / f"out_{kind}"
        assert prep("--source", path, "--seq-len", "31", "--out", str(out), "--min-val-samples", "4") == 0, kind
        man = json.loads((out / "manifest.json").read_text())
        fingerprints[kind] = (man["source_fingerprint"], man["fingerprint"])
    assert len(set(fingerprints.values())) == 1, fingerprints
    # one document per line (--doc-sep line) and another field name (--text-field)
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(d.replace("\n", " ") for d in docs) + "\n", encoding="utf-8")
    body = tmp_path / "body.jsonl"
    body.write_text("".join(json.dumps({"body": d.replace("\n", " ")}) + "\n" for d in docs), encoding="utf-8")
    for path, extra in ((lines, ["--doc-sep", "line"]), (body, ["--text-field", "body"])):
        out = tmp_path / f"out_{path.stem}"
        assert prep("--source", str(path), "--seq-len", "31", "--out", str(out), "--min-val-samples", "4", *extra) == 0
        man = json.loads((out / "manifest.json").read_text())
        assert man["splits"]["train"]["documents"] + man["splits"]["val"]["documents"] == len(docs)
        fingerprints[path.stem] = man["fingerprint"]
    assert fingerprints["lines"] == fingerprints["body"]


def test_same_inputs_give_byte_identical_output_with_any_worker_count(tmp_path):
    args = ["--source", "synthetic:stories", "--num-docs", "300", "--tokenizer", "bpe:700", "--seq-len", "64",
            "--min-val-samples", "8", "--shard-size", "16kb", "--seed", "11"]
    assert prep(*args, "--out", str(tmp_path / "a")) == 0
    assert prep(*args, "--out", str(tmp_path / "b"), "--workers", "2") == 0
    a, b = tree(tmp_path / "a"), tree(tmp_path / "b")
    assert a == b and "tokenizer.json" in a and "manifest.json" in a
    assert prep(*args[:-1], "12", "--out", str(tmp_path / "c")) == 0
    ma, mc = (json.loads((tmp_path / x / "manifest.json").read_text()) for x in "ac")
    assert ma["fingerprint"] != mc["fingerprint"] and ma["source_fingerprint"] != mc["source_fingerprint"]


def test_zstd_shards_read_back_the_same_rows(tmp_path):
    args = ["--source", "synthetic:stories", "--num-docs", "120", "--seq-len", "48", "--min-val-samples", "4",
            "--shard-size", "8kb"]
    assert prep(*args, "--out", str(tmp_path / "plain")) == 0
    assert prep(*args, "--out", str(tmp_path / "zstd"), "--compression", "zstd") == 0
    assert any(f.endswith(".mds.zstd") for f in os.listdir(tmp_path / "zstd" / "train"))
    got = {}
    for kind in ("plain", "zstd"):
        loader = TrainLoader(str(tmp_path / kind), micro_batch=4, global_batch=8, rank=0, world_size=1, local_rank=0,
                             seed=5, cache_dir=str(tmp_path / f"cache_{kind}"))
        it = iter(loader)
        got[kind] = [next(it) for _ in range(30)]
        loader.close()
    assert all((a == b).all() for a, b in zip(got["plain"], got["zstd"]))
    assert not any(f.endswith(".mds") for f in os.listdir(tmp_path / "zstd" / "train"))  # read via the run's cache


def test_large_vocabulary_is_stored_as_uint32(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = [f"w{i}" for i in range(70_000)]
    vocab = {w: i for i, w in enumerate(words)}
    vocab["[UNK]"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(" ".join(f"w{(i * 7919 + j) % 70_000}" for j in range(40)) for i in range(200)))
    assert prep("--source", str(corpus), "--doc-sep", "line", "--tokenizer", f"hf:{tmp_path / 'tokenizer.json'}",
                "--seq-len", "16", "--out", str(tmp_path / "out"), "--min-val-samples", "2") == 0
    man = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert man["dtype"] == "uint32" and man["vocab_size"] == 70_002 and man["eos_id"] == 70_001
    rows = read_split(tmp_path / "out", "train")
    assert rows.dtype == np.uint32 and rows.max() >= 1 << 16
    assert token_dtype(1 << 16) == np.uint16 and token_dtype((1 << 16) + 1) == np.uint32
