"""`rrtrain report` on a transfer sweep (docs/transfer.md): the best learning rate against the width or depth per
parametrization, whether the base shape's transfers (within one grid step, at most 0.5% of loss), the plot, and
`--lr-for` saying for a mup/completep sweep that the base learning rate transfers beside the fitted law."""

from __future__ import annotations

import json

import pytest

from rrtrain.report.collect import find_runs, read_shape
from rrtrain.report.grid import analyze_grid
from rrtrain.report.options import Options
from unit.rrtrain.report.test_report_grid import write_run

LRS = [1e-3, 2e-3, 4e-3, 8e-3]
DEPTHS = [4, 8, 16]


def loss_at(lr: float, best: float, depth: int, seed: int) -> float:
    """A bowl in log2(lr) around `best`: 0.05 per grid step squared; a seed's scatter far below one step's cost."""
    steps = abs(LRS.index(lr) - LRS.index(best))
    return 3.0 - 0.1 * DEPTHS.index(depth) + 0.05 * steps ** 2 + 0.001 * seed


@pytest.fixture(scope="module")
def depth_sweep(tmp_path_factory):
    """review at 4, 8, 16 blocks: under sp the best lr halves per doubling of the depth (two grid steps away at 16
    blocks); under completep it stays at 4e-3. Two seeds (seed 0 selects, seed 1 tests)."""
    root = tmp_path_factory.mktemp("transfer")
    for param in ("sp", "completep"):
        for depth in DEPTHS:
            best = 4e-3 if param == "completep" else LRS[2 - DEPTHS.index(depth)]
            for lr in LRS:
                for seed in range(2):
                    point = {"model.parametrization": param, "model.n_layers": depth, "train.lr": lr}
                    write_run(root, "tiny", "review", seed, point, loss_at(lr, best, depth, seed), params=1e6 * depth)
    return root


def test_best_lr_against_depth_per_parametrization(depth_sweep):
    ga = analyze_grid(find_runs(depth_sweep), Options(lr_for=[("big", 1e9)]))
    lines = {t.parametrization: t for t in ga.transfer}
    assert set(lines) == {"sp", "completep"}
    assert all(t.axis == "depth" and t.variant == "review" for t in lines.values())
    cp, sp = lines["completep"], lines["sp"]
    assert [(s.depth, s.best, s.steps) for s in cp.shapes] == [(4, 4e-3, None), (8, 4e-3, 0), (16, 4e-3, 0)]
    assert cp.holds is True and cp.verdict.startswith("transfers") and all(s.cost == 0 for s in cp.shapes[1:])
    assert [(s.depth, s.best, s.steps) for s in sp.shapes] == [(4, 4e-3, None), (8, 2e-3, 1), (16, 1e-3, 2)]
    assert sp.holds is False and "16 blocks: best lr 0.001, 2 grid steps from the base's 0.004" in sp.verdict
    # at 8 blocks, one step away: the base's lr costs one step's 0.05 nats, measured on the test seed (seed 1)
    assert sp.shapes[1].cost == pytest.approx(0.05 / loss_at(2e-3, 2e-3, 8, 1))
    # the lr fit runs per line across the depths (the grid has shape keys); completep's names the base lr beside it
    fits = {f.parametrization: f for f in ga.lr_fits}
    assert fits["completep"].b == pytest.approx(0.0, abs=1e-12) and fits["sp"].b < -0.5
    assert fits["completep"].base_lr == 4e-3 and fits["completep"].transfers is True
    assert fits["completep"].base_for == [("big", 1e9)] and fits["sp"].base_lr is None


