"""The convergence monitor inside a real training run: at 40 sublayers on the synthetic stories the convex gate
stalls at the unigram entropy, is flagged and stopped (exit status, checkpoint, console, TensorBoard, final.json);
a resumed run keeps its windows.

The curves behind the thresholds are in docs/depth.md ("The convex gate at 40 sublayers"). Here the plateau test
looks at a 25-step window from step 50 over 100 steps: the convex run is flagged at step 84 (0.6% improvement
over the window); the additive run (`review`) under the same settings improves by 3% or more over every window
to its end, and is never flagged (measured when these settings were chosen). That the additive gate at 40
sublayers is not flagged where the convex one is, the monitor inside each `rrtrain train` of a sweep, is
asserted by `rrtrain demo` end to end (tests/e2e/test_demo.py): it is not trained again here."""

from __future__ import annotations

import json
import shutil

import pytest

from trainutil import final, records, train

WINDOW = 25
DEEP = ["model.n_layers=20", "train.global_batch=8", "train.micro_batch=8", "train.lr=0.001", "train.warmup_steps=15",
        "train.max_steps=100", "train.log_every=25", "train.eval_every=0", "train.ckpt_every=0",
        "monitor.min_steps=50", f"monitor.window={WINDOW}"]


def flags(run) -> dict[str, int]:
    return {r["flag"]: r["step"] for r in records(run) if r.get("kind") == "flag"}


#: a checkpoint inside the plateau, less than a window before the flag (step 84 when measured)
CUT = 70
CONVEX = [*DEEP, "model.variant=review_convex", "monitor.on_stall=stop", f"train.ckpt_every={CUT}"]


@pytest.fixture(scope="module")
def convex_run(tmp_path_factory, stories_data):
    run = tmp_path_factory.mktemp("convex") / "run"
    return run, train(run, stories_data, *CONVEX, expect=4)


def test_convex_gate_stalls_at_40_sublayers_and_is_stopped(stories_data, convex_run):
    convex, proc = convex_run
    fin = final(convex)
    assert fin["status"] == "stalled" and fin["exit_code"] == 4 and "stalled" in fin["flags"], fin
    assert fin["flag_steps"]["stalled"] == fin["step"] == flags(convex)["stalled"]
    assert "FLAG stalled at step" in proc.stdout and "rrtrain: stalled" in proc.stdout
    assert (convex / "checkpoints" / "latest").read_text().strip() == f"step_{fin['step']:08d}"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(convex / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("monitor/stalled")] == [(fin["step"], 1.0)]
    assert any(tag.startswith("monitor/flags") for tag in acc.Tags()["tensors"]), acc.Tags()
    manifest = json.loads((stories_data / "manifest.json").read_text())
    convex_loss = [r["loss"] for r in records(convex) if "loss" in r]
    print(f"unigram entropy {manifest['unigram_entropy']:.3f}; stalled at step {fin['step']}; last loss "
          f"{convex_loss[-1]:.3f}")


def test_a_resumed_run_keeps_its_monitor_windows(tmp_path, stories_data, convex_run):
    """Resumed from a checkpoint written after the plateau began and before the flag, the run raises the stall at
    the same step as the uninterrupted run: its windows came back from the checkpoint and did not restart at zero.
    The run resumed is the uninterrupted one as a kill after its checkpoint at step CUT would have left it (the
    stall's checkpoint and final.json gone, `latest` at CUT): it trains again only the steps after CUT."""
    ref = convex_run[0]
    at = flags(ref)["stalled"]
    assert at - WINDOW < CUT < at, (CUT, at)  # less than a window before the flag
    run = tmp_path / "run"
    shutil.copytree(ref, run, symlinks=True)
    (run / "final.json").unlink()
    shutil.rmtree(run / "checkpoints" / f"step_{at:08d}")
    (run / "checkpoints" / "latest").write_text(f"step_{CUT:08d}\n")
    proc = train(run, stories_data, *CONVEX, expect=4)
    assert f"resumed at step {CUT}" in proc.stdout, proc.stdout
    assert flags(run) == flags(ref) and final(run)["flag_steps"] == final(ref)["flag_steps"]
    assert [r["step"] for r in records(run) if "loss" in r] == list(range(1, at + 1))
