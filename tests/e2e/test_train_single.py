"""The trainer in one process, on real synthetic-stories shards: AC, bf16, non-finite handling,
resume refusal, TensorBoard, and exact resume after SIGKILL / SIGTERM."""

from __future__ import annotations

import random
import signal

import pytest
import torch

from trainutil import (checkpoint_tensors, final, kill_group, losses, max_rel_diff, records, start, train,
                       wait_for_step)

FAST = ["train.max_steps=12", "train.log_every=1", "train.eval_every=0", "train.ckpt_every=0",
        "train.global_batch=8", "train.micro_batch=4", "train.warmup_steps=3"]


def test_activation_checkpointing_gives_the_same_losses(tmp_path, stories_data):
    runs = {}
    for ac in ("none", "full", "selective"):
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


def test_gradient_accumulation_matches_one_big_micro_batch(tmp_path, stories_data):
    train(tmp_path / "a", stories_data, *FAST, "train.micro_batch=8")
    train(tmp_path / "b", stories_data, *FAST, "train.micro_batch=2")
    assert max_rel_diff(losses(tmp_path / "a"), losses(tmp_path / "b")) < 1e-5


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


def test_changed_configuration_refuses_to_resume(tmp_path, stories_data):
    run = tmp_path / "run"
    train(run, stories_data, *FAST)
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


def assert_same_run(a, b):
    assert max_rel_diff(losses(a), losses(b)) == 0.0
    pa, pb = checkpoint_tensors(a), checkpoint_tensors(b)
    assert pa.keys() == pb.keys()
    for key in pa:
        assert torch.equal(pa[key], pb[key]), key


def test_exact_resume_after_sigkill(tmp_path, stories_data):
    ref = tmp_path / "ref"
    train(ref, stories_data, *RESUME)
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


def test_sigterm_checkpoints_preempts_and_resumes_once(tmp_path, stories_data):
    ref = tmp_path / "ref"
    train(ref, stories_data, *RESUME)
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


@pytest.mark.slow
def test_compiled_blocks_give_the_same_losses(tmp_path, stories_data):
    """train.compile=true compiles every block with inductor (about a minute on CPU); the losses match eager
    to round-off (measured 8.6e-8 relative)."""
    args = ["train.max_steps=3", "train.log_every=1", "train.eval_every=0", "train.global_batch=4",
            "train.micro_batch=4"]
    train(tmp_path / "eager", stories_data, *args)
    train(tmp_path / "compiled", stories_data, *args, "train.compile=true")
    assert max_rel_diff(losses(tmp_path / "eager"), losses(tmp_path / "compiled")) < 1e-5
