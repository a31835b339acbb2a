"""The report's cooldown branches: runs whose config.yaml records `train.branch_from`, listed under their parent
by the tokens they trained to."""

from __future__ import annotations

import json

import yaml

from rrtrain.report.analysis import analyze
from rrtrain.report.collect import find_runs
from rrtrain.report.options import Options
from rrtrain.report.render import report_md


def write_run(d, tokens, loss, branch_from=None):
    d.mkdir(parents=True)
    final = {"status": "completed", "step": tokens // 100, "tokens": tokens, "final_val_loss": loss,
             "best_val_loss": loss, "params": 1e6, "variant": "review", "size": "tiny", "seed": 0, "wall_s": 1.0,
             "flags": []}
    (d / "final.json").write_text(json.dumps(final))
    config = {"model": {"size": "tiny", "variant": "review"}, "train": {"seed": 0, "branch_from": branch_from}}
    (d / "config.yaml").write_text(yaml.safe_dump(config))


def test_branches_are_listed_under_their_parent_by_tokens(tmp_path):
    parent = tmp_path / "wsd"
    write_run(parent, 8000, 3.0)
    write_run(tmp_path / "cool_40", 4000, 3.4, f"{parent}@30")
    write_run(tmp_path / "cool_60", 6000, 3.2, f"{parent}@50")
    write_run(tmp_path / "lost", 5000, 3.3, "/gone/run@10")  # a parent the report does not hold: named as recorded
    write_run(tmp_path / "odd", 5000, 3.3, "no step here")  # malformed: not a branch
    runs = find_runs(tmp_path)
    assert {r.rel: r.branch_from for r in runs} == {"wsd": None, "cool_40": (str(parent), 30),
                                                   "cool_60": (str(parent), 50), "lost": ("/gone/run", 10),
                                                   "odd": None}
    md = report_md(analyze(runs, Options()), {}, "study")
    section = md.split("## Cooldown branches by token budget")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "parent" not in line]
    assert rows == ["| /gone/run | lost | 10 | 5000 | 3.3000 | completed |",
                    "| wsd | cool_40 | 30 | 4000 | 3.4000 | completed |",
                    "| wsd | cool_60 | 50 | 6000 | 3.2000 | completed |",
                    "| wsd | wsd | — | 8000 | 3.0000 | completed |"]


def test_no_branch_no_section(tmp_path):
    write_run(tmp_path / "a", 8000, 3.0)
    assert "Cooldown branches" not in report_md(analyze(find_runs(tmp_path), Options()), {}, "study")
