"""Sweep grids (`grid:`, `sizes.S.grid:`, `variant_grid:`): the points, their ids (stable when points are added,
refused when two collide), typed values, the recorded point, resubmission, status, dry-run and plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from launchers.sweep import record, spec
from launchers.state import status as status_cli
from launchers.sweep.estimate import grid_costs
from launchers.sweep.expand import data_path, expand
from launchers.submit import to_submit
from rrtrain.cli.main import main as cli
from rrtrain.core.errors import UsageError
from rrtrain.rundir.points import encode_value, point_key
from trainutil import REPO

BASE = {"name": "g", "config": "tiny.yaml", "data": "/data/x", "variants": ["review", "standard"],
        "overrides": {"train": {"max_steps": 4}},
        "sizes": {"micro": {"seeds": 2}, "tiny": {"seeds": 1, "grid": {"train.warmup_steps": [1, 2]}}},
        "grid": {"train.lr": ["1e-3", 3e-3]},
        "variant_grid": {"standard": {"train": {"lr": [0.01]}}}}


def expand_body(tmp_path: Path, body: dict, name: str = "sweep.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(body, sort_keys=False))
    sweep = spec.load(p)
    out = tmp_path / "out"
    return sweep, out, expand(sweep, out, data_path(sweep, out))


def with_(body: dict, **changes) -> dict:
    return {**json.loads(json.dumps(body)), **changes}


def test_encode_value():
    assert [encode_value(v) for v in (0.003, 0.01, 1e-3, 2.5e-4, 0.5, 3.0, 1e6, 10, True, "bf16")] == \
        ["3e-3", "1e-2", "1e-3", "2.5e-4", "0.5", "3.0", "1e6", "10", "true", "bf16"]
    assert point_key({"train.warmup_steps": 10, "train.lr": 0.003}) == "lr3e-3-warmup_steps10"
    assert point_key({}) == ""
    with pytest.raises(UsageError, match="run id"):
        encode_value("a/b")


def test_points_ids_levels_and_typed_values(tmp_path):
    _, out, runs = expand_body(tmp_path, BASE)
    ids = [r.id for r in runs]
    assert ids == ["micro-review-lr1e-3-s0", "micro-review-lr1e-3-s1", "micro-review-lr3e-3-s0",
                   "micro-review-lr3e-3-s1", "micro-standard-lr1e-2-s0", "micro-standard-lr1e-2-s1",
                   "tiny-review-lr1e-3-warmup_steps1-s0", "tiny-review-lr1e-3-warmup_steps2-s0",
                   "tiny-review-lr3e-3-warmup_steps1-s0", "tiny-review-lr3e-3-warmup_steps2-s0",
                   "tiny-standard-lr1e-2-warmup_steps1-s0", "tiny-standard-lr1e-2-warmup_steps2-s0"]
    r = runs[0]
    # "1e-3" (YAML reads it as a string) is typed as train.lr's float, in the config and in the point
    assert r.point == {"train.lr": 0.001} and r.config["train"]["lr"] == 0.001
    assert r.config["run"]["point"] == {"train.lr": 0.001} and r.config["run"]["name"] == r.id
    assert runs[-1].config["train"]["warmup_steps"] == 2 and runs[-1].config["train"]["lr"] == 0.01
    assert r.dir == (out / r.id).resolve()
    assert record.RunEntry.of_run(r).point == {"train.lr": 0.001}


def test_a_rules_own_knob_and_negative_values(tmp_path):
    body = with_(BASE, variants=["review", "highway"], grid={"model.init_std": [0.01, 0.02]},
                 variant_grid={"highway": {"model.residual.gate_bias": [-1, 0.5]}})
    body["sizes"] = {"tiny": 1}
    _, _, runs = expand_body(tmp_path, body)
    by = {r.id: r for r in runs}
    r = by["tiny-highway-init_std2e-2-gate_bias-1.0-s0"]
    assert r.point == {"model.init_std": 0.02, "model.residual.gate_bias": -1.0}
    assert r.config["model"]["residual"]["gate_bias"] == -1.0 and r.config["model"]["init_std"] == 0.02
    assert "tiny-review-init_std1e-2-s0" in by and len(runs) == 2 + 4


def test_no_grid_keeps_ids_and_config(tmp_path):
    body = with_(BASE)
    del body["grid"], body["variant_grid"], body["sizes"]["tiny"]["grid"]
    _, _, runs = expand_body(tmp_path, body)
    assert [r.id for r in runs][:2] == ["micro-review-s0", "micro-review-s1"]
    assert all(r.point == {} and r.config["run"]["point"] == {} for r in runs)
    assert "point" not in record.RunEntry.of_run(runs[0]).to_json()


def test_ids_stable_when_points_are_added(tmp_path):
    _, _, before = expand_body(tmp_path, BASE)
    more = with_(BASE, grid={"train.lr": [3e-4, "1e-3", 3e-3, 1e-2]})
    _, _, after = expand_body(tmp_path, more, "more.yaml")
    old = {r.id: r.config for r in before}
    new = {r.id: r.config for r in after}
    assert set(old) < set(new) and "micro-review-lr3e-4-s0" in new
    assert all(new[k] == old[k] for k in old)  # the same runs, unchanged: a resubmission keeps them


def test_bad_grids_are_refused(tmp_path):
    cases = [
        (with_(BASE, grid={"train.lr": ["fast"]}), "train.lr: expected a number"),
        (with_(BASE, grid={"train.lrr": [1e-3]}), "did you mean 'train.lr'"),
        (with_(BASE, grid={"train.lr": []}), "non-empty list"),
        (with_(BASE, grid={"train.lr": 0.1}), "non-empty list"),
        (with_(BASE, grid={"train.lr": [1e-3, 1e-3]}), "listed twice"),
        (with_(BASE, grid={"train.lr": [1e-3, "1e-3"]}), "two values are the same"),
        (with_(BASE, grid={"train.seed": [1, 2]}), "axis of the sweep"),
        (with_(BASE, grid={"model.variant": ["review"]}), "axis of the sweep"),
        (with_(BASE, grid={"train.lr": [[1e-3]]}), "numbers, strings or booleans"),
        (with_(BASE, variant_grid={"highway": {"train.lr": [1e-3]}}), "not a variant of this sweep"),
        (with_(BASE, grid={"train.compile": ["maybe"]}), "train.compile: expected"),
        (with_(BASE, runs={"micro-review-lr3e-3-s0": {"train.lr": 0.1}}), "grid key"),
        (with_(BASE, runs={"micro-review-s0": {"train.beta1": 0.8}}), "no run 'micro-review-s0'"),
    ]
    for i, (body, message) in enumerate(cases):
        with pytest.raises(UsageError, match=message):
            expand_body(tmp_path, body, f"bad{i}.yaml")


def test_colliding_points_are_refused(tmp_path):
    # two different floats that agree to 15 significant digits encode alike: the second run would overwrite the first
    body = with_(BASE, grid={"train.lr": [0.003, 0.0030000000000000005]}, variant_grid={})
    assert 0.003 != 0.0030000000000000005
    with pytest.raises(UsageError, match="two runs would both be named 'micro-review-lr3e-3-s0'"):
        expand_body(tmp_path, body)


def test_cli_refuses_bad_grid_with_exit_2(tmp_path, capsys):
    """`rrtrain sweep` in this process (the command's main; its exit status is main's return)."""
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(with_(BASE, config=str(REPO / "configs/train/tiny.yaml"),
                                      grid={"train.lr": ["fast"]})))
    assert cli(["sweep", str(p), "--out", str(tmp_path / "o"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "grid train.lr: value 'fast'" in err
    assert not (tmp_path / "o").exists()


def test_resubmission_skips_finished_points_and_adds_new(tmp_path):
    sweep, out, runs = expand_body(tmp_path, BASE)
    rec = record.merge(None, sweep, runs)
    done = runs[2]  # micro-review-lr3e-3-s0
    done.dir.mkdir(parents=True)
    (done.dir / "final.json").write_text(json.dumps({"status": "completed", "step": 4}))
    record.add_submission(rec, "local", {r.id: "local:1" for r in runs})
    record.save(out, rec)
    more = with_(BASE, grid={"train.lr": [3e-4, "1e-3", 3e-3]})
    sweep2, _, runs2 = expand_body(tmp_path, more, "more.yaml")
    old = record.load(out)
    record.merge(old, sweep2, runs2)  # adding points is not a change to an existing run
    todo, skipped = to_submit(runs2, old)
    assert skipped == {done.id: "completed"}
    assert {r.id for r in todo} == {r.id for r in runs2} - {done.id}


def test_status_shows_setting_columns(tmp_path):
    sweep, out, runs = expand_body(tmp_path, BASE)
    record.save(out, record.merge(None, sweep, runs))
    status = status_cli.collect(out)
    row = next(r for r in status["runs"] if r["id"] == "tiny-review-lr3e-3-warmup_steps2-s0")
    assert row["point"] == {"train.lr": 0.003, "train.warmup_steps": 2}
    lines = status_cli.table(status).splitlines()
    head = lines[1].split()
    assert head[:6] == ["run", "variant", "size", "lr", "warmup_steps", "seed"]
    line = next(x for x in lines if x.startswith("tiny-review-lr3e-3-warmup_steps2-s0 "))
    assert line.split()[3:6] == ["0.003", "2", "0"]
    line = next(x for x in lines if x.startswith("micro-review-lr3e-3-s1 "))
    assert line.split()[3:6] == ["0.003", "-", "1"]  # micro has no warm-up axis


def test_dry_run_prices_each_group(tmp_path):
    _, _, runs = expand_body(tmp_path, BASE)
    costs = {(g.size, g.variant): (g.points, g.runs) for g in grid_costs(runs, "H100", 0.4)}
    assert costs == {("micro", "review"): (2, 4), ("micro", "standard"): (1, 2), ("tiny", "review"): (4, 4),
                     ("tiny", "standard"): (2, 2)}
    body = with_(BASE)
    del body["grid"], body["variant_grid"], body["sizes"]["tiny"]["grid"]
    assert grid_costs(expand_body(tmp_path, body, "plain.yaml")[2], "H100", 0.4) == []


@pytest.mark.slow
def test_plan_sweep_knows_the_grid(tmp_path, capsys):
    """`rrtrain plan SWEEP` in this process (the command's main)."""
    p = tmp_path / "g.yaml"
    p.write_text(yaml.safe_dump(with_(BASE, config=str(REPO / "configs/train/tiny.yaml"))))
    assert cli(["plan", str(p)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "grid micro review: 2 points, 4 runs" in out
    assert "tiny-review-lr3e-3-warmup_steps2-s0" in out
    assert cli(["plan", str(p), "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert runs["tiny-review-lr3e-3-warmup_steps2-s0"]["point"] == {"train.lr": 0.003, "train.warmup_steps": 2}


def test_cancel_names_and_records_the_point(tmp_path, capsys):
    from launchers import cancel
    from unit.launchers.test_sweep_cancel import make_sweep

    sweep, procs = make_sweep(tmp_path)
    try:
        rec = record.load(sweep)
        rec.runs["tiny-review_convex-s0"].config["run"] = {"point": {"train.lr": 0.01}}
        record.save(sweep, rec)
        assert list(cancel.cancel_flagged(sweep)) == ["tiny-review_convex-s0"]
        assert "cancelled tiny-review_convex-s0 at train.lr=0.01 (" in capsys.readouterr().out
        assert record.load(sweep).cancellations[-1]["points"] == {"tiny-review_convex-s0": {"train.lr": 0.01}}
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
