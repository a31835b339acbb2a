"""Learning-rate schedules (rrtrain.schedule) against their formulas, their settings' one-line refusals, and the
rules of a run that goes on from a checkpoint under them (rrtrain.training.continuation): extension on resume,
a branch's own schedule. In process, no training: the runs that train are tests/e2e/test_schedules.py."""

from __future__ import annotations

import math

import pytest

from rrtrain import schedule
from rrtrain.config import Config, TrainConfig, load_config
from rrtrain.core.errors import UsageError
from rrtrain.training import optim
from rrtrain.training.continuation import check_branch, continue_from

SEQ = 64  # seq_len: a step is global_batch (8) x 64 tokens


def train(**kw) -> TrainConfig:
    return TrainConfig(**{"lr": 1.0, "min_lr_ratio": 0.1, **kw})


@pytest.mark.parametrize("shape, f", [("linear", lambda q: 1 - q), ("cosine", lambda q: (1 + math.cos(math.pi * q)) / 2),
                                      ("1-sqrt", lambda q: 1 - math.sqrt(q))])
def test_wsd_follows_its_formula(shape, f):
    """Warmup 10, stable at lr, then the last 20 of 100 steps decay from lr to min_lr_ratio * lr (Hägele et al.)."""
    t = train(schedule="wsd", decay_steps=20, decay_shape=shape)
    lrs = [schedule.lr_at(s, 100, 10, t) for s in range(100)]
    assert lrs[:10] == [(s + 1) / 10 for s in range(10)]
    assert lrs[10:80] == [1.0] * 70  # stable
    for s in range(80, 100):
        assert lrs[s] == pytest.approx(0.1 + 0.9 * f((s - 80 + 1) / 20), abs=1e-15)
    assert lrs[99] == pytest.approx(0.1) and all(a >= b for a, b in zip(lrs[10:], lrs[11:]))


def test_wsd_decay_length_from_its_fraction_and_its_default():
    assert schedule.decay_steps(train(schedule="wsd"), 100, 10) == 20  # 0.2 unless set
    assert schedule.decay_steps(train(schedule="wsd", decay_fraction=0.1), 1000, 10) == 100
    assert schedule.decay_steps(train(schedule="wsd", decay_steps=500), 100, 10) == 90  # at most the steps after warmup
    t = train(schedule="wsd", decay_fraction=0.0)
    assert [schedule.lr_at(s, 50, 5, t) for s in range(5, 50)] == [1.0] * 45  # no decay: constant
    assert schedule.decay_start(train(schedule="wsd", decay_steps=20), 100, 10) == 80


def test_linear_constant_and_the_default_cosine():
    lin = [schedule.lr_at(s, 110, 10, train(schedule="linear")) for s in range(10, 110)]
    assert lin == pytest.approx([0.1 + 0.9 * (1 - s / 100) for s in range(100)], abs=1e-15)
    assert [schedule.lr_at(s, 110, 10, train(schedule="constant")) for s in range(10, 110)] == [1.0] * 100
    for total, warmup in ((100, 10), (7, 3), (5, 5), (3, 8)):  # cosine: the old function's values, bit for bit
        for s in range(total + 2):
            assert schedule.lr_at(s, total, warmup, train()) == optim.lr_at(s, total, 1.0, warmup, 0.1)


