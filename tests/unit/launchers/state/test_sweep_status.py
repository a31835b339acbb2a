"""`rrtrain status`: run states from files, the tail-only read of metrics.jsonl (200 runs of 200 MB: at most a
few MiB read from each; the CPU it takes is tests/benchmarks/bench_status.py's), and which runs a resubmission
picks."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from launchers.sweep import record
from launchers.state import runstate
from launchers.state import status as status_cli
from launchers.submit import to_submit
from launchers.sweep.expand import Run
from launchers.sweep.record import RunEntry
from launchers.sweep.spec import Resources
from rrtrain.core import files
from rrtrain.core.errors import UsageError
from rrtrain.rundir import lock as runlock
from rrtrain.rundir import readers
from rrtrain.rundir.readers import parse_final
from sweeputil import write_record
from trainutil import PY

CONFIG = {"train": {"max_steps": 1000, "tokens": None, "global_batch": 8}, "model": {"size": "tiny", "seq_len": None},
          "data": {"path": None}, "run": {"dir": ""}}


def fake_run(root: Path, rid: str, step: int, big_mb: int = 0, final: dict | None = None) -> dict:
    """A run directory whose metrics.jsonl is `big_mb` MiB of (sparse) padding followed by real lines."""
    run_dir = root / rid
    run_dir.mkdir(parents=True)
    path = run_dir / "metrics.jsonl"
    with open(path, "wb") as f:
        if big_mb:
            f.truncate(big_mb * 2**20)
            f.seek(big_mb * 2**20)
            f.write(b"\n")
        for s in range(max(1, step - 300), step + 1):
            rec = {"step": s, "loss": 5.0 - s / 1000, "grad_norm": 1.0, "lr": 1e-3, "tokens": s * 512}
            if s % 10 == 0:
                rec["tokens_per_s"] = 1234.5
            f.write((json.dumps(rec) + "\n").encode())
            if s % 250 == 0:
                f.write((json.dumps({"step": s, "val_loss": 4.0 - s / 1000, "tokens": s * 512}) + "\n").encode())
            if s % 50 == 0:
                f.write((json.dumps({"kind": "diag", "step": s, "block_grad_norm": [0.1] * 200}) + "\n").encode())
    if final is not None:
        (run_dir / "final.json").write_text(json.dumps(final))
    config = json.loads(json.dumps(CONFIG))
    config["run"]["dir"] = str(run_dir)
    return {"size": "tiny", "variant": "review", "seed": 0, "dir": str(run_dir), "config": config,
            "resources": {}}


def test_tail_finds_last_train_val_and_speed(tmp_path):
    entry = fake_run(tmp_path, "r", 997, big_mb=8)
    row = runstate.run_row("r", RunEntry(**entry), None, submitted=True)
    assert row["step"] == 997 and row["total_steps"] == 1000 and row["tokens"] == 997 * 512
    assert row["loss"] == pytest.approx(5.0 - 0.997) and row["val_loss"] == pytest.approx(4.0 - 0.75)
    assert row["tokens_per_s"] == 1234.5
    assert row["state"] == "failed"  # it ran, it holds no lock and left no final.json: killed hard


class CountingRaw(io.RawIOBase):
    """A file's raw reads, counted per path: what a reader took from the disk, whatever the machine's load."""

    def __init__(self, raw: io.RawIOBase, tally: dict[str, int], path: str) -> None:
        super().__init__()
        self.raw, self.tally, self.path = raw, tally, path

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # noqa: ANN001 - a writable buffer
        n = self.raw.readinto(b) or 0
        self.tally[self.path] = self.tally.get(self.path, 0) + n
        return n

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        return self.raw.seek(pos, whence)

    def tell(self) -> int:
        return self.raw.tell()

    def close(self) -> None:
        self.raw.close()
        super().close()


def big_sweep(tmp_path: Path, n: int) -> list:
    """`n` runs with 200 MB (sparse) metrics files: every other one completed, the rest "trained" by this process."""
    runs, held = {}, []
    for i in range(n):
        rid = f"tiny-review-s{i}"
        final = {"status": "completed", "step": 1000, "tokens": 512000, "flags": []} if i % 2 else None
        runs[rid] = fake_run(tmp_path, rid, 1000 if i % 2 else 500 + i, big_mb=200, final=final)
        if final is None:  # this process "trains" the other half
            held.append(runlock.RunLock(tmp_path / rid).acquire(0))
    write_record(tmp_path, {"version": 1, "name": "big", "runs": runs, "submissions": []})
    return held


def test_status_of_200_big_runs_reads_only_their_tails(tmp_path, monkeypatch):
    """The tail-only read, counted in bytes rather than timed (the CPU figure: tests/benchmarks/bench_status.py)."""
    held = big_sweep(tmp_path, 200)
    tally: dict[str, int] = {}
    real_open = files.open_regular

    def counting_open(path):  # noqa: ANN001, ANN202 - as files.open_regular
        fh = real_open(path)
        return io.BufferedReader(CountingRaw(fh.detach(), tally, str(path)))

    monkeypatch.setattr(files, "open_regular", counting_open)
    status = status_cli.collect(tmp_path)
    assert status["counts"] == {"running": 100, "completed": 100}
    assert status["runs"][0]["state"] == "running"  # needs more attention than the completed ones
    rows = {r["id"]: r for r in status["runs"]}
    assert rows["tiny-review-s3"]["step"] == 1000 and rows["tiny-review-s4"]["step"] == 504
    metrics = {p: n for p, n in tally.items() if p.endswith("metrics.jsonl")}
    assert len(metrics) == 200  # every run's log was read ...
    worst = max(metrics.values())
    assert worst <= 2 * readers.TAIL_MAX, f"status read {worst} bytes of one 200 MB metrics.jsonl"  # ... its end
    for lock in held:
        lock.release()


def test_classify(tmp_path):
    held = runlock.RunLock(tmp_path).acquire(0)
    alive = runlock.read(tmp_path)  # this process holds it
    dead = {"host": socket.gethostname(), "pid": 2**22 + 12345, "heartbeat": time.time()}
    far_stale = {"host": "elsewhere", "pid": 1, "heartbeat": time.time() - 3600}
    done = parse_final({"status": "completed"})
    assert runstate.classify(done, alive, None, True, True) == "running"  # a resumed run: the lock wins
    assert runstate.classify(parse_final({"status": "preempted"}), None, "PENDING", True, True) == "pending"  # requeued
    assert runstate.classify(parse_final({"status": "preempted"}), None, None, True, True) == "preempted"
    assert runstate.classify(None, None, "RUNNING", False, True) == "running"
    assert runstate.classify(None, dead, None, True, True) == "failed"
    assert runstate.classify(None, far_stale, None, True, True) == "failed"
    assert runstate.classify(None, None, None, False, True) == "unknown"
    assert runstate.classify(None, None, None, False, False) == "pending"
    assert runstate.classify(parse_final({"status": "diverged"}), None, None, True, True) == "diverged"
    held.release()


def test_resubmission_picks_failed_and_preempted_only(tmp_path):
    res = Resources()
    states = {"done": {"status": "completed"}, "div": {"status": "diverged"}, "bad": {"status": "failed"},
              "pre": {"status": "preempted"}, "new": None, "live": None}
    runs, entries = [], {}
    for rid, final in states.items():
        entry = fake_run(tmp_path, rid, 10, final=final)
        entries[rid] = entry
        runs.append(Run(rid, "tiny", "review", 0, entry["config"], res))
    (tmp_path / "new" / "metrics.jsonl").unlink()
    runlock.RunLock(tmp_path / "live").acquire(0)  # a live copy trains there
    rec = record.SweepRecord("x", {rid: RunEntry(**e) for rid, e in entries.items()}, [
        record.Submission("local", {rid: "local:1" for rid in states if rid != "new"})])
    todo, skipped = to_submit(runs, rec)
    assert sorted(r.id for r in todo) == ["bad", "new", "pre"]
    assert skipped == {"done": "completed", "div": "diverged", "live": "running"}


def test_status_cli_json_and_bad_dir(tmp_path):
    runs = {"a": fake_run(tmp_path, "a", 20, final={"status": "failed", "step": 20, "flags": ["nonfinite_steps"]})}
    write_record(tmp_path, {"version": 1, "name": "s", "runs": runs, "submissions": []})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([PY, "-m", "rrtrain", "status", str(tmp_path), "--json"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["sweep"] == "s" and out["counts"] == {"failed": 1}
    row = out["runs"][0]
    assert {k: row[k] for k in ("id", "state", "step", "flags")} == {
        "id": "a", "state": "failed", "step": 20, "flags": ["nonfinite_steps"]}
    proc = subprocess.run([PY, "-m", "rrtrain", "status", str(tmp_path / "nope")], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 2 and "no sweep.json" in proc.stderr


def test_status_reads_any_folder_of_runs_without_sweep_json(tmp_path):
    """As `report` and `dashboard` do: no sweep.json, each run directory below the folder is a row named by its
    path under it; a folder with no run is one line naming what is missing."""
    fake_run(tmp_path / "group", "a", 20, final={"status": "completed", "step": 20, "variant": "review",
                                                  "size": "tiny", "seed": 1})
    (tmp_path / "group" / "a" / "config.yaml").write_text("model: {size: tiny, variant: review}\ntrain: {seed: 1}\n")
    fake_run(tmp_path, "b", 7)
    out = status_cli.collect(tmp_path)
    rows = {r["id"]: r for r in out["runs"]}
    assert sorted(rows) == ["b", "group/a"] and out["sweep"] == tmp_path.name
    assert {k: rows["group/a"][k] for k in ("state", "step", "variant", "size", "seed")} == {
        "state": "completed", "step": 20, "variant": "review", "size": "tiny", "seed": 1}
    assert rows["b"]["step"] == 7 and rows["b"]["state"] == "failed"  # it ran, no final.json, no live lock
    assert "group/a" in status_cli.table(out)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UsageError, match="no sweep.json and no run directory"):
        status_cli.collect(empty)
