"""Checkpoints are the user's alone and go where the run started: `checkpoints/` (a link to scratch) is
resolved once, so a link swapped mid-run neither receives the next save nor has its checkpoints pruned; a
later invocation prunes what an earlier one of the same run made (the directory's durable key) and only
that; a checkpoint directory others can write is refused in one line. One process, a tiny engine; about 3 s."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rrtrain.core import files
from rrtrain.core.errors import UsageError
from rrtrain.training.checkpoint import CheckpointManager
from trainutil import train_state
from unit.rrtrain.training.test_ckpt_async import INFO, tiny_engine, train_step


def names(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def test_a_link_swapped_mid_run_gets_no_save_and_loses_no_checkpoint(tmp_path):
    engine = tiny_engine(0)
    other_run = tmp_path / "other-run"
    theirs = CheckpointManager(other_run, keep=1, info=INFO)  # another of the user's runs, with checkpoints
    theirs.save(engine, 1, train_state(1))
    before = names(other_run / "checkpoints")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").symlink_to(scratch)
    mgr = CheckpointManager(run, keep=1, info=INFO)
    train_step(engine, 1)
    mgr.save(engine, 2, train_state(2))
    (run / "checkpoints").unlink()
    (run / "checkpoints").symlink_to(other_run / "checkpoints")  # swapped between two saves
    train_step(engine, 2)
    mgr.save(engine, 3, train_state(3))
    assert names(other_run / "checkpoints") == before  # nothing published there, nothing pruned there
    assert names(scratch) == [files.KEY_FILE, "latest", "step_00000003"]  # step 2 pruned where it was made


def test_a_resumed_run_prunes_what_its_earlier_invocation_made_and_keeps_the_rest(tmp_path, monkeypatch, capsys):
    engine = tiny_engine(0)
    CheckpointManager(tmp_path, keep=1, info=INFO).save(engine, 1, train_state(1))
    root = tmp_path / "checkpoints"
    planted = root / "step_00000000"  # a directory that looks like a checkpoint, made by no save
    planted.mkdir()
    (planted / "data").write_text("not a checkpoint")
    monkeypatch.setattr(files, "_PROCESS_KEY", os.urandom(32))  # the next invocation: a process key of its own
    again = CheckpointManager(tmp_path, keep=1, info=INFO)
    again.save(engine, 2, train_state(2))
    again.save(engine, 3, train_state(3))
    assert names(root) == [files.KEY_FILE, "latest", "step_00000000", "step_00000003"]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "step_00000000" in line]
    assert len(warnings) == 1 and "kept" in warnings[0]  # said once, not at every save


def test_a_checkpoint_is_the_users_alone_whatever_the_umask(tmp_path, monkeypatch):
    monkeypatch.delenv(files.GROUP_READ_ENV, raising=False)
    old = os.umask(0o002)
    try:
        CheckpointManager(tmp_path, keep=1, info=INFO).save(tiny_engine(0), 1, train_state(1))
    finally:
        os.umask(old)
    root = tmp_path / "checkpoints"
    for path in [root, *root.rglob("*")]:
        want = 0o700 if path.is_dir() else 0o600
        assert stat.S_IMODE(path.stat().st_mode) == want, f"{path}: {stat.S_IMODE(path.stat().st_mode):04o}"


def test_a_checkpoint_directory_others_can_write_is_refused(tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    scratch.chmod(0o775)
    (tmp_path / "checkpoints").symlink_to(scratch)
    with pytest.raises(UsageError, match="scratch' can be written by its group"):
        CheckpointManager(tmp_path, keep=1, info=INFO)
