"""Finding and reading runs: any depth, partial and corrupt files, re-logged steps, run categories."""

from __future__ import annotations

import json
import math

from rrtrain.report.collect import find_runs, read_metrics


def write_final(d, **kw):
    d.mkdir(parents=True, exist_ok=True)
    final = {"status": "completed", "step": 100, "tokens": 1000, "final_val_loss": 2.0, "best_val_loss": 2.0,
             "params": 1e6, "variant": "review", "size": "tiny", "seed": 0, "wall_s": 1.0, "flags": []}
    final.update(kw)
    (d / "final.json").write_text(json.dumps(final))


def test_metrics_keep_last_of_relogged_steps_and_skip_junk(tmp_path):
    p = tmp_path / "metrics.jsonl"
    lines = [
        {"step": 1, "loss": 5.0, "lr": 1e-3},
        {"step": 2, "loss": 4.0},
        {"step": 2, "val_loss": 4.5, "tokens": 10},
        {"step": 3, "loss": 3.0},
        {"kind": "diag", "step": 3, "loss": 99.0},  # other kinds are ignored, even with a "loss"
        # crash; resumed from the checkpoint at step 1: steps 2..3 are logged again
        {"step": 2, "loss": 4.1},
        {"step": 2, "val_loss": 4.4},
        {"step": 3, "loss": 3.1},
        {"step": 4, "loss": float("nan")},
        {"step": 5, "loss": "not a number"},
        {"loss": 1.0},  # no step
    ]
    text = "\n".join(json.dumps(x) for x in lines) + "\n[1, 2]\n\n" + '{"step": 6, "lo'  # torn last line
    p.write_text(text)
    m = read_metrics(p)
    assert m.train_steps.tolist() == [1, 2, 3, 4]
    assert m.train_loss[:3].tolist() == [5.0, 4.1, 3.1]
    assert math.isnan(m.train_loss[3])
    assert m.val_steps.tolist() == [2] and m.val_loss.tolist() == [4.4]
    assert m.relogged == 3
    assert m.bad_lines == 4  # "not a number", no step, a JSON list, the torn line


def test_runs_found_at_any_depth_with_categories(tmp_path):
    root = tmp_path / "sweep"
    write_final(root / "a" / "b" / "c" / "ok")
    write_final(root / "stalled", status="stalled", flags=["stalled"], seed=1)
    write_final(root / "x" / "diverged", status="diverged", seed=2)
    write_final(root / "x" / "failed", status="failed", final_val_loss=None, seed=3)
    write_final(root / "spiky", flags=["spiky"], seed=4)
    write_final(root / "preempted", status="preempted", seed=5)
    write_final(root / "noloss", final_val_loss=None, seed=6)
    unfinished = root / "deep" / "er" / "unfinished"
    unfinished.mkdir(parents=True)
    (unfinished / "metrics.jsonl").write_text('{"step": 1, "loss": 3.0}\n')
    (unfinished / "config.yaml").write_text("model:\n  size: tiny\n  variant: highway\ntrain:\n  seed: 7\n")
    corrupt = root / "corrupt"
    corrupt.mkdir()
    (corrupt / "final.json").write_text('{"status": "comp')
    # never searched: checkpoints/ inside a run, and the report's own output directory
    write_final(root / "a" / "b" / "c" / "ok" / "checkpoints" / "step100")
    write_final(root / "report" / "stale")

    runs = {r.rel: r for r in find_runs(root, skip=[root / "report"])}
    assert sorted(runs) == sorted([
        "a/b/c/ok", "stalled", "x/diverged", "x/failed", "spiky", "preempted", "noloss", "deep/er/unfinished",
        "corrupt",
    ])
    cat = {k: r.category for k, r in runs.items()}
    assert cat == {
        "a/b/c/ok": "ok", "stalled": "flagged", "x/diverged": "flagged", "x/failed": "flagged",
        "spiky": "flagged", "preempted": "unfinished", "noloss": "unusable", "deep/er/unfinished": "unfinished",
        "corrupt": "unusable",
    }
    u = runs["deep/er/unfinished"]
    assert (u.variant, u.size, u.seed, u.has_final) == ("highway", "tiny", 7, False)
    assert u.metrics.train_loss.tolist() == [3.0]
    assert runs["x/failed"].final_val_loss is None
    assert "spiky" in runs["spiky"].reason
    assert "final.json unreadable" in runs["corrupt"].reason


def test_convex_runs_are_found_through_the_registry_not_the_name():
    from rrtrain import residuals
    from rrtrain.report.collect import is_convex

    convex = {name for name in residuals.names() if residuals.get(name).convex}
    assert convex == {name for name in residuals.names() if is_convex(name)} and "review_convex" in convex
    assert not is_convex("made_up_convex") and not is_convex("review")
