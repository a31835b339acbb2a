"""A run directory is found by its metrics.jsonl (`rrtrain.rundir.layout.run_dirs`), and whoever finds it reads
config.yaml to tell which run it is: the dashboard named a run that it found in between `unknown/RUN/seedx`, for
good. The trainer writes config.yaml first."""

from __future__ import annotations

import rrtrain.training.trainer as trainer_module
from trainutil import TINY


def test_config_yaml_is_written_before_metrics_jsonl_appears(tmp_path, stories_data, monkeypatch):
    from rrtrain.resolve import load
    from rrtrain.train import run

    seen = []
    real = trainer_module.MetricsLogger

    def logger(run_dir, *args, **kwargs):
        seen.append(((run_dir / "config.yaml").is_file(), (run_dir / "metrics.jsonl").exists()))
        return real(run_dir, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "MetricsLogger", logger)
    run_dir = tmp_path / "run"
    cfg = load(TINY, [f"data.path={stories_data}", f"run.dir={run_dir}", "train.max_steps=2", "train.eval_every=0",
                      "train.ckpt_every=0", "train.log_every=1"])
    assert run(cfg) == 0
    assert seen == [(True, False)]
