"""A run ended between attaching its callbacks and making the loop they read: submitit's requeue on a time-limit
warning (`sys.exit(144)` from its signal handler) can land there when the start is slow. The ending must be the
requeue, not the console's `AttributeError` on a loop that does not exist yet (a red CI run: the job then failed
instead of being requeued)."""

from __future__ import annotations

import pytest

from trainutil import TINY


def test_a_requeue_before_the_loop_exists_stays_a_requeue(tmp_path, stories_data, monkeypatch):
    from rrtrain import train
    from rrtrain.resolve import load
    from rrtrain.training import trainer

    def requeued(*args, **kwargs):  # what submitit's handler raises in the main thread
        raise SystemExit(144)

    monkeypatch.setattr(trainer, "MetricsLogger", requeued)  # made between the callbacks and the loop
    cfg = load(TINY, [f"data.path={stories_data}", f"run.dir={tmp_path / 'run'}", "model.size=micro",
                      "train.max_steps=2", "train.compile=false", "train.global_batch=2", "train.micro_batch=2",
                      "data.eval_batches=1"])
    with pytest.raises(SystemExit) as ended:
        train.run(cfg)
    assert ended.value.code == 144
