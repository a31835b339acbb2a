"""DeepSpeed ZeRO on CPU (gloo, `DS_ACCELERATOR=cpu`) with 2 ranks against one process.

Every run: the `tiny` preset (review variant) made small (d_model 32, 2 blocks, 2 heads: ZeRO's partitioning,
accumulation, clipping and skipping do not depend on the width; a 2-rank DeepSpeed launch of the preset's width
cost half as much again) on `synthetic:stories`, 20 optimizer steps of 8 sequences x 64 tokens (one process: 4
micro-batches of 2; two ranks: 2 micro-batches of 2 each, so accumulation keeps the global batch), fp32, a NaN
loss injected at step 7 (`train.fail_at_step=7`), per-block gradient norms every 5 steps.

Tolerance: per-step losses agree with the one-process run to a relative difference <= 1e-5. Measured
(2 CPU cores, torch 2.14.1, deepspeed 0.19.8): at most 1.5e-7 for ZeRO-1, -2 and -3, i.e. one or two fp32
ulps of the loss. The runs differ only in summation order (gradients summed over ranks and micro-batches in
another order, AdamW applied to DeepSpeed's flat fp32 partitions instead of per tensor, the clipping norm
summed per partition), which is round-off; anything wrong in the arithmetic (a missing or doubled
micro-batch, a wrong gradient scale, an update that was not discarded, a step count off by one in AdamW's
bias correction) moves the losses by 1e-3 or more. Per-block gradient norms: <= 1e-4.
Resume after SIGKILL is checked bit for bit (a DeepSpeed run against itself).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from distributed.rankutil import kill_ranks, run_ranks, wait_for_step
from trainutil import final, records, start_ranks, train

pytestmark = pytest.mark.distributed

TOL = 1e-5
DIAG_TOL = 1e-4
STEPS, FAULT = 20, 7
COMMON = [
    f"train.max_steps={STEPS}", "train.global_batch=8", "train.micro_batch=2", "train.warmup_steps=2",
    "train.log_every=1", "train.eval_every=0", "train.ckpt_every=0", "train.diag_every=5",
    f"train.fail_at_step={FAULT}", "data.eval_batches=1", "parallel.precision=fp32",
    "train.grad_clip=0.25",  # below the gradient norms of these runs (0.66-1.5): every step is clipped
    "model.d_model=32", "model.n_layers=2", "model.n_heads=2",
]
ZERO = ["parallel.backend=deepspeed"]


def _losses(run_dir: Path) -> dict[int, float]:
    """Training loss per step; a skipped step's non-finite loss (logged as null) becomes NaN."""
    return {r["step"]: (math.nan if r["loss"] is None else r["loss"]) for r in records(run_dir) if "loss" in r}


def _norms(run_dir: Path) -> dict[int, float]:
    return {r["step"]: (math.nan if r["grad_norm"] is None else r["grad_norm"])
            for r in records(run_dir) if "grad_norm" in r}


def _diag(run_dir: Path) -> dict[int, list[float]]:
    return {r["step"]: r["block_grad_norm"] for r in records(run_dir) if r.get("kind") == "diag"}


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), 1e-12)


def _ds_counters(run_dir: Path) -> dict[str, int]:
    """DeepSpeed's own counters as saved in the final checkpoint (every rank's model-states file)."""
    import torch

    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    files = sorted((run_dir / "checkpoints" / latest / "state" / "zero").glob("*model_states.pt"))
    assert files, f"no DeepSpeed model states under {run_dir}"
    seen = set()
    for f in files:
        sd = torch.load(f, map_location="cpu", weights_only=False)
        seen.add((sd["global_steps"], sd["skipped_steps"]))
    assert len(seen) == 1, f"ranks disagree on DeepSpeed's counters: {seen}"
    steps, skipped = seen.pop()
    return {"global_steps": steps, "skipped_steps": skipped}


@pytest.fixture(scope="module")
def baseline(stories_data, tmp_path_factory) -> Path:
    """One process, `parallel.backend=none`, the same global batch (4 micro-batches of 2)."""
    run_dir = tmp_path_factory.mktemp("ds_none") / "run"
    train(run_dir, stories_data, *COMMON, "parallel.backend=none")
    return run_dir


