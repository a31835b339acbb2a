"""The convergence monitor inside a real training run: a run that learns nothing is flagged as stalled and
stopped (exit status, checkpoint, console, TensorBoard, final.json); a resumed run keeps its windows.

The run learns nothing by construction: a learning rate of 1e-7 leaves the model where it started, its loss at
the uniform guess, far above the unigram entropy, so the plateau test holds from the first step it may look
(`monitor.min_steps`) and the flag's step follows from the settings alone. What a stall looks like in training
that does move, the convex gate on its plateau (docs/depth.md), is asserted by the depth study at 20 sublayers
(tests/unit/rrtrain/planning/test_depth_study.py), and at the demo's 40 sublayers by tests/benchmarks/bench_demo.py."""

from __future__ import annotations

import json
import shutil

import pytest

from trainutil import final, records, train

WINDOW, MIN_STEPS = 10, 20
FLAT = ["model.size=micro", "train.global_batch=8", "train.micro_batch=8", "train.lr=1e-7", "train.warmup_steps=2",
        "train.max_steps=60", "train.log_every=10", "train.eval_every=0", "train.ckpt_every=0",
        f"monitor.min_steps={MIN_STEPS}", f"monitor.window={WINDOW}"]


def flags(run) -> dict[str, int]:
    return {r["flag"]: r["step"] for r in records(run) if r.get("kind") == "flag"}


#: a checkpoint inside the plateau, less than a window before the flag (at MIN_STEPS)
CUT = 15
STALLING = [*FLAT, "monitor.on_stall=stop", f"train.ckpt_every={CUT}"]


@pytest.fixture(scope="module")
def stalled_run(tmp_path_factory, stories_data):
    run = tmp_path_factory.mktemp("stalled") / "run"
    return run, train(run, stories_data, *STALLING, expect=4)


def test_a_run_that_learns_nothing_is_flagged_stalled_and_stopped(stories_data, stalled_run):
    run, proc = stalled_run
    fin = final(run)
    assert fin["status"] == "stalled" and fin["exit_code"] == 4 and "stalled" in fin["flags"], fin
    assert fin["flag_steps"]["stalled"] == fin["step"] == flags(run)["stalled"] == MIN_STEPS
    assert "FLAG stalled at step" in proc.stdout and "rrtrain: stalled" in proc.stdout
    assert (run / "checkpoints" / "latest").read_text().strip() == f"step_{fin['step']:08d}"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("monitor/stalled")] == [(fin["step"], 1.0)]
    assert any(tag.startswith("monitor/flags") for tag in acc.Tags()["tensors"]), acc.Tags()
    manifest = json.loads((stories_data / "manifest.json").read_text())
    losses = [r["loss"] for r in records(run) if "loss" in r]
    print(f"unigram entropy {manifest['unigram_entropy']:.3f}; stalled at step {fin['step']}; last loss "
          f"{losses[-1]:.3f}")


def test_a_resumed_run_keeps_its_monitor_windows(tmp_path, stories_data, stalled_run):
    """Resumed from a checkpoint written after the plateau began and before the flag, the run raises the stall at
    the same step as the uninterrupted run: its windows came back from the checkpoint and did not restart at zero.
    The run resumed is the uninterrupted one as a kill after its checkpoint at step CUT would have left it (the
    stall's checkpoint and final.json gone, `latest` at CUT): it trains again only the steps after CUT."""
    ref = stalled_run[0]
    at = flags(ref)["stalled"]
    assert at - WINDOW < CUT < at, (CUT, at)  # less than a window before the flag
    run = tmp_path / "run"
    shutil.copytree(ref, run, symlinks=True)
    (run / "final.json").unlink()
    shutil.rmtree(run / "checkpoints" / f"step_{at:08d}")
    (run / "checkpoints" / "latest").write_text(f"step_{CUT:08d}\n")
    proc = train(run, stories_data, *STALLING, expect=4)
    assert f"resumed at step {CUT}" in proc.stdout, proc.stdout
    assert flags(run) == flags(ref) and final(run)["flag_steps"] == final(ref)["flag_steps"]
    assert [r["step"] for r in records(run) if "loss" in r] == list(range(1, at + 1))
