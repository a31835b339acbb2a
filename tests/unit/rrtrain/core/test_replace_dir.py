"""Replacing a directory (a prepared dataset with --overwrite, a checkpoint of a step saved again): the old
one stays whole under its name until the new one is in place, with or without renameat2's exchange, and
stays there when moving the new one in fails. Runtime: about 1 s."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from rrtrain.core import io as rrio
from rrtrain.training.checkpoint import CheckpointManager
from rrtrain.core.dist import DistInfo
from unit.rrtrain.training.test_ckpt_async import tiny_engine, train_step
from trainutil import train_state

INFO = DistInfo(0, 1, 0, torch.device("cpu"))


def make(path: Path, text: str) -> Path:
    path.mkdir(parents=True)
    (path / "f").write_text(text)
    return path


def fail_moving_in(monkeypatch, staging: str) -> None:
    """No renameat2 exchange, and renaming the directory named `staging` fails."""
    rename = os.rename

    def flaky(src, dst):
        if os.path.basename(os.fspath(src)) == staging:
            raise OSError(5, "Input/output error (injected)")
        return rename(src, dst)

    monkeypatch.setattr(rrio, "_exchange", lambda a, b: False)
    monkeypatch.setattr(rrio.os, "rename", flaky)


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "aside"])
def test_replace_dir_puts_the_new_directory_in_and_leaves_nothing_behind(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(rrio, "_exchange", lambda a, b: False)
    rrio.replace_dir(make(tmp_path / ".new", "one"), tmp_path / "out")  # no target yet
    assert (tmp_path / "out" / "f").read_text() == "one"
    rrio.replace_dir(make(tmp_path / ".new", "two"), tmp_path / "out")
    assert (tmp_path / "out" / "f").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_replace_dir_keeps_the_old_directory_when_the_new_one_cannot_move_in(tmp_path, monkeypatch):
    make(tmp_path / "out", "old")
    fail_moving_in(monkeypatch, ".new")
    with pytest.raises(OSError, match="injected"):
        rrio.replace_dir(make(tmp_path / ".new", "new"), tmp_path / "out")
    assert (tmp_path / "out" / "f").read_text() == "old"


def test_a_step_saved_again_keeps_the_old_checkpoint_until_the_new_one_is_in(tmp_path, monkeypatch):
    engine = tiny_engine(0)
    train_step(engine, 1)
    mgr = CheckpointManager(tmp_path, keep=2, info=INFO)
    mgr.save(engine, 1, train_state(1, mark="first"))
    train_step(engine, 2)
    fail_moving_in(monkeypatch, ".tmp_step_00000001")
    with pytest.raises(OSError, match="injected"):
        mgr.save(engine, 1, train_state(1, mark="second"))
    monkeypatch.undo()
    kept = mgr.latest()
    assert kept is not None and kept.name == "step_00000001"
    assert mgr.read_train_state(kept)["mark"] == "first" and mgr.problem(kept) is None
    mgr.save(engine, 1, train_state(1, mark="second"))  # and without the failure, the new one replaces it
    assert mgr.read_train_state(mgr.latest())["mark"] == "second"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [".rrtrain-key", "latest", "step_00000001"]
