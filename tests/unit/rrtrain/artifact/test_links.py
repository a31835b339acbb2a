"""A link the user made at `checkpoints/` (to scratch space) is followed by what reads a run's model as training
follows it: `rrtrain eval`, `rrtrain export` and a warm start list the checkpoints through it, the manager resolves
it once and refuses a place someone else could change, and a link below it is no checkpoint (docs/reliability.md,
"Where rrtrain follows a link"). No model is built: directories only, well under a second. A real run moved behind
a link loads, exports and evaluates as before: tests/unit/rrtrain/export/test_export_hf.py (slow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rrtrain.artifact import checkpoint_steps, model_steps
from rrtrain.artifact.run import choose_checkpoint
from rrtrain.artifact.warm import prepare
from rrtrain.config import Config, load_config
from rrtrain.core.errors import UsageError


def linked_run(tmp_path: Path) -> tuple[Path, Path]:
    """A run whose checkpoints/ links to scratch, which holds step 2 and a link named like step 5."""
    run, scratch = tmp_path / "run", tmp_path / "scratch"
    run.mkdir()
    scratch.mkdir(mode=0o700)
    (scratch / "step_00000002").mkdir()
    (tmp_path / "elsewhere" / "step_00000005").mkdir(parents=True)
    (scratch / "step_00000005").symlink_to(tmp_path / "elsewhere" / "step_00000005")
    (run / "checkpoints").symlink_to(scratch)
    return run, scratch


def test_checkpoints_are_listed_through_the_users_link_and_not_through_a_link_below_it(tmp_path):
    run, scratch = linked_run(tmp_path)
    assert checkpoint_steps(run) == [2] and model_steps(run) == [2]
    with pytest.raises(UsageError, match=f"no usable checkpoint in {scratch}"):  # read there: step 2 is empty
        choose_checkpoint(run, Config(), None)
    with pytest.raises(UsageError, match=r"has no checkpoint at step 5 \(checkpoints: 2\)"):
        choose_checkpoint(run, Config(), 5)


def test_a_linked_place_others_can_write_is_refused_as_training_refuses_it(tmp_path):
    run, scratch = linked_run(tmp_path)
    scratch.chmod(0o770)
    with pytest.raises(UsageError, match="scratch' can be written by its group") as refused:
        choose_checkpoint(run, Config(), None)
    assert "\n" not in str(refused.value)


def test_a_run_resuming_through_its_link_reads_no_warm_start(tmp_path):
    """init.from is for a fresh run: with checkpoints behind the link the run resumes, and the source (here
    missing) is not even read."""
    run, _ = linked_run(tmp_path)
    cfg = load_config(None, [f"run.dir={run}", f"init.from={tmp_path / 'no-such-run'}"])
    assert prepare(cfg) is None
