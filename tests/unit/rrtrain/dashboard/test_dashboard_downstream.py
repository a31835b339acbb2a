"""Downstream results on the dashboard's per-size charts: in-loop records as `SIZE/downstream/TASK/METRIC`, `rrtrain
eval`'s result files as `SIZE/eval/TASK/METRIC` at their own steps, a chart per task and metric in the size's
category of the custom-scalars layout, a result file that appears later appended at the next refresh, a bad one
said once on stderr; a sweep without downstream results keeps the layout it had."""

from __future__ import annotations

import json

from unit.rrtrain.dashboard.test_dashboard_live import accumulate, add, make_run, start, steps

from rrtrain.dashboard.live import layout
from rrtrain.rundir import layout as rundir_layout


def downstream(path, step: int, acc: float) -> None:
    with open(path / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "downstream", "step": step, "seconds": 0.3, "downstream/mc/acc": acc,
                            "downstream/mc/acc_stderr": 0.01, "downstream/ppl/bits_per_byte": 2.0 - acc}) + "\n")


def result_file(run, step: int, acc: float) -> None:
    d = run / rundir_layout.EVAL
    d.mkdir(exist_ok=True)
    (d / f"step_{step:08d}-mc.json").write_text(json.dumps({
        "step": step, "tasks": ["mc"], "num_fewshot": None, "limit": None, "source": "eval", "seconds": 1.0,
        "lm_eval_version": "0.4.0", "results": {"mc": {"acc": acc, "acc_stderr": 0.02, "acc_norm": None}}}))


def charts(logdir) -> dict[str, dict[str, list[str]]]:
    """The last custom-scalars layout of the `_sweep` run: category -> chart title -> regexes."""
    from tensorboard.plugins.custom_scalar import layout_pb2

    acc = accumulate(logdir / "_sweep")
    proto = layout_pb2.Layout.FromString(acc.Tensors("custom_scalars__config__")[-1].tensor_proto.string_val[0])
    return {c.title: {ch.title: list(ch.multiline.tag) for ch in c.chart} for c in proto.category}


def test_downstream_curves_join_the_per_size_charts(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    run = sweep / "tiny-review-s0"
    make_run(run, "tiny", "review", range(1, 4))
    downstream(run, 3, 0.40)
    add(run, range(4, 7))
    downstream(run, 6, 0.45)
    result_file(run, 6, 0.47)
    make_run(sweep / "tiny-standard-s0", "tiny", "standard", range(1, 4))  # no downstream results
    logdir, kept = start(sweep)
    out = logdir / "tiny" / "review" / "seed0"
    acc = accumulate(out)
    assert steps(acc, "tiny/downstream/mc/acc") == [3, 6] and steps(acc, "tiny/downstream/ppl/bits_per_byte") == [3, 6]
    assert [round(e.value, 5) for e in acc.Scalars("tiny/downstream/mc/acc")] == [0.4, 0.45]
    assert [(e.step, round(e.value, 5)) for e in acc.Scalars("tiny/eval/mc/acc")] == [(6, 0.47)]
    assert not any("stderr" in t or "acc_norm" in t for t in acc.Tags()["scalars"])
    assert steps(acc, "tiny/train_loss") == list(range(1, 7))  # the loss curves as before
    tiny = charts(logdir)["size tiny"]
    assert list(tiny)[:4] == ["train loss", "val loss", "grad norm", "gate mean per block"]
    assert tiny["downstream mc acc"] == [r"^tiny/(downstream|eval)/mc/acc$"]
    assert tiny["downstream ppl bits_per_byte"] == [r"^tiny/(downstream|eval)/ppl/bits_per_byte$"]

    # `rrtrain eval` on an earlier checkpoint after the dashboard started: at its own step, at the next refresh;
    # a bad result file is said once, and nothing else is written again
    result_file(run, 3, 0.41)
    (run / rundir_layout.EVAL / "step_00000004-bad.json").write_text("{")
    assert kept.refresh() == 1
    assert kept.refresh() == 0
    acc = accumulate(out)
    assert sorted((e.step, round(e.value, 5)) for e in acc.Scalars("tiny/eval/mc/acc")) == [(3, 0.41), (6, 0.47)]
    assert steps(acc, "tiny/downstream/mc/acc") == [3, 6]
    err = capsys.readouterr().err
    assert err.count("eval/step_00000004-bad.json unreadable") == 1

    # a size whose runs have none keeps exactly the charts it had
    make_run(sweep / "rr-60m-review-s0", "rr-60m", "review", range(1, 3))
    kept.refresh()
    assert list(charts(logdir)["size rr-60m"]) == ["train loss", "val loss", "grad norm", "gate mean per block"]
    assert layout(["tiny"]) == layout(["tiny"], {})  # the layout of a sweep without downstream results
