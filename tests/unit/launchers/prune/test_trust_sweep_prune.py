"""Pruning ranks the runs by their own metrics: values written into `SWEEP_DIR/prune.json` (by anyone who can
write the sweep directory) never override what each run's metrics.jsonl says."""

from __future__ import annotations

import json

from launchers.prune import rungs as prune_sweep
from launchers.sweep.spec import PruneSpec
from unit.launchers.prune.test_prune import run, write_metrics


def test_forged_values_in_prune_json_never_rank_the_runs(tmp_path):
    runs = [run("good", tmp_path / "good", lr=1e-3), run("bad", tmp_path / "bad", lr=1e-2)]
    for r, loss in ((runs[0], 2.0), (runs[1], 5.0)):  # each paused at its rung, step 10, with its val_loss
        write_metrics(r.dir, [{"step": 10, "val_loss": loss}])
        (r.dir / "final.json").write_text(json.dumps({"status": "paused", "step": 10}))
    p = PruneSpec(rungs=[10], keep=0.5)
    key = f"|val_loss|{prune_sweep.smooth(p)}|10"
    (tmp_path / prune_sweep.STATE).write_text(json.dumps({"values": {"good" + key: 9.0, "bad" + key: 0.1}}))
    result = prune_sweep.carry_out(tmp_path, p, runs, {})
    assert list(result.prune) == ["bad"] and "good" in result.go
    [decision] = result.decisions
    assert {r.point: r.value for r in decision.ranking} == {"train.lr=0.001": 2.0, "train.lr=0.01": 5.0}
    saved = json.loads((tmp_path / prune_sweep.STATE).read_text())["values"]
    assert saved == {"good" + key: 2.0, "bad" + key: 5.0}  # the record of this pass: the runs' own values