def _check_against_baseline(run_dir: Path, baseline: Path, label: str) -> float:
    """Per-step losses and per-block gradient norms vs the one-process run; the NaN step skipped everywhere."""
    ref, got = _losses(baseline), _losses(run_dir)
    assert sorted(got) == list(range(1, STEPS + 1)), f"steps logged: {sorted(got)}"
    assert math.isnan(ref[FAULT]) and math.isnan(got[FAULT])
    ref_norm, got_norm = _norms(baseline), _norms(run_dir)
    worst = worst_norm = 0.0
    for step in range(1, STEPS + 1):
        if step == FAULT:
            continue
        rel = _rel(ref[step], got[step])
        worst = max(worst, rel)
        assert rel <= TOL, f"step {step}: loss {got[step]!r} vs one process {ref[step]!r} (rel {rel:.2e})"
        rel = _rel(ref_norm[step], got_norm[step])  # the pre-clip global norm clip_grad_norm returns
        worst_norm = max(worst_norm, rel)
        assert rel <= TOL, f"step {step}: grad norm {got_norm[step]!r} vs {ref_norm[step]!r} (rel {rel:.2e})"
        assert ref_norm[step] > 0.25  # clipping was active
    ref_diag, got_diag = _diag(baseline), _diag(run_dir)
    assert sorted(got_diag) == sorted(ref_diag) == [5, 10, 15, 20]
    for step, norms in ref_diag.items():
        for i, (a, b) in enumerate(zip(norms, got_diag[step])):
            assert _rel(a, b) <= DIAG_TOL, f"step {step} block {i}: grad norm {b} vs {a}"
    end = final(run_dir)
    assert end["status"] == "completed" and end["step"] == STEPS and end["world_size"] == 2
    assert end["nonfinite_skipped"] == 1 and "nonfinite_steps" in end["flags"]
    assert _ds_counters(run_dir) == {"global_steps": STEPS, "skipped_steps": 1}
    print(f"\n{label}: max relative difference vs one process over {STEPS} steps: loss {worst:.2e}, "
          f"grad norm {worst_norm:.2e}")
    return worst


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_matches_one_process(stage, stories_data, baseline, tmp_path):
    """ZeRO-1 / ZeRO-2, 2 ranks: same per-step losses as one process; the NaN step is skipped on all ranks,
    counted in final.json, and DeepSpeed's global_steps / skipped_steps stay in line with the loop."""
    run_dir = tmp_path / f"zero{stage}"
    train(run_dir, stories_data, *COMMON, *ZERO, f"parallel.zero_stage={stage}", nproc=2)
    _check_against_baseline(run_dir, baseline, f"ZeRO-{stage}")


def test_zero3_kill_and_resume(stories_data, baseline, tmp_path):
    """ZeRO-3, 2 ranks, checkpoints every 5 steps, SIGKILLed at step 12 (both ranks at once), restarted
    with the same command: it resumes from step 10, the recomputed steps 11..12 are bitwise identical to the
    killed run's, and the finished run matches the
    one-process run step by step (including the NaN skip at step 7, before the checkpoint it resumed from)."""
    run_dir = tmp_path / "zero3"
    args = [*COMMON, *ZERO, "parallel.zero_stage=3", "train.ckpt_every=5"]
    kill_after = 12  # 8 steps and a checkpoint before the run's end: the kill lands before it
    procs = start_ranks(run_dir, stories_data, *args, world=2)  # srun-style, forked: the kill, not the launcher
    try:
        wait_for_step(run_dir, kill_after, procs)
    finally:
        kill_ranks(procs)
    first = _losses(run_dir)
    killed_at = max(first)
    resumed_from = int((run_dir / "checkpoints" / "latest").read_text().strip().split("_")[1])
    assert kill_after <= killed_at < STEPS and resumed_from in (10, 15) and resumed_from < killed_at
    assert not (run_dir / "final.json").exists()
    shutil.copy(run_dir / "metrics.jsonl", tmp_path / "metrics_first.jsonl")

    proc2 = train(run_dir, stories_data, *args, nproc=2)
    assert f"resumed at step {resumed_from}" in proc2.stdout
    second = _losses(run_dir)
    for step in range(resumed_from + 1, killed_at + 1):  # recomputed after the restart: bit for bit the same
        assert second[step] == first[step], f"step {step}: {second[step]!r} after resume vs {first[step]!r}"
    for step in range(1, resumed_from + 1):  # kept from before the checkpoint
        assert second[step] == first[step] or (math.isnan(second[step]) and math.isnan(first[step]))
    _check_against_baseline(run_dir, baseline, "ZeRO-3, killed and resumed")


def test_skip_discards_finite_gradients():
    """`skip()` with finite gradients (the loop's decision, e.g. a non-finite loss), ZeRO-1/2/3 in fp32 and
    ZeRO-1 (DeepSpeed's BF16_Optimizer) / ZeRO-3 in bf16: no weight, moment or AdamW step-count change,
    DeepSpeed's counters advance (global_steps 1, skipped_steps 1, micro_steps = accumulation), and the next
    step is bitwise what an engine that never saw the discarded batch does.
    Also: loading a DeepSpeed checkpoint written by another number of ranks is a UsageError (exit status 2)."""
    proc = run_ranks("tests.distributed.ds_skip_worker", [], 2)  # srun-style ranks, forked
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    assert "written by 3 ranks and this run has 2" in (result["refused"] or ""), result["refused"]
    for label, r in result["engines"].items():
        assert math.isfinite(r["norm"]) and r["norm"] > 0, (label, r)
        assert r["after_skip"] == r["before"], (label, r)
        assert r["counters_after_skip"] == {"global_steps": 1, "skipped_steps": 1, "micro_steps": 2}, (label, r)
        assert r["adam_steps_after_skip"] == [], (label, r)
        assert r["adam_steps_a"] == r["adam_steps_b"] == [1.0], (label, r)
        assert r["a_final"] == r["b_final"] != r["before"], (label, r)
        assert r["counters_final"] == {"global_steps": 2, "skipped_steps": 1, "micro_steps": 4}, (label, r)
