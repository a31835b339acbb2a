"""A full disk and a run directory that cannot be written, on real filesystems (tmpfs mounts).

A checkpoint write that runs out of space removes its partial files, ends the run with one line (exit 1)
and final.json, leaves the previous checkpoint intact, and the run resumes exactly once space is freed; a
write in the background (`train.ckpt_async`) ends the same way. A run directory that cannot be written
stops the run before training: one line, exit 2. Budget: about 80 s."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from faultutil import can_mount, finish, resize, tmpfs
from trainutil import final, losses, records, start_ranks, train

pytestmark = pytest.mark.skipif(not can_mount(), reason="needs to mount a tmpfs (root with CAP_SYS_ADMIN)")

ARGS = ("train.max_steps=8", "train.ckpt_every=2", "train.eval_every=3", "train.log_every=1", "train.keep_ckpts=2")


def run_out_of_space_at_step_6_then_resume(run: Path, data: Path, args: tuple[str, ...], size: int,
                                           failed_at: int) -> None:
    """Checkpoints on a tmpfs with room for two checkpoints (`size` bytes each) and part of a third: the write
    of step 6 runs out of space and the run ends at step `failed_at` with one line, the partial checkpoint
    gone and step 4 intact; then, space freed, the same command resumes from step 4."""
    with tmpfs(run / "checkpoints", str(int(size * 2.5))) as ckpts:
        proc = train(run, data, *args, expect=1)
        assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
        assert "no space left" in proc.stderr and "step_00000006" in proc.stderr, proc.stderr
        assert "step_00000004 is intact" in proc.stderr, proc.stderr
        fin = final(run)
        assert fin["status"] == "failed" and fin["step"] == failed_at and "no space left" in fin["reason"]
        assert sorted(p.name for p in ckpts.iterdir()) == [".rrtrain-key", "latest", "step_00000002", "step_00000004"]
        assert (ckpts / "latest").read_text().strip() == "step_00000004"
        resize(ckpts, str(size * 4))  # space freed
        proc = train(run, data, *args)
        assert "resumed at step 4" in proc.stdout, proc.stdout


@pytest.fixture(scope="module")
def reference(tmp_path_factory, stories_data) -> Path:
    """The uninterrupted ARGS run: the losses to match, and the size of one of its checkpoints."""
    ref = tmp_path_factory.mktemp("disk") / "ref"
    train(ref, stories_data, *ARGS)
    return ref


def checkpoint_bytes(run: Path, step: int) -> int:
    return sum(f.stat().st_size for f in (run / "checkpoints" / f"step_{step:08d}").rglob("*") if f.is_file())


def test_full_disk_during_a_checkpoint_then_exact_resume(tmp_path, stories_data, reference):
    ref = reference
    size = checkpoint_bytes(ref, 8)
    run = tmp_path / "run"
    run_out_of_space_at_step_6_then_resume(run, stories_data, ARGS, size, failed_at=6)
    steps = [r["step"] for r in records(run) if "loss" in r]
    assert steps == list(range(1, 9))
    assert losses(run) == losses(ref)  # bitwise
    assert final(run)["status"] == "completed" and final(run)["final_val_loss"] == final(ref)["final_val_loss"]


def test_full_disk_during_an_async_checkpoint(tmp_path, stories_data, reference):
    """The background write of step 6 runs out of space; the run learns it when it next waits for the write (at
    its end: the stop check comes every 10 steps) and ends exactly as a synchronous save would have."""
    args = (*ARGS, "train.ckpt_async=true")
    size = checkpoint_bytes(reference, 8)  # as large as every other checkpoint of this run
    run = tmp_path / "run"
    run_out_of_space_at_step_6_then_resume(run, stories_data, args, size, failed_at=8)
    assert [r["step"] for r in records(run) if "loss" in r] == list(range(1, 9))
    assert final(run)["status"] == "completed"


def test_final_json_on_a_full_disk(tmp_path, stories_data):
    from rrtrain.config import load_config
    from rrtrain.training.trainer import Trainer
    from trainutil import TINY

    with tmpfs(tmp_path / "run", "64k") as run:
        trainer = Trainer(load_config(TINY, [f"run.dir={run}", f"data.path={stories_data}"]))
        filler = run / "filler"
        with pytest.raises(OSError) as err, open(filler, "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        assert err.value.errno == errno.ENOSPC
        trainer.status = "completed"
        assert trainer.write_final() is False
        assert sorted(p.name for p in run.iterdir()) == ["filler"]  # no partial final.json, no temporary file
        filler.unlink()
        assert trainer.write_final() is True and final(run)["status"] == "completed"


@pytest.mark.parametrize("case", ["read-only", "file in the way", "file above"])
def test_unwritable_run_dir_stops_before_training(tmp_path, stories_data, case):
    if case == "read-only":
        ctx = tmpfs(tmp_path / "ro", "64k", "ro")
        run = tmp_path / "ro" / "run"
        want = "Read-only file system"
    else:
        import contextlib

        ctx = contextlib.nullcontext()
        (tmp_path / "file").write_text("not a directory\n")
        run = tmp_path / "file" if case == "file in the way" else tmp_path / "file" / "run"
        want = "a file is in the way" if case == "file in the way" else "is not a directory"
    with ctx:
        proc = train(run, stories_data, "train.max_steps=2", expect=2)
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "cannot be written" in proc.stderr and want in proc.stderr, proc.stderr
    assert "params" not in proc.stdout  # nothing started


def test_unwritable_run_dir_stops_every_rank(tmp_path, stories_data):
    (tmp_path / "file").write_text("not a directory\n")
    procs = start_ranks(tmp_path / "file", stories_data, "train.max_steps=2", "train.micro_batch=8",
                        "parallel.backend=fsdp", "parallel.timeout_s=60")
    for rank, (code, _, err) in enumerate(finish(procs, timeout=120)):
        assert code == 2 and err.count("\n") == 1 and "a file is in the way" in err, (rank, err)
