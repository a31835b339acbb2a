"""A metrics.jsonl line is read only up to a bound: a sparse file of zeros (0 bytes on disk, made by truncate) held
as one line exhausted memory in `rrtrain report` and in the pruning pass; now the line is passed over in bounded
pieces and counted as an unreadable line. The live tail (`rrtrain status --watch`, the dashboard) passes over a
line longer than one read instead of reading the same bytes at every refresh. Budget: about 10 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from launchers.prune.rungs import Values
from launchers.sweep.spec import PruneSpec
from rrtrain.rundir import readers, tail
from trainutil import REPO, env

MiB = 1 << 20


def sparse_metrics(path: Path, size: int) -> None:
    """Two training lines around one line of `size` zero bytes that takes no space on disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(json.dumps({"step": 1, "loss": 3.0}).encode() + b"\n")
        f.truncate(f.tell() + size)
        f.seek(0, 2)
        f.write(b"\n" + json.dumps({"step": 2, "loss": 2.0}).encode() + b"\n")


def test_records_read_an_enormous_line_in_bounded_memory(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    sparse_metrics(path, 256 * MiB)
    tracemalloc.start()
    try:
        got = list(readers.records(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == [{"step": 1, "loss": 3.0}, None, {"step": 2, "loss": 2.0}]
    assert peak < 80 * MiB, f"{peak / MiB:.0f} MiB held for one line"


def test_the_pruning_pass_reads_an_enormous_line_in_bounded_memory(tmp_path):
    run = tmp_path / "run"
    sparse_metrics(run / "metrics.jsonl", 256 * MiB)
    values = Values(PruneSpec(metric="train_loss", smooth=2), {"r": run}, {})
    tracemalloc.start()
    try:
        got = values.read(run, 2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == 2.5 and peak < 80 * MiB, f"{peak / MiB:.0f} MiB held for one line"


def report_peak(sweep: Path) -> tuple[int, int]:
    """`rrtrain report SWEEP`'s exit status and peak resident memory in KiB (of that process alone: wait4)."""
    with open(sweep.parent / f"{sweep.name}.err", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "rrtrain", "report", str(sweep)], cwd=REPO, env=env(),
                                stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss


@pytest.mark.slow
def test_report_on_a_sparse_metrics_file_stays_small(tmp_path):
    """`rrtrain report` over a run whose metrics.jsonl holds a 256 MiB line of zeros: the run is reported with the
    line counted in its problems, and the report's peak memory is that of the same report without the line (the
    report itself, torch and matplotlib imported, is about 750 MB; the two differ by a few MB), within 64 MiB: not
    the line's 256 MiB more."""
    peaks = {}
    for name, size in (("plain", 0), ("sparse", 256 * MiB)):
        run = tmp_path / name / "tiny" / "review-0"
        sparse_metrics(run / "metrics.jsonl", size)
        (run / "final.json").write_text(json.dumps({"status": "completed", "step": 2, "final_val_loss": 2.0,
                                                    "params": 1e6, "variant": "review", "size": "tiny", "seed": 0}))
        code, peaks[name] = report_peak(tmp_path / name)
        assert code == 0, (tmp_path / f"{name}.err").read_text()[-3000:]
    assert peaks["sparse"] < peaks["plain"] + 64 * 1024, f"{peaks['sparse'] - peaks['plain']} KiB more for the line"
    assert "metrics.jsonl: 1 unreadable line(s) skipped" in (tmp_path / "sparse" / "report" / "results.csv").read_text()


def test_the_live_tail_passes_over_a_line_longer_than_one_read(tmp_path, monkeypatch):
    monkeypatch.setattr(tail, "READ_MAX", MiB)
    path = tmp_path / "metrics.jsonl"
    with open(path, "wb") as f:
        f.write(json.dumps({"step": 1, "loss": 3.0}).encode() + b"\n" + b"x" * (3 * MiB))
    t = tail.MetricsTail(path)
    assert [r["step"] for r in t.refresh()] == [1]
    for _ in range(4):  # inside the long line: each refresh passes over at most one read of it
        assert t.refresh() == []
    with open(path, "ab") as f:
        f.write(b"x" * 100 + b"\n" + json.dumps({"step": 2, "loss": 2.0}).encode() + b"\n")
    seen = [r["step"] for _ in range(3) for r in t.refresh()]
    assert seen == [2] and t.offset == path.stat().st_size and t.bytes_read <= path.stat().st_size
