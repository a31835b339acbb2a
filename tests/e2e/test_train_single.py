"""The trainer in one process, on real synthetic-stories shards: AC, bf16, non-finite handling,
resume refusal, TensorBoard, and exact resume after SIGKILL / SIGTERM, with checkpoints written in the
foreground and in the background (`train.ckpt_async`)."""

from __future__ import annotations

import json
import random
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from rrtrain.training.checkpoint import TRAIN_STATE, file_problems
from trainutil import (checkpoint_tensors, final, kill_group, losses, max_rel_diff, records, start, train,
                       wait_for_step)

FAST = ["train.max_steps=12", "train.log_every=1", "train.eval_every=0", "train.ckpt_every=0",
        "train.global_batch=8", "train.micro_batch=4", "train.warmup_steps=3"]


@pytest.fixture(scope="module")
def fast_run(tmp_path_factory, stories_data) -> Path:
    """One completed FAST run (parallel.ac=none, ac_every=2: the defaults), read or copied by the tests below."""
    run = tmp_path_factory.mktemp("fast") / "run"
    train(run, stories_data, *FAST)
    return run


def test_activation_checkpointing_gives_the_same_losses(tmp_path, stories_data, fast_run):
    runs = {"none": losses(fast_run)}  # FAST with the defaults: parallel.ac=none, parallel.ac_every=2
    for ac in ("full", "selective"):
        train(tmp_path / ac, stories_data, *FAST, f"parallel.ac={ac}", "parallel.ac_every=2")
        runs[ac] = losses(tmp_path / ac)
    assert len(runs["none"]) == 12
    assert max_rel_diff(runs["none"], runs["full"]) < 1e-6
    assert max_rel_diff(runs["none"], runs["selective"]) < 1e-6


def test_bf16_runs_and_its_loss_falls(tmp_path, stories_data):
    train(tmp_path / "bf16", stories_data, "parallel.precision=bf16", "train.max_steps=8", "train.log_every=1",
          "train.eval_every=0", "train.global_batch=4", "train.micro_batch=4", "train.warmup_steps=2",
          "model.variant=review")
    got = losses(tmp_path / "bf16")
    assert all(v == v for v in got.values())
    assert got[8] < got[1] - 0.3, got
    assert final(tmp_path / "bf16")["status"] == "completed"


def test_gradient_accumulation_matches_one_big_micro_batch(tmp_path, stories_data, fast_run):
    """FAST's 8 sequences a step as one micro-batch, and as two of 4 accumulated (fast_run)."""
    train(tmp_path / "a", stories_data, *FAST, "train.micro_batch=8")
    assert len(losses(fast_run)) == 12
    assert max_rel_diff(losses(tmp_path / "a"), losses(fast_run)) < 1e-5


def test_injected_nan_is_skipped_and_counted(tmp_path, stories_data):
    run = tmp_path / "skip"
    train(run, stories_data, *FAST, "train.fail_at_step=5", "train.on_nonfinite=skip")
    fin = final(run)
    assert fin["status"] == "completed" and fin["nonfinite_skipped"] == 1 and "nonfinite_steps" in fin["flags"]
    recs = {r["step"]: r for r in records(run) if "loss" in r}
    assert recs[5].get("skipped") is True and not recs[6].get("skipped")
    assert sorted(recs) == list(range(1, 13))


def test_consecutive_nans_halt_as_diverged(tmp_path, stories_data):
    run = tmp_path / "streak"
    proc = train(run, stories_data, *FAST, "train.fail_at_step=4", "train.fail_steps=100", "train.max_nonfinite=3",
                 expect=3)
    fin = final(run)
    assert fin["status"] == "diverged" and fin["step"] == 6 and fin["exit_code"] == 3, proc.stdout
    halt = tmp_path / "halt"
    train(halt, stories_data, *FAST, "train.fail_at_step=4", "train.on_nonfinite=halt", expect=3)
    assert final(halt)["status"] == "diverged" and final(halt)["step"] == 4


def test_changed_configuration_refuses_to_resume(tmp_path, stories_data, fast_run):
    run = tmp_path / "run"
    shutil.copytree(fast_run, run, symlinks=True)  # a completed FAST run
    proc = train(run, stories_data, *FAST, "train.global_batch=16", expect=2)
    assert "train.global_batch: 8 -> 16" in proc.stderr and "allow_config_change" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    proc = train(run, stories_data, *FAST, "model.d_model=96", "train.allow_config_change=true", expect=2)
    assert "model.d_model: None -> 96" in proc.stderr and "new run.dir" in proc.stderr
    train(run, stories_data, *FAST, "train.max_steps=14", "train.allow_config_change=true")
    assert final(run)["step"] == 14


