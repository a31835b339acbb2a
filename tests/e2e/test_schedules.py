"""The learning-rate schedules in real runs: exact resume under each new schedule, a budget that grows on resume
(wsd, constant), cooldown branches (`train.branch_from`) that continue their parent bit for bit, and the one-line
refusals of a branch, which write nothing. One parent run is shared; every run is 8 steps or fewer.
The schedules' formulas and the rules' every case are tests/unit/rrtrain/training/test_schedule.py's."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rrtrain.rundir.writers import write_pause
from trainutil import final, losses, train

pytestmark = pytest.mark.slow

# 8 steps of 8 sequences, checkpoints at 4 and 8; a stop can be agreed at step 4 (a pause there)
BASE = ["train.max_steps=8", "train.log_every=1", "train.eval_every=0", "train.ckpt_every=4", "train.keep_ckpts=3",
        "train.global_batch=8", "train.micro_batch=4", "train.warmup_steps=2", "train.stop_check_every=4",
        "model.n_layers=2"]
WSD = ["train.schedule=wsd", "train.decay_steps=2"]  # stable to step 6, the decay over steps 7 and 8


@pytest.fixture(scope="module")
def parent(tmp_path_factory, stories_data) -> Path:
    """The uninterrupted 8-step wsd run, with checkpoints at steps 4 and 8."""
    run = tmp_path_factory.mktemp("parent") / "wsd"
    train(run, stories_data, *BASE, *WSD)
    return run


@pytest.mark.parametrize("sched", ["wsd", "constant", "linear"])
def test_exact_resume_and_extension(tmp_path, stories_data, parent, sched):
    """Paused at step 4 and started again, a run gives the uninterrupted run's losses bit for bit; under wsd and
    constant the first leg is a 6-step run whose budget grows to 8 on resume, accepted without consent."""
    own = WSD if sched == "wsd" else [f"train.schedule={sched}"]
    if sched == "wsd":
        straight = parent
    else:
        straight = tmp_path / "straight"
        train(straight, stories_data, *BASE, *own)
    run = tmp_path / "paused"
    write_pause(run, 4, "test")
    first = ["train.max_steps=6"] if sched != "linear" else []
    proc = train(run, stories_data, *BASE, *own, *first, expect=5)
    assert final(run)["status"] == "paused" and max(losses(run)) == 4
    proc = train(run, stories_data, *BASE, *own)
    if first:
        assert "train.max_steps: 6 -> 8 (extended from 6 to 8 steps" in proc.stdout, proc.stdout
    assert final(run)["status"] == "completed" and losses(run) == losses(straight)
    if sched == "wsd":  # its checkpoint at step 8 is in the decay: growing it again would re-warm it
        proc = train(run, stories_data, *BASE, *own, "train.max_steps=10", expect=2)
        assert "already in its decay" in proc.stderr and proc.stderr.count("\n") == 1


def test_a_branch_continues_its_parent_exactly_and_its_own_decay_differs(tmp_path, stories_data, parent):
    same = tmp_path / "same"
    proc = train(same, stories_data, *BASE, *WSD, f"train.branch_from={parent}@4")
    assert f"branching from {parent}@4" in proc.stdout and "(as in the parent)" in proc.stdout
    mine, theirs = losses(same), losses(parent)
    assert sorted(mine) == [5, 6, 7, 8] and all(mine[s] == theirs[s] for s in mine)  # bit for bit
    recorded = yaml.safe_load((same / "config.yaml").read_text())
    assert recorded["train"]["branch_from"] == f"{parent}@4" and final(same)["tokens"] == final(parent)["tokens"]
    early = tmp_path / "early"  # a 6-step branch: its decay is steps 5 and 6
    train(early, stories_data, *BASE, *WSD, "train.max_steps=6", f"train.branch_from={parent}@4")
    mine = losses(early)
    assert sorted(mine) == [5, 6] and mine[5] == theirs[5] and mine[6] != theirs[6]


def test_branch_refusals_are_one_line_and_write_nothing(tmp_path, stories_data, parent):
    run = tmp_path / "branch"
    for where, overrides, message in [
        (tmp_path / "nowhere@4", [], "is not a run directory (no such directory)"),
        (f"{parent}@6", [], f"{parent} has no checkpoint at step 6 (its checkpoints: 4, 8)"),
        (f"{parent}@4", ["model.n_layers=3"], "holds a model of another shape (n_layers: 2 there, 3 here)"),
    ]:
        proc = train(run, stories_data, *BASE, *WSD, f"train.branch_from={where}", *overrides, expect=2)
        assert message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
        assert not run.exists()
