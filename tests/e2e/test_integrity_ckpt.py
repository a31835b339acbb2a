"""Damaged checkpoints: resume passes over them with a warning naming the file and what is wrong, continues
from the newest intact one, and its losses from there on are bitwise those of the uninterrupted run; with no
intact checkpoint left the run refuses to start afresh. Budget: about 40 s."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trainutil import final, losses, records, train

ARGS = ("train.max_steps=8", "train.ckpt_every=2", "train.eval_every=3", "train.log_every=1", "train.keep_ckpts=3")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, stories_data) -> Path:
    """One completed ARGS run; each test damages or restarts a copy of it (one launch fewer per test)."""
    run = tmp_path_factory.mktemp("finished") / "run"
    train(run, stories_data, *ARGS)
    return run


def copy_of(run: Path, dest: Path) -> Path:
    shutil.copytree(run, dest, symlinks=True)
    return dest


def largest_file(ckpt: Path) -> Path:
    return max((f for f in ckpt.rglob("*") if f.is_file() and f.name != "train_state.json"), key=lambda f: f.stat().st_size)


def test_resume_passes_over_damaged_checkpoints(tmp_path, stories_data, finished_run):
    run = copy_of(finished_run, tmp_path / "run")
    ref_losses, ref_val = losses(run), final(run)["final_val_loss"]
    ckpts = run / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_00000004", "step_00000006", "step_00000008"]
    recorded = json.loads((ckpts / "step_00000008" / "train_state.json").read_text())["files"]
    assert "rng_rank0.pt" in recorded and any(k.startswith("state/") for k in recorded)

    big = largest_file(ckpts / "step_00000008")  # cut in half, as an interrupted copy leaves it
    with open(big, "r+b") as f:
        f.truncate(big.stat().st_size // 2)
    (ckpts / "step_00000006" / "rng_rank0.pt").unlink()
    proc = train(run, stories_data, *ARGS)
    err = proc.stderr
    assert "Traceback" not in err
    assert f"step_00000008 is unusable: {big.relative_to(ckpts / 'step_00000008')} is" in err, err
    assert "step_00000006 is unusable: rng_rank0.pt is missing" in err, err
    assert "resuming from step_00000004" in err and "resumed at step 4" in proc.stdout, (err, proc.stdout)
    assert [r["step"] for r in records(run) if "loss" in r] == list(range(1, 9))
    assert losses(run) == ref_losses and final(run)["final_val_loss"] == ref_val  # bitwise


def test_no_intact_checkpoint_refuses_to_start_afresh(tmp_path, stories_data):
    run = tmp_path / "run"
    train(run, stories_data, "train.max_steps=2", "train.ckpt_every=1", "train.keep_ckpts=2")
    for ckpt in (run / "checkpoints").glob("step_*"):
        with open(largest_file(ckpt), "r+b") as f:
            f.seek(100)
            f.write(b"\xff" * 64)  # same length, different bytes
    before = (run / "final.json").read_bytes()
    proc = train(run, stories_data, "train.max_steps=2", "train.ckpt_every=1", "train.keep_ckpts=2", expect=2)
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "no usable checkpoint" in proc.stderr and "does not match its xxh64 checksum" in proc.stderr, proc.stderr
    assert (run / "final.json").read_bytes() == before  # refused before training: the completed ending stands
    (run / "final.json").unlink()
    train(run, stories_data, "train.max_steps=2", "train.ckpt_every=1", "train.keep_ckpts=2", expect=2)
    assert final(run)["status"] == "failed" and "no usable checkpoint" in final(run)["reason"]  # none recorded


def test_a_finished_run_started_again_keeps_its_checkpoint(tmp_path, stories_data, finished_run):
    """A job started again after its run completed (a requeue, a resubmitted sweep) resumes at the last step,
    evaluates again and ends: it does not write that step's checkpoint a second time (at rr-1b, gigabytes)."""
    run = copy_of(finished_run, tmp_path / "run")
    last = run / "checkpoints" / "step_00000008"
    before = (last.stat().st_ino, (last / "train_state.json").stat().st_mtime_ns)
    proc = train(run, stories_data, *ARGS)
    assert "resumed at step 8" in proc.stdout, proc.stdout
    assert (last.stat().st_ino, (last / "train_state.json").stat().st_mtime_ns) == before
    assert final(run)["status"] == "completed"