def test_tensorboard_holds_the_scalars(tmp_path, stories_data):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "tb"
    train(run, stories_data, *FAST, "train.eval_every=6", "train.diag_every=4", "model.variant=review")
    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/mfu", "eval/val_loss",
                "diag/block_grad_norm/000", "diag/gate_mean/000", "diag/gate_std/007"):
        assert tag in tags, (tag, sorted(tags))
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(1, 13))
    assert acc.Scalars("train/loss")[3].value == pytest.approx(losses(run)[4], rel=1e-6)
    diag = [r for r in records(run) if r.get("kind") == "diag"]
    assert [d["step"] for d in diag] == [4, 8, 12] and len(diag[0]["block_grad_norm"]) == 4
    assert len(diag[0]["gate_mean"]) == 8 and all(0 < g < 1 for g in diag[0]["gate_mean"])


RESUME = ["train.max_steps=30", "train.log_every=1", "train.eval_every=10", "train.ckpt_every=10",
          "train.global_batch=8", "train.micro_batch=4", "train.warmup_steps=3", "train.keep_ckpts=2"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, stories_data):
    """The uninterrupted RESUME run (checkpoints written in the foreground), shared by the resume tests."""
    ref = tmp_path_factory.mktemp("reference") / "ref"
    train(ref, stories_data, *RESUME)
    return ref


def assert_same_run(a, b):
    assert max_rel_diff(losses(a), losses(b)) == 0.0
    pa, pb = checkpoint_tensors(a), checkpoint_tensors(b)
    assert pa.keys() == pb.keys()
    for key in pa:
        assert torch.equal(pa[key], pb[key]), key


def test_exact_resume_after_sigkill(tmp_path, stories_data, reference):
    ref = reference
    run = tmp_path / "killed"
    kill_at = random.Random(1234).randint(12, 17)
    proc = start(run, stories_data, *RESUME)
    wait_for_step(run, kill_at, proc)
    kill_group(proc, signal.SIGKILL)
    proc.wait()
    seen = max(losses(run))
    assert 10 < seen < 20, seen  # killed between the checkpoints at steps 10 and 20
    assert not (run / "final.json").exists()
    train(run, stories_data, *RESUME)
    assert final(run)["status"] == "completed" and sorted(losses(run)) == list(range(1, 31))
    assert_same_run(ref, run)
    assert_tensorboard_resumed(run, at=10)


