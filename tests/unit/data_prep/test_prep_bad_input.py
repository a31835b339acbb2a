"""Bad input: one line on stderr, exit status 2, and OUT exactly as it was (nothing half-written)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from prep_helpers import REPO, prep, prep_subprocess, tree


@pytest.fixture()
def out_before(tmp_path):
    """An existing OUT with content (an earlier dataset: nothing but what prep writes, as --overwrite may
    replace), to prove a failed prep leaves it untouched."""
    out = tmp_path / "out"
    (out / "train").mkdir(parents=True)
    (out / "manifest.json").write_text(json.dumps({"format_version": 1, "fingerprint": "earlier"}))
    (out / "train" / "index.json").write_text("{}")
    (out / "train" / "shard.00000.mds").write_text("precious")
    return out


def _staging_dirs(out) -> list[str]:
    return [n for n in os.listdir(out.parent) if n.startswith(f".{out.name}.tmp-")]


def _bad(capsys, tmp_path, out, *args: str) -> str:
    before = tree(out) if out.exists() else None
    code = prep(*args, "--out", str(out))
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("rrtrain prep: error: ") and "\n" not in err, err
    assert (tree(out) if out.exists() else None) == before
    assert not _staging_dirs(out)
    return err


def _jsonl(tmp_path, lines: list[str]) -> str:
    p = tmp_path / "c.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(p)


GOOD = json.dumps({"text": "a perfectly fine document " * 20})


@pytest.mark.parametrize("case", [
    "missing", "empty_file", "all_empty_docs", "bad_json", "deep_json", "huge_int_json", "no_text_field", "not_utf8",
    "empty_dir",
])
def test_bad_sources(case, tmp_path, capsys, out_before):
    expect = {
        "missing": "does not exist",
        "empty_file": "is empty or every document in it is empty",
        "all_empty_docs": "is empty or every document in it is empty",
        "bad_json": "c.jsonl:3: not valid JSON",
        "deep_json": "c.jsonl:2: nested too deeply",  # RecursionError in json: a traceback before
        "huge_int_json": "c.jsonl:2: not a document",  # ValueError (int digits limit): a traceback before
        "no_text_field": "c.jsonl:2: no field 'text'",
        "not_utf8": "not valid UTF-8",
        "empty_dir": "holds no .txt, .jsonl or .parquet files",
    }[case]
    if case == "missing":
        src = str(tmp_path / "nope.jsonl")
    elif case == "empty_file":
        src = str(tmp_path / "e.txt")
        open(src, "w").close()
    elif case == "all_empty_docs":
        src = _jsonl(tmp_path, [json.dumps({"text": t}) for t in ("", "   ", "\n\n", "")])
    elif case == "bad_json":
        src = _jsonl(tmp_path, [GOOD, GOOD, "{not json", GOOD])
    elif case == "deep_json":
        src = _jsonl(tmp_path, [GOOD, "[" * 200000])
    elif case == "huge_int_json":
        src = _jsonl(tmp_path, [GOOD, '{"text": "a", "n": ' + "1" * 6000 + "}"])
    elif case == "no_text_field":
        src = _jsonl(tmp_path, [GOOD, json.dumps({"body": "x"})])
    elif case == "not_utf8":
        src = str(tmp_path / "b.txt")
        with open(src, "wb") as f:
            f.write(b"fine text\n\n\xff\xfe broken bytes\n")
    else:
        src = str(tmp_path / "emptydir")
        os.mkdir(src)
    for tok in ("byte", "bpe:300"):
        err = _bad(capsys, tmp_path, out_before, "--source", src, "--tokenizer", tok, "--overwrite")
        assert expect in err, err


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of permissions")
def test_unreadable_source(tmp_path, capsys, out_before):
    src = tmp_path / "secret.txt"
    src.write_text("hidden\n")
    src.chmod(0)
    assert "cannot read" in _bad(capsys, tmp_path, out_before, "--source", str(src), "--overwrite")


@pytest.mark.parametrize("args, expect", [
    (["--seq-len", "1"], "--seq-len must be at least 2"),
    (["--tokenizer", f"bpe:{1 << 32}"], "too large for uint32"),
    (["--val-fraction", "0"], "--val-fraction must be in (0, 0.5]"),
    (["--val-fraction", "0.51"], "--val-fraction must be in (0, 0.5]"),
    (["--val-fraction", "-0.1"], "--val-fraction must be in (0, 0.5]"),
    (["--workers", "0"], "--workers must be at least 1"),
    (["--tokenizer", "nonsense"], "unknown tokenizer"),
    (["--seq-len", "many"], "invalid int value"),
    (["--min-val-samples", "100000"], "corpus too small"),
])
def test_bad_options(args, expect, tmp_path, capsys, out_before):
    base = ["--source", "synthetic:stories", "--num-docs", "20", "--overwrite"]
    assert expect in _bad(capsys, tmp_path, out_before, *base, *args)


def test_non_empty_out_needs_overwrite_and_overwrite_replaces(tmp_path, capsys, out_before):
    args = ["--source", "synthetic:stories", "--num-docs", "30", "--seq-len", "32", "--min-val-samples", "4"]
    assert "exists and is not empty (use --overwrite" in _bad(capsys, tmp_path, out_before, *args)
    (out_before / "keep.txt").write_text("not the dataset's")  # --overwrite replaces only what prep writes
    assert "holds no rrtrain dataset ('keep.txt' is not part of one)" in _bad(capsys, tmp_path, out_before, *args,
                                                                                "--overwrite")
    os.unlink(out_before / "keep.txt")
    assert prep(*args, "--out", str(out_before), "--overwrite") == 0
    assert json.loads((out_before / "manifest.json").read_text())["fingerprint"] != "earlier"
    assert (out_before / "train" / "shard.00000.mds").read_bytes() != b"precious"
    assert not _staging_dirs(out_before) and not [n for n in os.listdir(tmp_path) if n.endswith(".old")]
    empty = tmp_path / "empty_out"
    empty.mkdir()
    assert prep(*args, "--out", str(empty)) == 0  # an empty OUT is fine without --overwrite


def test_exit_status_through_the_real_command(tmp_path):
    proc = prep_subprocess("--source", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"rrtrain prep: error: source '{tmp_path / 'missing.txt'}' does not exist"
    assert not (tmp_path / "o").exists()


def _start(out, tmp_path) -> subprocess.Popen:
    """A long prep. SIGINT back to its default in the child: a shell starts a background job (`make test &`)
    with SIGINT ignored, the child would inherit that, and Python then keeps ignoring it (prep rightly too)."""
    return subprocess.Popen(
        [sys.executable, "-m", "rrtrain", "prep", "--source", "synthetic:stories", "--num-docs", "200000",
         "--seq-len", "32", "--shard-size", "4kb", "--out", str(out), "--overwrite", "--quiet"],
        cwd=REPO, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for_shards(proc, out, exclude: str = "", timeout: float = 120.0) -> str:
    """Block until the staging dir holds written shards; returns its name."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        for name in _staging_dirs(out):
            if name == exclude:
                continue
            train = out.parent / name / "train"
            if train.is_dir() and len(os.listdir(train)) >= 3:
                return name
        time.sleep(0.2)
    raise AssertionError("prep wrote no shards in time")


@pytest.mark.slow
def test_sigkill_then_sigint_leave_out_as_it_was(tmp_path, out_before):
    before = tree(out_before)
    killed = _start(out_before, tmp_path)
    stale = _wait_for_shards(killed, out_before)
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=30)
    assert tree(out_before) == before and stale in _staging_dirs(out_before)

    interrupted = _start(out_before, tmp_path)
    mine = _wait_for_shards(interrupted, out_before, exclude=stale)
    assert stale in _staging_dirs(out_before)  # the dead run's staging dir: nothing proves this prep made it
    interrupted.send_signal(signal.SIGINT)
    try:
        _, err = interrupted.communicate(timeout=60)
    finally:
        if interrupted.poll() is None:  # it did not end: leave no process behind for later tests to meet
            interrupted.kill()
            interrupted.wait()
    assert interrupted.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert f"warning: kept the staging directory of a prep that is gone, {out_before.parent / stale}: " in err
    assert tree(out_before) == before
    assert _staging_dirs(out_before) == [stale]  # its own removed, the dead one's only named
