"""How a run ended: the one place that decides a run's status, its reason and its exit code.

The trainer knows how its loop stopped (completed, failed, diverged, stalled, or preempted: stopped by a
signal at a step boundary); `rrtrain sweep --cancel-flagged` writes `cancelled.json` before it signals the run.
`decide` joins the two, so a cancelled run's final.json says `stalled` (or `diverged`) and why when the run
writes it. `rrtrain status` asks the same function about a cancelled run that could not write (killed hard).
`keeps_recorded` says when final.json's recorded ending stands against a new attempt's: nothing already
written is lost to a resume refused for bad input, nor a finished result to a later failure.

Successive halving (`launchers.prune.rule`) adds two endings that are not for good: `paused`, a run that stopped
after the step its `pause.json` named (checkpointed, its schedule untouched), and `pruned`, a paused run its
sweep stopped at that rung as one of its group's worst (`pruned`, the one change made to a final.json after
the run wrote it). Both resume, exactly, when their sweep submits them again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from rrtrain.rundir.readers import Cancelled

EXIT_CODES = {"completed": 0, "failed": 1, "diverged": 3, "stalled": 4, "paused": 5, "preempted": 75}
#: a run's pause at the step its pause.json named, and the status its sweep then gives the worst of a rung
PAUSED, PRUNED = "paused", "pruned"
#: endings a resubmission leaves alone, and that a cancellation marker does not change
ENDED_FOR_GOOD = ("completed", "diverged", "stalled")
#: the flag a cancelled run carries (final.json `flags`, `rrtrain status`)
CANCELLED = "cancelled"


@dataclass(frozen=True)
class Outcome:
    status: str
    reason: str
    cancelled: Optional[Cancelled] = None  # the cancellation that decided it, if one did

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.status, EXIT_CODES["failed"])


def cancelled_status(marker: Cancelled) -> str:
    """The state a cancelled run ends in: diverged when that was a reason, else stalled."""
    return "diverged" if "diverged" in marker.flags else "stalled"


def decide(status: str, reason: str, marker: Optional[Cancelled]) -> Outcome:
    """The run's ending from how it stopped (`status`, `reason`) and its cancellation, if any. A cancellation
    turns any ending that is not for good (preempted by the cancel's own signal, failed while stopping, or no
    word at all) into what the run was flagged; a run that completed, stalled or diverged by itself keeps it."""
    if marker is None or status in ENDED_FOR_GOOD:
        return Outcome(status, reason)
    why = f"cancelled as flagged ({marker.reason or 'no reason recorded'})" + (f"; {reason}" if reason else "")
    return Outcome(cancelled_status(marker), why, marker)


def keeps_recorded(recorded: Optional[str], status: str, training_started: bool) -> bool:
    """Whether the ending final.json already records (`recorded`, None when there is none) stands, and this
    attempt's ending (`status`, as `decide` settled it) is not written: a failure before training started (a
    bad or changed config on resume, an unusable checkpoint) never replaces a recorded ending, and an ending
    for good (completed, stalled, diverged) is never replaced by a later failure."""
    if recorded is None or status != "failed":
        return False
    return not training_started or recorded in ENDED_FOR_GOOD


def pruned(final: dict[str, Any], rung: dict[str, Any]) -> dict[str, Any]:
    """The final.json of a paused run its sweep prunes: status `pruned`, the reason saying at which rung and why
    (`rung["why"]`), the rung's record under `pruned`, every other field as the run wrote it."""
    out = dict(final)
    out["status"] = PRUNED
    out["reason"] = f"pruned at {rung.get('why', 'a rung of the sweep')}" + (
        f"; {final['reason']}" if final.get("reason") else "")
    out["pruned"] = dict(rung)
    return out
