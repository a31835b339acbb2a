"""Successive halving's rule (`launchers.prune.rule`) on fabricated runs: the keep fraction's rounding, ties, seeds
of a point ranked together, diverged and stalled runs freeing their place, an all-diverged group, waiting for a
group, runs past a rung left alone, pruned runs resuming when `keep` grows; the `prune:` key's validation; the
rung steps and values read from metrics.jsonl; what pruning saved; the report never averaging a pruned run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from launchers.prune import rule as prune, rungs as prune_sweep
from launchers.sweep.expand import Run
from launchers.sweep.spec import PruneSpec, Resources, load
from rrtrain.core.errors import UsageError
from rrtrain.report.collect import read_run
from trainutil import REPO

IDLE, ACTIVE, DEAD, DONE = prune.IDLE, prune.ACTIVE, prune.DEAD, prune.COMPLETED
GROUP = ("tiny", "standard")


def members(points: dict[str, int], rungs=(10, 20), total=40) -> list[prune.Member]:
    """`points`: label -> seeds; run ids `LABEL-sSEED`."""
    return [prune.Member(f"{p}-s{s}", GROUP, p, tuple(rungs), total) for p, n in points.items() for s in range(n)]


def values(table: dict[tuple[str, int], float]):
    return lambda m, step: table.get((m.id, step), math.inf)


# -- the keep fraction and the ranking ---------------------------------------------------------------------


@pytest.mark.parametrize("live,keep,kept", [(3, 0.5, 2), (4, 0.5, 2), (30, 0.1, 3), (5, 0.01, 1), (7, 1.0, 7),
                                            (1, 0.5, 1), (0, 0.5, 0), (3, 1 / 3, 1), (10, 0.3, 3)])
def test_keep_count_rounds_up_and_keeps_at_least_one(live, keep, kept):
    assert prune.keep_count(live, keep) == kept


def test_ties_at_the_boundary_are_kept_and_the_order_is_by_value_then_label():
    ranked = prune.select({"d": 3.0, "c": 2.0, "b": 2.0, "a": 1.0}, 0.5)
    assert [(r.point, r.kept) for r in ranked] == [("a", True), ("b", True), ("c", True), ("d", False)]
    ranked = prune.select({"x": 2.0, "y": 2.0}, 0.5)  # a tie for the one place: both kept
    assert [(r.point, r.kept) for r in ranked] == [("x", True), ("y", True)]


def test_non_finite_values_rank_last_and_never_tie_in():
    ranked = prune.select({"a": math.nan, "b": math.inf, "c": 4.0}, 0.3)
    assert [(r.point, r.kept) for r in ranked] == [("c", True), ("a", False), ("b", False)]
    ranked = prune.select({"a": math.nan, "b": math.inf, "c": 4.0}, 0.5)  # two places: the count rules
    assert [(r.point, r.kept) for r in ranked] == [("c", True), ("a", True), ("b", False)]
    ranked = prune.select({"a": math.nan, "b": math.inf}, 0.5)  # nothing finite: one kept, by label
    assert [(r.point, r.kept) for r in ranked] == [("a", True), ("b", False)]


# -- the plan, rung by rung ----------------------------------------------------------------------------------


def test_new_runs_go_to_the_first_rung_then_the_worst_are_pruned_rung_by_rung():
    ms = members({"lr1": 1, "lr2": 1, "lr3": 1, "lr4": 1})
    p = prune.plan(ms, {m.id: prune.Seen(IDLE) for m in ms}, values({}), 0.5)
    assert p.go == {m.id: 10 for m in ms} and not p.prune and not p.decisions

    at10 = {m.id: prune.Seen(IDLE, 10, "paused") for m in ms}
    v = values({("lr1-s0", 10): 3.0, ("lr2-s0", 10): 2.0, ("lr3-s0", 10): 5.0, ("lr4-s0", 10): 4.0,
                ("lr1-s0", 20): 2.5, ("lr2-s0", 20): 1.5})
    p = prune.plan(ms, at10, v, 0.5, "val_loss")
    assert p.go == {"lr2-s0": 20, "lr1-s0": 20}
    assert sorted(p.prune) == ["lr3-s0", "lr4-s0"]
    assert p.prune["lr3-s0"]["rank"] == 4 and p.prune["lr3-s0"]["step"] == 10 and p.prune["lr3-s0"]["rung"] == 1
    [d] = p.decisions
    assert [(r.point, r.kept) for r in d.ranking] == [("lr2", True), ("lr1", True), ("lr4", False), ("lr3", False)]

    after = {**at10, "lr1-s0": prune.Seen(IDLE, 20, "paused"), "lr2-s0": prune.Seen(IDLE, 20, "paused"),
             "lr3-s0": prune.Seen(IDLE, 10, "pruned"), "lr4-s0": prune.Seen(IDLE, 10, "pruned")}
    p = prune.plan(ms, after, v, 0.5)
    assert p.go == {"lr2-s0": None} and list(p.prune) == ["lr1-s0"]  # the pruned ones are not marked again
    assert [d.rung for d in p.decisions] == [1, 2]


def test_the_seeds_of_a_point_are_ranked_together_and_pruned_together():
    ms = members({"a": 2, "b": 2}, rungs=(10,))
    seen = {m.id: prune.Seen(IDLE, 10, "paused") for m in ms}
    v = values({("a-s0", 10): 1.0, ("a-s1", 10): 5.0, ("b-s0", 10): 2.0, ("b-s1", 10): 2.5})
    p = prune.plan(ms, seen, v, 0.5)
    assert [(r.point, r.value) for r in p.decisions[0].ranking] == [("b", 2.25), ("a", 3.0)]
    assert sorted(p.prune) == ["a-s0", "a-s1"] and p.go == {"b-s0": None, "b-s1": None}


def test_diverged_and_stalled_runs_free_their_place():
    ms = members({"a": 1, "b": 1, "c": 1, "d": 1}, rungs=(10,))
    seen = {"a-s0": prune.Seen(DEAD, 4, "diverged"), "b-s0": prune.Seen(IDLE, 10, "paused"),
            "c-s0": prune.Seen(IDLE, 10, "paused"), "d-s0": prune.Seen(DEAD, 10, "stalled")}
    p = prune.plan(ms, seen, values({("b-s0", 10): 2.0, ("c-s0", 10): 3.0}), 0.5)
    [d] = p.decisions
    assert d.dropped == ("a", "d")  # out of the ranking: 2 live points, one kept
    assert [(r.point, r.kept) for r in d.ranking] == [("b", True), ("c", False)]
    assert p.go == {"b-s0": None} and list(p.prune) == ["c-s0"]
    # a run that diverged after a rung was ranked at it (its value there is real)
    seen["a-s0"] = prune.Seen(DEAD, 15, "diverged")
    p = prune.plan(ms, seen, values({("a-s0", 10): 1.0, ("b-s0", 10): 2.0, ("c-s0", 10): 3.0}), 0.5)
    assert [(r.point, r.kept) for r in p.decisions[0].ranking] == [("a", True), ("b", True), ("c", False)]
    assert p.go == {"b-s0": None}  # the diverged run is not sent anywhere


def test_an_all_diverged_group_is_finished_with_nothing_to_prune_or_send():
    ms = members({"a": 1, "b": 2}, rungs=(10, 20))
    seen = {m.id: prune.Seen(DEAD, 7, "diverged") for m in ms}
    p = prune.plan(ms, seen, values({}), 0.5)
    assert not p.go and not p.prune and not p.waiting
    [d] = p.decisions
    assert d.ranking == () and d.dropped == ("a", "b")


def test_a_group_waits_at_a_rung_until_every_live_run_reached_it():
    ms = members({"a": 1, "b": 1, "c": 1}, rungs=(10,))
    seen = {"a-s0": prune.Seen(IDLE, 10, "paused"), "b-s0": prune.Seen(ACTIVE), "c-s0": prune.Seen(IDLE, 3, "failed")}
    p = prune.plan(ms, seen, values({("a-s0", 10): 1.0}), 0.5)
    assert p.go == {"c-s0": 10} and not p.prune and not p.decisions  # the failed one is sent again, b is running
    assert list(p.waiting) == ["a-s0"] and "2 run(s)" in p.waiting["a-s0"]


def test_a_run_past_a_rung_is_never_stopped_behind_it():
    ms = members({"a": 1, "b": 1, "c": 1}, rungs=(10,))
    seen = {"a-s0": prune.Seen(DONE, 40, "completed"), "b-s0": prune.Seen(IDLE, 10, "paused"),
            "c-s0": prune.Seen(ACTIVE, 10, "paused")}
    v = values({("a-s0", 10): 9.0, ("b-s0", 10): 1.0, ("c-s0", 10): 8.0})
    p = prune.plan(ms, seen, v, 0.3)  # keeps one: b; a completed and c is running past the rung: left alone
    assert [(r.point, r.kept) for r in p.decisions[0].ranking] == [("b", True), ("c", False), ("a", False)]
    assert not p.prune and p.go == {"b-s0": None}


def test_raising_keep_resumes_the_pruned_runs_from_where_they_stopped():
    ms = members({"a": 1, "b": 1, "c": 1}, rungs=(10, 20))
    seen = {"a-s0": prune.Seen(DONE, 40, "completed"), "b-s0": prune.Seen(IDLE, 20, "pruned"),
            "c-s0": prune.Seen(IDLE, 10, "pruned")}
    v = values({("a-s0", 10): 1.0, ("b-s0", 10): 2.0, ("c-s0", 10): 3.0, ("a-s0", 20): 1.0, ("b-s0", 20): 2.0})
    assert not prune.plan(ms, seen, v, 0.5).go  # as decided: nothing to do
    assert prune.plan(ms, seen, v, 1.0).go == {"c-s0": 20}  # rung 2 waits for c; b waits with it
    seen["c-s0"] = prune.Seen(IDLE, 20, "paused")
    assert prune.plan(ms, seen, v, 1.0).go == {"b-s0": None, "c-s0": None}


# -- the sweep file's prune: key -----------------------------------------------------------------------------


def sweep_file(tmp_path: Path, prune_block) -> Path:
    body = {"name": "t", "config": str(REPO / "configs" / "train" / "tiny.yaml"), "data": str(tmp_path),
            "variants": ["standard"], "sizes": {"tiny": 1}, "prune": prune_block}
    p = tmp_path / "t.yaml"
    p.write_text(yaml.safe_dump(body))
    return p


@pytest.mark.parametrize("block,message", [
    ({"rungs": []}, "prune.rungs must list at least one rung"),
    ({"rungs": [0.5, 1.5]}, "prune.rungs: 1.5 is not a fraction of the budget in (0, 1)"),
    ({"rungs": [0, 10]}, "prune.rungs: step 0 must be at least 1"),
    ({"rungs": [0.25, 100]}, "mixes fractions and step counts"),
    ({"rungs": [0.5, 0.25]}, "prune.rungs must rise strictly"),
    ({"rungs": ["x"]}, "prune.rungs: 'x' is not a number"),
    ({"rungs": [0.5], "keep": 0}, "prune.keep must be a fraction in (0, 1]"),
    ({"rungs": [0.5], "keep": 1.5}, "prune.keep must be a fraction in (0, 1]"),
    ({"rungs": [0.5], "metric": "val_los"}, "prune.metric: unknown metric 'val_los' (did you mean 'val_loss'?)"),
    ({"rungs": [0.5], "smooth": 0}, "prune.smooth must be at least 1"),
    ({"rungs": [0.5], "kep": 0.5}, "unknown key 'prune.kep'; did you mean 'prune.keep'?"),
])
def test_a_bad_prune_block_is_refused_in_one_line(tmp_path, block, message):
    with pytest.raises(UsageError) as err:
        load(sweep_file(tmp_path, block))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_good_prune_block_loads_and_an_override_raises_keep(tmp_path):
    s = load(sweep_file(tmp_path, {"rungs": [0.25, 0.5], "keep": 0.5, "metric": "train_loss", "smooth": 5}))
    assert s.spec.prune == PruneSpec(rungs=[0.25, 0.5], keep=0.5, metric="train_loss", smooth=5)
    assert load(sweep_file(tmp_path, {"rungs": [10]}), ["prune.keep=1"]).spec.prune.keep == 1
    assert load(sweep_file(tmp_path, None)).spec.prune is None


# -- rung steps, values, savings -----------------------------------------------------------------------------


def run(rid: str, run_dir: Path, max_steps=40, every=10, evals=10, seed=0, lr=0.003, size="tiny") -> Run:
    config = {"train": {"max_steps": max_steps, "stop_check_every": every, "eval_every": evals, "seed": seed,
                        "lr": lr, "global_batch": 8},
              "model": {"size": size, "variant": "standard"}, "data": {"path": None},
              "run": {"dir": str(run_dir), "name": rid}}
    return Run(rid, size, "standard", seed, config, Resources())


def test_rung_steps_round_down_to_the_stop_check_and_bad_placements_are_refused(tmp_path):
    r = run("a", tmp_path / "a", max_steps=100, every=10, evals=10)
    assert prune_sweep.rung_steps(PruneSpec(rungs=[0.25, 0.5]), r) == (20, 50)
    assert prune_sweep.rung_steps(PruneSpec(rungs=[35, 70]), r) == (30, 70)
    with pytest.raises(UsageError, match=r"fall on steps \[20, 20\]"):
        prune_sweep.rung_steps(PruneSpec(rungs=[0.25, 0.29]), r)
    with pytest.raises(UsageError, match="outside"):
        prune_sweep.rung_steps(PruneSpec(rungs=[100]), r)
    with pytest.raises(UsageError, match="evaluates first at step 50"):
        prune_sweep.rung_steps(PruneSpec(rungs=[0.2]), run("b", tmp_path / "b", max_steps=100, evals=50))
    assert prune_sweep.rung_steps(PruneSpec(rungs=[0.2], metric="train_loss"),
                                  run("b", tmp_path / "b", max_steps=100, evals=50)) == (20,)


def test_points_are_labelled_by_what_differs_in_their_group_and_seeds_share_a_point(tmp_path):
    runs = [run("s0", tmp_path / "0", seed=0, lr=1e-3), run("s1", tmp_path / "1", seed=1, lr=1e-3),
            run("s2", tmp_path / "2", seed=2, lr=1e-2), run("m0", tmp_path / "m", size="micro")]
    ms = {m.id: m for m in prune_sweep.members(PruneSpec(rungs=[0.5]), runs)}
    assert ms["s0"].point == ms["s1"].point == "train.lr=0.001" and ms["s2"].point == "train.lr=0.01"
    assert ms["m0"].point == "(one setting)" and ms["m0"].group == ("micro", "standard")


def write_metrics(run_dir: Path, lines: list[dict]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + "{torn")


def test_values_are_the_mean_of_the_last_values_up_to_the_rung(tmp_path):
    write_metrics(tmp_path / "a", [{"step": s, "loss": float(s)} for s in range(1, 31)]
                  + [{"step": 10, "val_loss": 4.0, "tokens": 1}, {"step": 20, "val_loss": 3.0},
                     {"step": 30, "val_loss": 1.0}, {"kind": "diag", "step": 10, "loss": 99.0}])
    write_metrics(tmp_path / "b", [{"step": 10, "val_loss": None}])
    m = prune.Member("a", GROUP, "x", (20,), 30)
    cache: dict = {}
    train = prune_sweep.Values(PruneSpec(rungs=[20], metric="train_loss", smooth=4), {"a": tmp_path / "a"}, cache)
    assert train(m, 20) == (17 + 18 + 19 + 20) / 4
    val = prune_sweep.Values(PruneSpec(rungs=[20], smooth=2), {"a": tmp_path / "a", "b": tmp_path / "b"}, cache)
    assert val(m, 20) == 3.5
    assert val(prune.Member("b", GROUP, "y", (10,), 30), 10) == math.inf  # a non-finite loss ranks last
    assert json.loads(json.dumps(cache)) == cache  # what prune.json keeps


def test_savings_count_the_steps_after_each_pruned_run_stopped(tmp_path):
    from launchers.sweep.estimate import Cost

    runs = [run("a", tmp_path / "a", max_steps=40), run("b", tmp_path / "b", max_steps=40),
            run("c", tmp_path / "c", max_steps=40)]
    for r, status, step in ((runs[0], "pruned", 10), (runs[1], "pruned", 30), (runs[2], "completed", 40)):
        r.dir.mkdir()
        (r.dir / "final.json").write_text(json.dumps({"status": status, "step": step}))
    saved = prune_sweep.savings(tmp_path, runs, lambda r: Cost(1, 1, 100.0, 2.0))
    assert saved["pruned_runs"] == 2 and saved["saved_gpu_hours"] == pytest.approx(2.0 * 0.75 + 2.0 * 0.25)
    assert saved["all_gpu_hours"] == 6.0 and saved["saved_flops"] == pytest.approx(100.0)
    assert "saving 2 GPU-h of the 6 GPU-h" in prune_sweep.saved_line(saved)
    assert json.loads((tmp_path / "prune.json").read_text())["saved"] == saved  # what `rrtrain status` prints
    cpu = prune_sweep.savings(tmp_path, runs, lambda r: Cost(1, 1, 100.0, None))
    assert cpu["saved_gpu_hours"] is None and "33% of the training FLOPs" in prune_sweep.saved_line(cpu)


def test_the_report_never_averages_a_pruned_or_paused_run_even_flagged(tmp_path):
    for name, status, flags in (("p", "pruned", ["loss_spike"]), ("q", "paused", []), ("ok", "completed", [])):
        d = tmp_path / name
        d.mkdir()
        (d / "final.json").write_text(json.dumps({"status": status, "step": 10, "variant": "standard",
                                                  "size": "tiny", "seed": 0, "final_val_loss": 3.0,
                                                  "flags": flags}))
    cats = {n: read_run(tmp_path / n, tmp_path).category for n in ("p", "q", "ok")}
    assert cats == {"p": "unfinished", "q": "unfinished", "ok": "ok"}
    assert "pruning" in read_run(tmp_path / "p", tmp_path).reason
