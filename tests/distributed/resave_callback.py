"""A training callback for tests/distributed/test_hsdp.py: `train.callbacks=[tests.distributed.resave_callback:SaveOnStart]`
saves a checkpoint of the step the run starts at, before its first step. A branch (`train.branch_from`) has
written no checkpoint of its parent's step, so it writes that state again, as loaded under its own layout (a plain
resume does not: its step is on disk already)."""

from __future__ import annotations

from rrtrain.training.loop import Callback, Loop


class SaveOnStart(Callback):
    name = "save_on_start"

    def on_start(self, loop: Loop) -> None:
        loop.save_checkpoint()  # a collective: every rank's callback calls it