@pytest.mark.parametrize("overrides, message", [
    (["train.decay_steps=5"], "train.decay_steps applies to train.schedule=wsd only"),
    (["train.schedule=linear", "train.decay_shape=cosine"], "train.decay_shape applies to train.schedule=wsd only"),
    (["train.schedule=wsd", "train.decay_steps=5", "train.decay_fraction=0.1"], "both set: give one"),
    (["train.schedule=wsd", "train.decay_fraction=1.5"], "train.decay_fraction must be in [0, 1], got 1.5"),
    (["train.schedule=wsd", "train.decay_steps=-1"], "train.decay_steps must not be negative"),
    (["train.schedule=wsd", "train.decay_shape=sqrt"], "train.decay_shape: expected one of 'linear', 'cosine', '1-sqrt'"),
    (["train.schedule=step"], "train.schedule: expected one of 'cosine', 'wsd', 'linear', 'constant'"),
    (["train.branch_from=runs/a"], "train.branch_from: expected RUN_DIR@STEP"),
    (["train.branch_from=runs/a@x"], "train.branch_from: expected RUN_DIR@STEP"),
    (["train.branch_from=@5"], "train.branch_from: expected RUN_DIR@STEP"),
])
def test_bad_schedule_settings_are_one_line(overrides, message):
    with pytest.raises(UsageError) as err:
        load_config(None, overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


def cfg(**train_kw) -> Config:
    return load_config(None, [f"train.{k}={v}" for k, v in {"global_batch": 8, **train_kw}.items()])


def state(step: int, saved: Config) -> dict:
    return {"step": step, "world_size": 1, "config": saved.to_dict()}


def resume(step: int, saved: Config, current: Config) -> tuple[Config, list[str]]:
    return continue_from(state(step, saved), saved.to_dict(), current, SEQ, 1, None)


def test_a_wsd_or_constant_run_extends_on_resume_and_keeps_its_warmup():
    """max_steps grows without consent while the checkpoint is before the decay; the default warmup (5% of the
    old total) is kept, so no step taken had another rate, and the decay moves to the new end."""
    saved = cfg(schedule="wsd", max_steps=100, decay_steps=20)
    new, accepted = resume(60, saved, cfg(schedule="wsd", max_steps=200, decay_steps=20))
    assert new.train.warmup_steps == 5 and accepted == [
        "train.max_steps: 100 -> 200 (extended from 100 to 200 steps under train.schedule=wsd; its decay now begins "
        "after step 180)"]
    t_old, t_new = saved.train, new.train
    assert [schedule.lr_at(s, 200, 5, t_new) for s in range(61)] == [schedule.lr_at(s, 100, 5, t_old) for s in range(61)]
    new, accepted = resume(100, cfg(schedule="constant", tokens=51200), cfg(schedule="constant", tokens=102400))
    assert new.train.warmup_steps == 5 and "train.tokens: 51200 -> 102400 (extended" in accepted[0]
    again, accepted = resume(150, new, cfg(schedule="constant", tokens=102400))  # the next resume: nothing changed
    assert again.train.warmup_steps == 5 and accepted == []


@pytest.mark.parametrize("saved, step, current, why", [
    (dict(max_steps=100), 50, dict(max_steps=200), "under train.schedule=cosine every step's learning rate depends"),
    (dict(schedule="linear", max_steps=100), 50, dict(schedule="linear", max_steps=200), "train.schedule=linear"),
    (dict(schedule="wsd", max_steps=100, decay_steps=20), 81, dict(schedule="wsd", max_steps=200, decay_steps=20),
     "already in its decay, which began after step 80: extending it would raise the learning rate back"),
    (dict(schedule="constant", max_steps=100), 50, dict(schedule="constant", max_steps=80), "may grow on resume, not shrink"),
])
def test_changing_the_length_is_refused_saying_why_unless_consented(saved, step, current, why):
    with pytest.raises(UsageError) as err:
        resume(step, cfg(**saved), cfg(**current))
    assert why in str(err.value) and "\n" not in str(err.value) and "train.allow_config_change=true" in str(err.value)
    _, accepted = resume(step, cfg(**saved), cfg(**current, allow_config_change=True))
    assert any(a.startswith("train.max_steps:") for a in accepted)


def test_a_checkpoint_from_before_schedules_resumes_as_cosine():
    old = Config().to_dict()
    for key in ("schedule", "decay_shape", "decay_fraction", "decay_steps", "branch_from"):
        del old["train"][key]
    current = cfg(max_steps=100)
    old["train"].update(max_steps=100, global_batch=8)
    assert continue_from({"step": 10, "world_size": 1, "config": old}, old, current, SEQ, 1, None) == (current, [])
    with pytest.raises(UsageError, match="allow_config_change"):  # a schedule change is a change of the trajectory
        continue_from({"step": 10, "world_size": 1, "config": old}, old, cfg(max_steps=100, schedule="wsd"), SEQ, 1,
                      None)


def test_a_branch_sets_its_own_schedule_and_keeps_the_rest():
    parent = cfg(schedule="wsd", max_steps=100).to_dict()
    mine = cfg(schedule="wsd", max_steps=60, decay_steps=10, min_lr_ratio=0.0, branch_from="/runs/p@40").to_dict()
    assert check_branch(parent, mine, 1, 1, False, "/runs/p@40") == []
    with pytest.raises(UsageError, match=r"other settings \(train.lr: 0.0003 -> 0.001\).*allow_config_change"):
        check_branch(parent, cfg(lr=0.001, max_steps=60).to_dict(), 1, 1, False, "/runs/p@40")
    assert check_branch(parent, cfg(lr=0.001).to_dict(), 1, 1, True, "p@40") == ["train.lr: 0.0003 -> 0.001"]
    with pytest.raises(UsageError, match=r"another model, data, seed or backend \(train.seed: 0 -> 1\)"):
        check_branch(parent, cfg(seed=1).to_dict(), 1, 1, True, "p@40")
