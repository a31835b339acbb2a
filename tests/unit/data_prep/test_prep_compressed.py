"""`rrtrain prep` reads .txt and .jsonl compressed with gzip, zstd, bzip2 or xz: the dataset is the plain corpus's,
byte for byte, with any `--workers`; a damaged, truncated or endless compressed file is one line and exit 2, and
nothing is published. In process, small corpora: a few seconds."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import struct
import threading
import tracemalloc
from pathlib import Path

import pytest
import zstandard

from data_prep import sources
from data_prep.synthetic import StoryCorpus
from prep_helpers import prep, read_split, tree

SMALL = ("--seq-len", "31", "--min-val-samples", "4")


def _zstd(data: bytes) -> bytes:
    """Three frames, as concatenated shards are: with the content size, without it (streamed), and empty."""
    third = len(data) // 3
    streamed = io.BytesIO()
    with zstandard.ZstdCompressor(write_content_size=False).stream_writer(streamed, closefd=False) as w:
        w.write(data[third:])
    return zstandard.ZstdCompressor().compress(data[:third]) + streamed.getvalue() + zstandard.ZstdCompressor().compress(b"")


COMPRESS = {".gz": gzip.compress, ".zst": _zstd, ".bz2": bz2.compress, ".xz": lzma.compress}


@pytest.fixture(scope="module")
def docs() -> list[str]:
    return list(StoryCorpus(90, seed=8)) + ["Ünïcödé café — 日本語 🙂 line one\nline two", "x" * 500]


def _body(docs: list[str], fmt: str) -> bytes:
    if fmt == ".jsonl":
        return "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    return ("\n\n".join(docs) + "\n").encode()


def _write(path: Path, data: bytes) -> str:
    """`data` at `path`, compressed as its last suffix says."""
    path.write_bytes(COMPRESS.get(path.suffix, lambda b: b)(data))
    return str(path)


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def _shards(out: Path) -> dict[str, bytes]:
    return {k: v for k, v in tree(out).items() if k != "manifest.json"}


def _refused(capsys, out: Path, *args: str) -> str:
    """`prep` refused in one line, exit 2, with nothing published and no staging directory left."""
    code = prep(*args, "--out", str(out))
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("rrtrain prep: error: ") and "\n" not in err, err
    assert not out.exists() and not [n for n in os.listdir(out.parent) if n.startswith(f".{out.name}.tmp-")]
    return err


def test_each_compression_gives_the_plain_files_dataset(tmp_path, docs):
    for fmt in (".jsonl", ".txt"):
        plain = _write(tmp_path / f"c{fmt}", _body(docs, fmt))
        assert prep("--source", plain, "--out", str(tmp_path / f"out{fmt}"), *SMALL) == 0
        want = _manifest(tmp_path / f"out{fmt}")
        assert "source_compression" not in want  # a plain source's manifest is as it was
        for suffix, name in (".gz", "gzip"), (".zst", "zstd"), (".bz2", "bzip2"), (".xz", "xz"):
            if fmt == ".txt" and suffix != ".gz":
                continue  # the directory test below reads .txt.zst and .txt.bz2
            src = _write(tmp_path / f"c{fmt}{suffix}", _body(docs, fmt))
            out = tmp_path / f"out{fmt}{suffix}"
            assert prep("--source", src, "--out", str(out), *SMALL) == 0, src
            got = _manifest(out)
            assert got.pop("source_compression") == [name]
            assert got | {"source": plain} == want, src  # the same fingerprints, splits and everything else
            assert _shards(out) == _shards(tmp_path / f"out{fmt}"), src


def test_a_directory_of_mixed_shards_is_the_plain_corpus_with_any_workers(tmp_path, docs):
    names = ["a.jsonl.gz", "b.txt.zst", "c.jsonl", "d.txt.bz2", "e/f.jsonl.xz", "e/g.jsonl.zst"]
    parts = [docs[i::len(names)] for i in range(len(names))]
    mixed, plain = tmp_path / "mixed", tmp_path / "plain"
    (mixed / "e").mkdir(parents=True)
    (plain / "e").mkdir(parents=True)
    for name, part in zip(names, parts):
        fmt = ".jsonl" if ".jsonl" in name else ".txt"
        _write(mixed / name, _body(part, fmt))
        _write(plain / (name.split(fmt)[0] + fmt), _body(part, fmt))  # the same name, uncompressed
    (mixed / "notes.gz").write_bytes(gzip.compress(b"not a corpus file: skipped"))
    assert prep("--source", str(plain), "--out", str(tmp_path / "p"), *SMALL) == 0
    assert prep("--source", str(mixed), "--out", str(tmp_path / "m1"), *SMALL) == 0
    assert prep("--source", str(mixed), "--out", str(tmp_path / "m2"), *SMALL, "--workers", "2") == 0
    assert tree(tmp_path / "m1") == tree(tmp_path / "m2")  # byte for byte, the manifest included
    for split in ("train", "val"):
        assert (read_split(tmp_path / "m1", split) == read_split(tmp_path / "p", split)).all()
    got, want = _manifest(tmp_path / "m1"), _manifest(tmp_path / "p")
    assert got["source_compression"] == ["bzip2", "gzip", "xz", "zstd"] and "source_compression" not in want
    assert (got["source_fingerprint"], got["fingerprint"]) == (want["source_fingerprint"], want["fingerprint"])


def test_zstd_frames_of_every_kind_are_read_in_order(tmp_path):
    """Frames with and without their content size, an empty one and a skippable one (zstd's metadata frame)."""
    skippable = struct.pack("<II", 0x184D2A50, 4) + b"meta"
    frames = [zstandard.ZstdCompressor().compress(b"one\n"), skippable,
              zstandard.ZstdCompressor(write_content_size=False).compress(b"two\n"),
              zstandard.ZstdCompressor().compress(b""), zstandard.ZstdCompressor(level=19).compress(b"three\n" * 3)]
    path = tmp_path / "c.txt.zst"
    path.write_bytes(b"".join(frames))
    assert list(sources.open_source(str(path), doc_sep="line")) == ["one", "two", "three", "three", "three"]


@pytest.mark.parametrize("suffix", COMPRESS)
def test_a_truncated_or_damaged_file_is_one_line(suffix, tmp_path, capsys, docs):
    whole = COMPRESS[suffix](_body(docs, ".jsonl"))
    truncated = tmp_path / f"t.jsonl{suffix}"
    truncated.write_bytes(whole[: len(whole) * 2 // 3])
    err = _refused(capsys, tmp_path / "out", "--source", str(truncated), *SMALL)
    assert err.startswith(f"rrtrain prep: error: cannot decompress '{truncated}' ({sources.compression_of(str(truncated))}): ")
    assert "ended before the end-of-stream marker" in err or "ends inside a frame" in err, err
    damaged = tmp_path / f"d.jsonl{suffix}"
    damaged.write_bytes(b"\x00" * 8 + whole[8:])  # no longer the format's magic number
    err = _refused(capsys, tmp_path / "out", "--source", str(damaged), *SMALL)
    assert err.startswith(f"rrtrain prep: error: cannot decompress '{damaged}' ("), err


def test_a_file_that_ends_mid_corpus_publishes_nothing(tmp_path, capsys, monkeypatch):
    """The failure comes after shards were written into the staging directory: none of it is published."""
    from data_prep.writer import SplitWriter

    docs = [f"document {i}: " + "the cat sat on the mat. " * 8 for i in range(1500)]
    whole = _zstd(_body(docs, ".jsonl"))
    src = tmp_path / "c.jsonl.zst"
    src.write_bytes(whole[: len(whole) * 9 // 10])
    written = []
    real = SplitWriter.write_rows
    monkeypatch.setattr(SplitWriter, "write_rows", lambda self, rows: written.append(len(rows)) or real(self, rows))
    err = _refused(capsys, tmp_path / "out", "--source", str(src), *SMALL, "--shard-size", "4kb")
    assert "ends inside a frame" in err and sum(written) > 100


@pytest.mark.parametrize("suffix", [".zst", ".gz"])
def test_a_line_that_never_ends_is_refused_without_holding_it(suffix, tmp_path, capsys, monkeypatch):
    """A decompression bomb: 256 MiB of one line in a few kB. The line bound stops it, and the memory held stays
    far below what it decompresses to."""
    monkeypatch.setattr(sources, "MAX_LINE_CHARS", 1 << 20)
    bomb = tmp_path / f"bomb.jsonl{suffix}"
    with open(bomb, "wb") as f:
        writer = (zstandard.ZstdCompressor().stream_writer(f) if suffix == ".zst"
                  else gzip.GzipFile(fileobj=f, mode="wb", compresslevel=1))
        with writer:
            writer.write(b'{"text": "')
            for _ in range(256 if suffix == ".zst" else 48):
                writer.write(b"a" * (1 << 20))
    tracemalloc.start()
    try:
        err = _refused(capsys, tmp_path / "out", "--source", str(bomb), *SMALL)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"{bomb}:1: a line longer than 1,048,576 characters" in err, err
    assert peak < 64 << 20, peak  # zstd: one 1 KiB piece of RLE blocks is 32 MiB (decompress.ZSTD_PIECE)


def test_an_overlong_plain_line_or_document_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sources, "MAX_LINE_CHARS", 1000)
    lines = tmp_path / "lines.txt"
    lines.write_text("short\n\n" + "y" * 1001 + "\n")
    assert "lines.txt:3: a line longer than 1,000 characters" in _refused(
        capsys, tmp_path / "out", "--source", str(lines), "--doc-sep", "line", *SMALL)
    doc = tmp_path / "doc.txt.gz"
    doc.write_bytes(gzip.compress(b"short\n\n" + b"a line of the same document\n" * 40))
    assert "doc.txt.gz:3: a document longer than 1,000 characters" in _refused(
        capsys, tmp_path / "out", "--source", str(doc), *SMALL)
    fine = tmp_path / "fine.txt"  # a line of exactly the bound, with "\r\n", is a document
    fine.write_bytes(b"z" * 1000 + b"\r\n")
    assert [len(d) for d in sources.open_source(str(fine), doc_sep="line")] == [1000]


def test_a_fifo_named_as_a_compressed_corpus_is_refused_at_once(tmp_path, capsys):
    fifo = tmp_path / "x.jsonl.gz"
    os.mkfifo(fifo)
    inside = tmp_path / "dir"
    inside.mkdir()
    os.mkfifo(inside / "y.jsonl.zst")
    errors: list[str] = []

    def run() -> None:
        for src in (fifo, inside):
            errors.append(_refused(capsys, tmp_path / "out", "--source", str(src), *SMALL))

    thread = threading.Thread(target=run, daemon=True)  # a hang leaves a daemon thread, not a stuck suite
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive(), "prep blocked on a FIFO"
    assert errors == [f"rrtrain prep: error: cannot read '{fifo}': not a regular file",
                      f"rrtrain prep: error: cannot read '{inside / 'y.jsonl.zst'}': not a regular file"]


def test_a_compressed_file_of_another_format_is_unsupported(tmp_path, capsys):
    for name in ("c.parquet.gz", "corpus.zst"):
        (tmp_path / name).write_bytes(b"")
        err = _refused(capsys, tmp_path / "out", "--source", str(tmp_path / name), *SMALL)
        assert f"unsupported source file '{tmp_path / name}'" in err and ".gz, .zst, .bz2, .xz" in err