def assert_tensorboard_resumed(run: Path, at: int) -> None:
    """TensorBoard shows every step once, with the loss metrics.jsonl holds: the resumed run's event file starts
    with a restart marker after the checkpoint's step, which drops what the killed run had written past it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    files = sorted((run / "tb").glob("events.out.tfevents.*"))
    assert len(files) == 2, files
    restarts = [[e.step for e in EventFileLoader(str(f)).Load() if e.HasField("session_log")] for f in files]
    assert restarts == [[], [at + 1]]
    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    shown = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    assert shown == [(step, pytest.approx(loss, rel=1e-6)) for step, loss in sorted(losses(run).items())]


def test_sigterm_checkpoints_preempts_and_resumes_once(tmp_path, stories_data, reference):
    ref = reference
    run = tmp_path / "term"
    proc = start(run, stories_data, *RESUME)
    wait_for_step(run, 13, proc)
    kill_group(proc, signal.SIGTERM)
    assert proc.wait(timeout=120) == 75
    fin = final(run)
    assert fin["status"] == "preempted" and fin["signal"] == "SIGTERM"
    assert (run / "checkpoints" / "latest").read_text().strip() == f"step_{fin['step']:08d}"
    train(run, stories_data, *RESUME)
    steps = [r["step"] for r in records(run) if "loss" in r]
    assert steps == list(range(1, 31))  # every step exactly once
    assert final(run)["status"] == "completed"
    assert_same_run(ref, run)


#: checkpoints written in the background; the stop check, which also publishes a written one, every 2 steps
ASYNC = [*RESUME, "train.ckpt_async=true", "train.stop_check_every=2"]


def latest_name(run: Path) -> str | None:
    path = run / "checkpoints" / "latest"
    return path.read_text().strip() if path.exists() else None


def checkpoint_records(run: Path) -> dict[int, dict]:
    return {r["step"]: r for r in records(run) if r.get("kind") == "checkpoint"}


def line_index(run: Path, match) -> int:  # noqa: ANN001 - a predicate on a record
    """Where the first record that `match`es sits in metrics.jsonl."""
    return next(i for i, r in enumerate(records(run)) if match(r))


def test_exact_resume_after_sigkill_with_async_checkpoints(tmp_path, stories_data, reference):
    run = tmp_path / "killed"
    kill_at = random.Random(1234).randint(12, 17)
    proc = start(run, stories_data, *ASYNC)
    wait_for_step(run, kill_at, proc)
    deadline = time.time() + 120
    while latest_name(run) != "step_00000010" and time.time() < deadline:  # published a stop check or two later
        time.sleep(0.02)
    kill_group(proc, signal.SIGKILL)
    proc.wait()
    seen = max(losses(run))
    assert 10 < seen < 20, seen  # killed between the checkpoints at steps 10 and 20
    assert latest_name(run) == "step_00000010"
    proc = train(run, stories_data, *ASYNC)
    assert "resumed at step 10" in proc.stdout, proc.stdout
    assert final(run)["status"] == "completed" and sorted(losses(run)) == list(range(1, 31))
    assert_same_run(reference, run)  # bitwise the run whose checkpoints were written in the foreground


def test_sigterm_while_an_async_checkpoint_is_in_flight(tmp_path, stories_data, reference):
    """With the stop check every 10 steps, the save started at step 10 is published at step 20, where the
    SIGTERM sent at step 13 is also seen: the save of step 20 is published before the run exits 75."""
    run = tmp_path / "term"
    args = [*RESUME, "train.ckpt_async=true"]
    proc = start(run, stories_data, *args)
    seen = wait_for_step(run, 13, proc)
    in_flight = sorted(p.name for p in (run / "checkpoints").iterdir())
    kill_group(proc, signal.SIGTERM)
    assert seen < 20 and in_flight == [".rrtrain-key", ".tmp_step_00000010"]  # started, not published: no `latest` yet
    assert proc.wait(timeout=120) == 75
    fin = final(run)
    assert fin["status"] == "preempted" and fin["signal"] == "SIGTERM" and fin["step"] == 20
    assert latest_name(run) == "step_00000020"
    root = run / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == [".rrtrain-key", "latest", "step_00000010", "step_00000020"]
    for name in ("step_00000010", "step_00000020"):
        assert file_problems(root / name, json.loads((root / name / TRAIN_STATE).read_text())["files"], 0, 1) == []
    ckpts = checkpoint_records(run)
    assert sorted(ckpts) == [10, 20]  # step 20 was not saved a second time at the end
    assert ckpts[10]["published_at"] == 20 and ckpts[20]["published_at"] == 20
    # the loop trained on while the save of step 10 was in flight: steps 11..20 were logged before its publication
    assert line_index(run, lambda r: r.get("step") == 20 and "loss" in r) < \
        line_index(run, lambda r: r.get("kind") == "checkpoint")
    proc = train(run, stories_data, *args)
    assert "resumed at step 20" in proc.stdout, proc.stdout
    assert [r["step"] for r in records(run) if "loss" in r] == list(range(1, 31))  # every step exactly once
    assert final(run)["status"] == "completed"
    assert_same_run(reference, run)


def test_latest_only_names_complete_checkpoints_while_async_saves_are_in_flight(tmp_path, stories_data):
    """A watcher polls `latest` during a run that checkpoints every 2 steps in the background: every checkpoint
    it ever names verifies against its checksums, and each was published after the loop had moved on."""
    run = tmp_path / "watched"
    args = ["train.max_steps=16", "train.log_every=1", "train.eval_every=0", "train.ckpt_every=2",
            "train.global_batch=8", "train.micro_batch=4", "train.keep_ckpts=100", "train.ckpt_async=true",
            "train.stop_check_every=1"]
    verified: dict[str, list[str]] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            name = latest_name(run)
            if name and name not in verified:
                path = run / "checkpoints" / name
                verified[name] = file_problems(path, json.loads((path / TRAIN_STATE).read_text())["files"], 0, 1)
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        train(run, stories_data, *args)
    finally:
        done.set()
        watcher.join()
    assert len(verified) >= 3 and all(problems == [] for problems in verified.values()), verified
    ckpts = checkpoint_records(run)
    assert sorted(ckpts) == list(range(2, 17, 2))
    for step, rec in ckpts.items():
        if step < 16:
            assert rec["published_at"] > step, rec  # the loop went on while it was written
            assert line_index(run, lambda r: r.get("step") == step + 1 and "loss" in r) < \
                line_index(run, lambda r: r.get("kind") == "checkpoint" and r["step"] == step)


@pytest.mark.slow
def test_compiled_blocks_give_the_same_losses(tmp_path, stories_data, fast_run):
    """train.compile=true compiles every block with inductor (about a minute on CPU; its no-grad evaluation at
    the end in one graph per block, without a graph break); the losses of FAST match the eager fast_run's to
    round-off (measured 1.2e-7 relative over its 12 steps)."""
    train(tmp_path / "compiled", stories_data, *FAST, "train.compile=true")
    assert len(losses(fast_run)) == 12
    assert max_rel_diff(losses(fast_run), losses(tmp_path / "compiled")) < 1e-5
