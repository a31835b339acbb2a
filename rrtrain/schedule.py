"""Learning-rate schedules (`train.schedule`), each after the same linear warmup, and the checks of their settings.

Step `s` is the 0-based optimizer step (the one logged as step s + 1), `T` the run's total steps, `W` its warmup
steps, `lr` the peak (`train.lr`) and `m` its floor ratio (`train.min_lr_ratio`):

- warmup, every schedule: `lr * (s + 1) / W` for `s < W`; afterwards, with `p = (s - W) / (T - W)` clipped to 1,
- `cosine` (the default): `lr * (m + (1 - m) * (1 + cos(pi * p)) / 2)`;
- `linear`: `lr * (m + (1 - m) * (1 - p))`;
- `constant`: `lr` (`m` unused);
- `wsd` (warmup-stable-decay; Hägele et al., arXiv 2405.18392): `lr` until the decay, which takes the last `D`
  steps of the run: `D = train.decay_steps`, else `round(train.decay_fraction * T)` (0.2 unless set), at most
  `T - W`. From its start `S = T - D`, with `q = (s - S + 1) / D`: `lr * (m + (1 - m) * f(q))`, where
  `f(q)` is `1 - q` (`decay_shape: linear`, the default), `(1 + cos(pi * q)) / 2` (`cosine`) or `1 - sqrt(q)`
  (`1-sqrt`, the paper's best): the first decay step is already below `lr`, the run's last step is at `m * lr`.

The decay is anchored to the run's end, not to a step: a run whose budget grows on resume (an extension, allowed
under `wsd` and `constant`: rrtrain.training.continuation) keeps its stable phase going and decays at the end of
the new total. `cosine` and `linear` spread every step's rate over the total, so their totals are fixed.

This module stands on nothing of rrtrain but its errors (the config validates with it; torch-free).
"""

from __future__ import annotations

import math
from typing import Any, Optional

from rrtrain.core.errors import UsageError

SCHEDULES = ("cosine", "wsd", "linear", "constant")
DECAY_SHAPES = ("linear", "cosine", "1-sqrt")
#: the schedules whose total may grow on resume: the rate of a step already taken does not depend on the total
EXTENSIBLE = ("wsd", "constant")
#: `train.decay_fraction` when neither it nor `train.decay_steps` is set (the paper's 20% cooldown)
DEFAULT_DECAY_FRACTION = 0.2
DEFAULT_DECAY_SHAPE = "linear"
#: the settings that apply to `train.schedule=wsd` only
WSD_KEYS = ("decay_shape", "decay_fraction", "decay_steps")


def validate(t: Any) -> None:
    """One-line refusals of a `train` section's schedule and branch settings (called by `rrtrain.config.validate`)."""
    if t.schedule != "wsd":
        stray = [k for k in WSD_KEYS if getattr(t, k) is not None]
        if stray:
            raise UsageError(f"train.{stray[0]} applies to train.schedule=wsd only (got schedule '{t.schedule}')")
    if t.decay_steps is not None and t.decay_fraction is not None:
        raise UsageError("train.decay_steps and train.decay_fraction both set: give one (the decay's length in "
                         "steps, or its share of the run's steps)")
    if t.decay_fraction is not None and not 0.0 <= t.decay_fraction <= 1.0:
        raise UsageError(f"train.decay_fraction must be in [0, 1], got {t.decay_fraction}")
    if t.decay_steps is not None and t.decay_steps < 0:
        raise UsageError(f"train.decay_steps must not be negative, got {t.decay_steps}")
    if t.branch_from is not None:
        parse_branch(t.branch_from)


def parse_branch(spec: str) -> tuple[str, int]:
    """`RUN_DIR@STEP` -> (RUN_DIR, STEP); a one-line UsageError otherwise."""
    run_dir, at, step = spec.rpartition("@")
    if not at or not run_dir.strip() or not step.isdigit() or len(step) > 18 or int(step) < 1:
        raise UsageError(f"train.branch_from: expected RUN_DIR@STEP (a run directory and one of its checkpoint "
                         f"steps, e.g. runs/wsd@2000), got {spec!r}")
    return run_dir, int(step)


def decay_steps(t: Any, total: int, warmup: int) -> int:
    """The length of a `wsd` run's decay: `train.decay_steps`, else its fraction of `total`; at most the steps after
    the warmup."""
    if t.decay_steps is not None:
        length = int(t.decay_steps)
    else:
        fraction = DEFAULT_DECAY_FRACTION if t.decay_fraction is None else float(t.decay_fraction)
        length = round(fraction * total)
    return max(0, min(length, total - warmup))


def decay_start(t: Any, total: int, warmup: int) -> Optional[int]:
    """The first 0-based step whose rate is below the peak after the warmup: the decay's (`wsd`), the warmup's end
    (`cosine`, `linear`: they decay from there; `total` when they never do), None for `constant` (it never decays)."""
    if t.schedule == "constant":
        return None
    if t.schedule == "wsd":
        return total - decay_steps(t, total, warmup)
    return warmup if total > warmup else total


def lr_at(step: int, total: int, warmup: int, t: Any) -> float:
    """The learning rate of the 0-based optimizer step `step` of a run of `total` steps with `warmup` warmup steps
    under the schedule of `t` (a TrainConfig: schedule, lr, min_lr_ratio and the wsd settings). See the module's
    docstring for the formulas."""
    lr, floor = t.lr, t.min_lr_ratio
    if step < warmup:
        return lr * (step + 1) / warmup
    if t.schedule == "constant" or total <= warmup:
        return lr
    if t.schedule == "wsd":
        length = decay_steps(t, total, warmup)
        start = total - length
        if step < start or length == 0:
            return lr
        q = min(1.0, (step - start + 1) / length)
        return lr * (floor + (1.0 - floor) * _shape(t.decay_shape or DEFAULT_DECAY_SHAPE, q))
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if t.schedule == "linear":
        return lr * (floor + (1.0 - floor) * (1.0 - progress))
    return lr * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))  # cosine


def extension_refusal(before: Any, after: Any, old_total: int, new_total: int, warmup: int, step: int) -> Optional[str]:
    """Why a resume at `step` (steps taken) may not take a run of `old_total` steps on `before`'s schedule to
    `new_total` steps on `after`'s without the user's consent; None when it may: the schedule is one whose
    total may grow (EXTENSIBLE), it grows, and no step taken, nor the next, has another rate under the new
    total (`wsd`: the checkpoint is not yet in its decay). A change of the schedule's own settings is the
    resume check's to judge (consent), not this."""
    if after.schedule not in EXTENSIBLE:
        return (f"under train.schedule={after.schedule} every step's learning rate depends on the run's total, so "
                f"the {step} steps taken belong to a run of {old_total}")
    if new_total < old_total:
        return f"a run's length may grow on resume, not shrink ({old_total} -> {new_total} steps)"
    if after.schedule == "wsd":
        starts = [decay_start(after, new_total, warmup)]
        if getattr(before, "schedule", None) == "wsd":
            starts.append(decay_start(before, old_total, warmup))
        start = min(s for s in starts if s is not None)
        if step > start:
            return (f"the checkpoint (step {step}) is already in its decay, which began after step {start}: "
                    "extending it would raise the learning rate back to train.lr")
    return None


def _shape(name: str, q: float) -> float:
    """The decay's shape: 1 at its start (q = 0), 0 at its end (q = 1)."""
    if name == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * q))
    if name == "1-sqrt":
        return 1.0 - math.sqrt(q)
    return 1.0 - q
