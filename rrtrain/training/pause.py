"""A pause asked from outside the run: `pause.json` in the run directory names an optimizer step; after it the
run saves a checkpoint and ends `paused` (exit 5). A pruned sweep (`launchers.prune.rule`) writes it before it
starts a run, so that each run stops at its next rung and waits there for its group to be ranked.

The pause changes nothing the run computes: the schedule still runs over the run's whole budget, the checkpoint
is the one a `train.ckpt_every` save at that step would write, and no extra evaluation is made. Started again
without a pause (or with a later one) the run continues exactly as if it had never stopped. The step must be
one at which records reach the host and a stop can be agreed (a multiple of `train.stop_check_every`), so
that every callback's saved state covers every step up to it.
"""

from __future__ import annotations

from typing import Optional

from rrtrain.core.errors import UsageError
from rrtrain.rundir import layout
from rrtrain.rundir.outcome import PAUSED
from rrtrain.rundir.readers import Pause, read_pause
from rrtrain.training.loop import Callback, Loop


class PauseAt(Callback):
    """Ends the run `paused`, checkpointed, after the step `pause.json` names (read once, at the start)."""

    name, priority = "pause", 35  # after the evaluation and checkpoint cadences of that step, before the stop check

    def __init__(self, stop_check_every: int) -> None:
        self.every = stop_check_every
        self.pause: Optional[Pause] = None

    def on_start(self, loop: Loop) -> None:
        problems: list[str] = []
        pause = read_pause(loop.facts.run_dir, problems)
        if problems:
            raise UsageError(f"{loop.facts.run_dir / layout.PAUSE}: {problems[0]}")
        if pause is None or pause.step <= loop.step or pause.step >= loop.total_steps:
            return  # none, already behind the run (a stale request), or at its end: train on
        if pause.step % self.every:
            raise UsageError(f"{layout.PAUSE}: step {pause.step} is not a multiple of train.stop_check_every="
                             f"{self.every} (the steps at which a run can stop with every record delivered)")
        self.pause = pause

    def on_step_end(self, loop: Loop) -> None:
        if self.pause is None or loop.step != self.pause.step:
            return
        loop.save_checkpoint()  # collective; a save of this step already made (ckpt_every) is not repeated
        why = f"paused after step {loop.step}" + (f" ({self.pause.reason})" if self.pause.reason else "")
        loop.request_stop(PAUSED, why, checkpoint=False)  # checkpointed above; no end-of-run evaluation
