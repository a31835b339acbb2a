"""A run directory is the user's alone under a shared umask (002): the directory as the trainer makes it
(`unwritable_reason`), run.lock, config.yaml, metrics.jsonl, the TensorBoard events, the ranks' files and
final.json are 0700 / 0600; a run.dir that someone else can write, on the way to it included, is refused
before anything is written there. In-process, no training; well under a second."""

from __future__ import annotations

import os
import stat

from rrtrain.core import files
from rrtrain.core.io import unwritable_reason
from rrtrain.rundir import ranks, writers
from rrtrain.rundir.lock import RunLock
from rrtrain.rundir.metrics import MetricsLogger


def test_what_a_run_writes_is_the_users_alone_under_a_shared_umask(tmp_path, monkeypatch):
    monkeypatch.delenv(files.GROUP_READ_ENV, raising=False)
    run = tmp_path / "runs" / "review-s0"
    old = os.umask(0o002)
    try:
        assert unwritable_reason(run) is None  # what the trainer calls first: it makes the directory
        lock = RunLock(run).acquire(0.0)
        writers.write_config(run, {"model": {"variant": "review"}})
        log = MetricsLogger(run, enabled=True)
        log.log({"step": 1, "loss": 3.0})
        log.close()
        ranks.record(run, 0, 0, 2)
        writers.write_final(run, {"status": "completed"})
        modes = {p: p.stat().st_mode for p in [tmp_path / "runs", *(tmp_path / "runs").rglob("*")]}  # lock held
        lock.release()
    finally:
        os.umask(old)
    names = {p.name for p in modes}
    assert {"run.lock", "config.yaml", "metrics.jsonl", "tb", "ranks", "rank0.json", "final.json"} <= names
    assert {str(p): oct(stat.S_IMODE(m)) for p, m in modes.items()
            if stat.S_IMODE(m) != (0o700 if stat.S_ISDIR(m) else 0o600)} == {}


def test_a_run_dir_others_can_write_is_refused_before_anything_is_written(tmp_path):
    shared = tmp_path / "project"
    shared.mkdir()
    shared.chmod(0o775)
    why = unwritable_reason(shared / "runs" / "review-s0")
    assert why is not None and why.startswith(f"'{shared}' can be written by its group (mode 0775): ")
    assert os.listdir(shared) == []
