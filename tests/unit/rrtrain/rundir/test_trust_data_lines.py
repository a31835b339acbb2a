"""A metrics.jsonl line is read only up to a bound: a sparse file of zeros (0 bytes on disk, made by truncate) held
as one line exhausted memory in `rrtrain report` and in the pruning pass; now the line is passed over in bounded
pieces and counted as an unreadable line. The live tail (`rrtrain status --watch`, the dashboard) passes over a
line longer than one read instead of reading the same bytes at every refresh. Budget: about 10 s."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import traceback
import tracemalloc
from pathlib import Path

import pytest

from launchers.prune.rungs import Values
from launchers.sweep.spec import PruneSpec
from rrtrain.rundir import readers, tail

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
    """`rrtrain report SWEEP`'s exit status and peak resident memory in KiB, of a child forked from this process
    (wait4: of that child alone) that runs the command's main and exits. The report's modules (torch, matplotlib,
    scipy) are imported here first, so every such child starts from the same memory: what one holds more than
    another is what its report read."""
    from rrtrain.cli.main import main

    for name in ("cli.report", "report.analysis", "report.collect", "report.downstream", "report.grid",
                 "report.plots", "report.render"):
        importlib.import_module(f"rrtrain.{name}")

    with open(sweep.parent / f"{sweep.name}.err", "w") as err:
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 70
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
                os.dup2(err.fileno(), 2)
                sys.stdout = os.fdopen(1, "w")  # not pytest's capture, which writes into this process's files
                sys.stderr = os.fdopen(2, "w", buffering=1)
                code = main(["report", str(sweep)])
            except BaseException:
                with contextlib.suppress(BaseException):
                    traceback.print_exc()
            finally:
                with contextlib.suppress(BaseException):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code if isinstance(code, int) else 70)
        _, status, usage = os.wait4(pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss


@pytest.mark.slow
def test_report_on_a_sparse_metrics_file_stays_small(tmp_path):
    """`rrtrain report` over a run whose metrics.jsonl holds a 256 MiB line of zeros: the run is reported with the
    line counted in its problems, and the report's peak memory is that of the same report without the line (the
    two reports run in children forked from one process that imported the report's modules, and differ by a few
    MB), within 64 MiB: not the line's 256 MiB more."""
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
