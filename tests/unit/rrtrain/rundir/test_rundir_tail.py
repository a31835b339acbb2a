"""Incremental reading of a run's files (`rrtrain.rundir.tail`) and `rrtrain status --watch`'s cache: nothing read
twice, a torn last line waits, a replaced file is read again from its start, a run that appears later is found."""

from __future__ import annotations

import json
import os
from pathlib import Path

from launchers.sweep import record
from launchers.state import status as status_cli
from launchers.state.cache import StatusCache
from rrtrain.core.io import atomic_write_text
from rrtrain.rundir.tail import FileCache, MetricsTail

from unit.launchers.state.test_sweep_status import fake_run
from sweeputil import write_record


def line(rec: dict) -> bytes:
    return (json.dumps(rec) + "\n").encode()


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def test_reads_only_new_bytes(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(line({"step": 1, "loss": 5.0}) + line({"step": 1, "val_loss": 4.5}))
    tail = MetricsTail(path)
    assert [r["step"] for r in tail.refresh()] == [1, 1]
    first = tail.bytes_read
    assert first == path.stat().st_size
    assert tail.refresh() == [] and tail.bytes_read == first  # unchanged: not even opened again
    new = line({"step": 2, "loss": 4.0, "tokens_per_s": 10.0}) + line({"kind": "flag", "flag": "stalled", "step": 2,
                                                                       "detail": "flat"})
    append(path, new)
    got = tail.refresh()
    assert [r.get("loss") for r in got] == [4.0, None]
    assert tail.bytes_read == first + len(new)  # only the appended bytes
    assert tail.last_step == 2 and tail.train["loss"] == 4.0 and tail.val["val_loss"] == 4.5
    assert tail.speed["tokens_per_s"] == 10.0
    assert tail.flags["stalled"].step == 2 and tail.flags["stalled"].detail == "flat"
    assert tail.generation == 0


def test_torn_last_line_waits_for_its_newline(tmp_path):
    path = tmp_path / "metrics.jsonl"
    whole = line({"step": 3, "loss": 3.0})
    path.write_bytes(line({"step": 2, "loss": 4.0}) + whole[:7])  # the writer is mid-line
    tail = MetricsTail(path)
    assert [r["step"] for r in tail.refresh()] == [2]
    assert tail.refresh() == []  # still torn: still waiting, nothing parsed
    append(path, whole[7:])
    assert [(r["step"], r["loss"]) for r in tail.refresh()] == [(3, 3.0)]
    assert tail.bytes_read == path.stat().st_size  # the torn part was read once, when whole


def test_bad_lines_are_skipped_never_raised(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"garbage\n[1,2]\n\"s\"\n{\"step\": \"7\", \"loss\": 1}\n{\"step\": true}\n\xff\xfe\n"
                     + line({"step": 4.0, "loss": 2.0}) + b"{\"step\": 5, \"loss\":" + b"9" * 5000 + b"\n")
    tail = MetricsTail(path)
    got = tail.refresh()
    assert [r["step"] for r in got][:1] == [4] and type(got[0]["step"]) is int
    assert tail.train["step"] in (4, 5)


def test_replaced_file_is_read_again_from_its_start(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"".join(line({"step": s, "loss": 5.0 - s / 10}) for s in range(1, 11))
                     + line({"kind": "flag", "flag": "spike", "step": 9, "detail": "x"}))
    tail = MetricsTail(path)
    assert len(tail.refresh()) == 11 and tail.last_step == 10 and "spike" in tail.flags
    # a resume cuts the file back to step 5 by an atomic replace (a new inode, fewer bytes)
    atomic_write_text(path, "".join(json.dumps({"step": s, "loss": 5.0 - s / 10}) + "\n" for s in range(1, 6)))
    got = tail.refresh()
    assert [r["step"] for r in got] == [1, 2, 3, 4, 5]
    assert tail.generation == 1 and tail.last_step == 5 and tail.flags == {}
    # replaced by a file at least as long (a fresh start that already wrote more): the inode tells
    atomic_write_text(path, "".join(json.dumps({"step": s, "loss": 9.0}) + "\n" for s in range(1, 30)))
    assert len(tail.refresh()) == 29 and tail.generation == 2 and tail.train["loss"] == 9.0
    path.unlink()
    assert tail.refresh() == [] and tail.last_step is None


def test_file_cache_parses_again_only_when_changed(tmp_path):
    path = tmp_path / "final.json"
    cache = FileCache(lambda p: json.loads(p.read_text()) if p.exists() else None)
    assert cache.get(path) is None
    atomic_write_text(path, json.dumps({"status": "running"}))
    assert cache.get(path) == {"status": "running"} and cache.get(path) == {"status": "running"}
    parses = cache.parses
    atomic_write_text(path, json.dumps({"status": "stalled"}))
    assert cache.get(path) == {"status": "stalled"} and cache.parses == parses + 1


def test_status_watch_rereads_only_what_changed_and_finds_a_new_run(tmp_path):
    runs = {f"r{i}": fake_run(tmp_path, f"r{i}", 100 + i) for i in range(4)}
    write_record(tmp_path, {"version": 1, "name": "s", "runs": runs, "submissions": []})
    cache = StatusCache()
    first = status_cli.collect(tmp_path, cache)
    assert {r["id"]: r["step"] for r in first["runs"]} == {"r0": 100, "r1": 101, "r2": 102, "r3": 103}
    read = {p: t.bytes_read for p, t in cache.tails.items()}
    verdict_reads, final_parses = cache.verdict_reads, cache.finals.parses
    assert verdict_reads == 4

    status_cli.collect(tmp_path, cache)  # nothing changed: nothing read again
    assert {p: t.bytes_read for p, t in cache.tails.items()} == read
    assert cache.verdict_reads == verdict_reads and cache.finals.parses == final_parses

    advancing = Path(runs["r1"]["dir"]) / "metrics.jsonl"
    new = line({"step": 102, "loss": 1.5, "tokens": 102 * 512})
    append(advancing, new)
    atomic_write_text(Path(runs["r2"]["dir"]) / "final.json", json.dumps({"status": "stalled", "step": 102,
                                                                           "flags": ["stalled"]}))
    runs["r9"] = fake_run(tmp_path, "r9", 50)  # a run that appears after the watch began
    write_record(tmp_path, {"version": 1, "name": "s", "runs": runs, "submissions": []})
    rows = {r["id"]: r for r in status_cli.collect(tmp_path, cache)["runs"]}
    assert rows["r1"]["step"] == 102 and rows["r1"]["loss"] == 1.5
    assert rows["r2"]["state"] == "stalled" and "stalled" in rows["r2"]["flags"]
    assert rows["r9"]["step"] == 50
    after = {p: t.bytes_read for p, t in cache.tails.items()}
    assert after[advancing] == read[advancing] + len(new)  # the advancing run: only its new line
    assert all(after[p] == n for p, n in read.items() if p != advancing)  # the others: nothing
    assert cache.verdict_reads == verdict_reads + 3  # r1 (grew), r2 (final.json), r9 (new)
    # the same answer as a full read
    full = {r["id"]: r for r in status_cli.collect(tmp_path)["runs"]}
    assert full == rows