@pytest.mark.slow  # the whole report with its plots, in process: ~3 s of CPU
def test_the_report_shows_the_table_the_plot_and_the_transferring_lr(depth_sweep, tmp_path, capsys):
    from rrtrain.cli.report import main

    out = tmp_path / "rep"
    assert main([str(depth_sweep), "--out", str(out), "--lr-for", "7B"]) == 0
    console = capsys.readouterr().out
    assert "transfer review (completep): transfers" in console
    assert "suggested lr for 7B (~7B): 0.004 (fit); completep: the base lr 0.004 transfers" in console
    md = (out / "report.md").read_text()
    assert "### The best learning rate against the width or depth" in md and "![best learning rate" in md
    assert "| review (sp) | tiny | 64 | 16 | ~16M | 0.001 (edge) | 2 |" in md
    assert "- review (sp): does not transfer from 4 blocks" in md
    assert "0.004 transfers (completep; measured: transfers)" in md
    summary = json.loads((out / "summary.json").read_text())
    assert summary["grid"]["transfer_plot"]["series"] == [2]
    assert {t["parametrization"]: t["holds"] for t in summary["grid"]["transfer"]} == {"sp": False,
                                                                                       "completep": True}
    assert (out / "transfer_lr.png").stat().st_size > 0


def test_a_mup_sweep_over_presets_says_the_base_lr_transfers(tmp_path):
    """Sizes micro and tiny (d_model 48 and 64, 2 and 4 blocks, from their presets; no grid over the shape) under
    mup: a line across both shapes, the classic fit per variant and parametrization, and the base lr claimed for the
    larger --lr-for size."""
    for size, n in (("micro", 1e6), ("tiny", 2e6)):
        for lr in LRS[:3]:
            for seed in range(2):
                write_run(tmp_path, size, "standard", seed, {"train.lr": lr}, 3.0 + abs(LRS.index(lr) - 1) / 10,
                          params=n, model={"parametrization": "mup"})
    ga = analyze_grid(find_runs(tmp_path), Options(lr_for=[("rr-1b", 1e9)]))
    (line,) = ga.transfer
    assert (line.axis, line.parametrization, [(s.width, s.depth) for s in line.shapes]) == ("shape", "mup",
                                                                                              [(48, 2), (64, 4)])
    assert line.holds is True
    (fit,) = ga.lr_fits
    assert (fit.parametrization, fit.base_lr, fit.base_for, fit.sizes) == ("mup", 2e-3, [("rr-1b", 1e9)],
                                                                          ["micro", "tiny"])
    assert [p.size for p in fit.predictions] == ["rr-1b"] and fit.predictions[0].lr == pytest.approx(2e-3)


def test_shape_of_a_recorded_config_as_untrusted_data():
    assert read_shape({}, "tiny") == ("sp", 64, 4)  # a run from before parametrizations: sp, the preset's shape
    assert read_shape({"model": {"parametrization": "completep", "d_model": 128, "n_layers": 32}}, "tiny") == (
        "completep", 128, 32)
    assert read_shape({"model": {"parametrization": ["x"], "d_model": "wide", "n_layers": -3}}, "micro") == (
        "unknown", 48, 2)
    assert read_shape({"model": {"d_model": True}}, "no-such-preset") == ("sp", None, None)


def test_with_every_seed_selecting_the_table_shows_the_losses_the_cost_was_taken_on(depth_sweep):
    """`--select-seeds 2` on two seeds leaves no test seed: the loss columns were empty while the cost column
    held the selection seeds' figures; they show those figures now, marked, with what they mean."""
    from rrtrain.report.grid_render import grid_md

    ga = analyze_grid(find_runs(depth_sweep), Options(select_seeds=2))
    md = grid_md(ga, "transfer")
    sp8 = next(line for line in md.splitlines() if line.startswith("| review (sp) | tiny | 64 | 8 |"))
    own, at_base = (loss_at(2e-3, 2e-3, 8, 0) + loss_at(2e-3, 2e-3, 8, 1)) / 2, (loss_at(4e-3, 2e-3, 8, 0) +
                                                                               loss_at(4e-3, 2e-3, 8, 1)) / 2
    assert f"| {own:.4f}* | {at_base:.4f}* | {100 * (at_base - own) / own:+.2f}% |" in sp8, sp8
    assert "\\* the mean of the selection seeds: no test seed ran" in md
