"""A mixture's per-source validation losses (`val/<name>` in the evaluation lines of metrics.jsonl) in `rrtrain
report`: read at the last evaluation that has them, a section of report.md and `val/<name>` columns of
results.csv; a sweep without mixtures is reported without either."""

from __future__ import annotations

import csv
import io
import json

from unit.rrtrain.report.test_report_grid import write_run

from rrtrain.report import render
from rrtrain.report.analysis import analyze
from rrtrain.report.collect import find_runs, read_metrics
from rrtrain.report.options import Options


def _mixture_lines(run_dir, values: dict[int, dict[str, float]]) -> None:
    with open(run_dir / "metrics.jsonl", "a") as f:
        for step, per in values.items():
            f.write(json.dumps({"step": step, "val_loss": sum(per.values()) / len(per), "tokens": 10,
                                **{f"val/{k}": v for k, v in per.items()}}) + "\n")


def test_per_source_losses_are_read_reported_and_written(tmp_path):
    for seed in (0, 1):
        write_run(tmp_path, "tiny", "review", seed, {}, 2.0 + seed / 10)
        write_run(tmp_path, "tiny", "standard", seed, {}, 2.2 + seed / 10)
    mixed = tmp_path / "tiny-review--s0"
    _mixture_lines(mixed, {5: {"web": 3.0, "code": 1.0}, 9: {"web": 2.5, "code": 1.5}})
    m = read_metrics(mixed / "metrics.jsonl")
    assert m.val_sources == {"web": 2.5, "code": 1.5} and m.val_sources_step == 9

    a = analyze(find_runs(tmp_path), Options())
    md = render.report_md(a, {}, "mix")
    assert "## Validation loss per source" in md
    row = next(line for line in md.splitlines() if line.startswith("| tiny-review--s0"))
    assert row.split("|")[5:9] == [" 9 ", " 2.0000 ", " 2.5000 ", " 1.5000 "]
    assert "| run | size | variant | seed | step | final val loss | val/web | val/code |" in md
    rows = {r["run"]: r for r in csv.DictReader(io.StringIO(render.results_csv(a)))}
    assert (rows["tiny-review--s0"]["val/web"], rows["tiny-review--s0"]["val/code"]) == ("2.5", "1.5")
    assert rows["tiny-standard--s1"]["val/web"] == ""


def test_a_sweep_without_mixtures_has_no_source_section_or_columns(tmp_path):
    write_run(tmp_path, "tiny", "review", 0, {}, 2.0)
    a = analyze(find_runs(tmp_path), Options())
    assert "per source" not in render.report_md(a, {}, "plain")
    assert not any(k.startswith("val/") for k in csv.DictReader(io.StringIO(render.results_csv(a))).fieldnames)
