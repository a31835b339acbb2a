"""`rrtrain report ...`: outputs on success (through the command line's main), one-line errors with exit 2 (from
`python -m rrtrain report` in a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest


def write_run(root, size, variant, seed, loss, params, status="completed"):
    d = root / size / f"{variant}-{seed}"
    d.mkdir(parents=True)
    (d / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "loss": loss + 1.0 / (s + 1)}) + "\n" for s in range(20))
        + json.dumps({"step": 19, "val_loss": loss}) + "\n"
    )
    (d / "final.json").write_text(json.dumps({
        "status": status, "step": 20, "tokens": 2000, "final_val_loss": loss, "best_val_loss": loss,
        "params": params, "variant": variant, "size": size, "seed": seed, "wall_s": 1.0, "flags": [],
    }))


SIZES = (("tiny", 1e6, 3.0), ("small", 4e6, 2.5), ("medium", 16e6, 2.2))
REVIEW = {"tiny": (0.0, 0.01), "small": (0.0, 0.003), "medium": (0.0, 0.006)}
STANDARD = {"tiny": (0.004, 0.006), "small": (0.011, 0.02), "medium": (0.021, 0.024)}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("clisweep")
    for size, params, base in SIZES:
        for seed in range(2):
            write_run(root, size, "review", seed, base + REVIEW[size][seed], params)
            write_run(root, size, "standard", seed, base + STANDARD[size][seed], params * 1.002)
            write_run(root, size, "highway_convex", seed, base + 0.05 + 0.012 * seed, params * 1.003)
    write_run(root, "medium", "highway_convex", 2, 6.0, 16e6, status="stalled")
    return root


def report(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "rrtrain", "report", *map(str, args)],
                          capture_output=True, text=True, timeout=600, cwd=cwd)


def test_end_to_end(sweep, tmp_path, capsys):
    """A whole report, through the command line's main in this process (what a process adds, the exit status and
    the one line on stderr, is what the bad-input cases below test in plain interpreters)."""
    from rrtrain.cli.main import main

    out = tmp_path / "out"
    code = main(["report", str(sweep), "--out", str(out), "--extrapolate", "7e9,70B",
                 "--baselines", "standard,highway_convex"])
    assert code == 0, capsys.readouterr().err
    names = {p.name for p in out.iterdir()}
    assert names == {"report.md", "results.csv", "summary.json", "loss_vs_params.png", "advantage.png", "curves.png"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reference"] == "review" and summary["baselines"] == ["standard", "highway_convex"]
    assert summary["options"]["extrapolate"] == [7e9, 70e9]
    assert summary["runs"] == {"total": 19, "included": 18, "ok": 18, "flagged": 1, "unfinished": 0, "unusable": 0}
    assert summary["plots"]["curves.png"]["series"] == [6, 6, 7, 6, 6, 7]
    # every size has 2 seeds a side: the trend is weighted by 1/SE², numpy.polyfit takes 1/SE
    x, y, se = [], [], []
    for size, params, _ in SIZES:
        r, b = np.array(REVIEW[size]), np.array(STANDARD[size])
        x.append(np.log10(params))
        y.append(b.mean() - r.mean())
        se.append(np.sqrt(r.var(ddof=1) / 2 + b.var(ddof=1) / 2))
    trend = summary["trends"]["standard"]
    assert trend["weighted"] is True
    assert trend["slope"] == pytest.approx(np.polyfit(x, y, 1, w=1 / np.array(se))[0], rel=1e-9)
    assert trend["slope_equal"] == pytest.approx(np.polyfit(x, y, 1)[0], rel=1e-9)
    assert [e["params"] for e in trend["extrapolation"]] == [7e9, 70e9]
    md = (out / "report.md").read_text()
    assert "| Size | review | standard | highway_convex |" in md
    assert "## Flagged runs (excluded from the means)" in md
    assert len((out / "results.csv").read_text().splitlines()) == 1 + 19


def test_default_out_and_reference_without_review(tmp_path, capsys):
    from rrtrain.cli.report import main  # in-process: the subprocess path is covered above

    root = tmp_path / "sw"
    for seed in range(2):
        write_run(root, "tiny", "zeta", seed, 3.0 + 0.01 * seed, 1e6)
        write_run(root, "tiny", "alpha", seed, 3.1 + 0.01 * seed, 1e6)
    assert main([str(root)]) == 0
    assert "4 runs" in capsys.readouterr().out
    summary = json.loads((root / "report" / "summary.json").read_text())
    assert summary["reference"] == "alpha" and summary["baselines"] == ["zeta"]  # no review: first alphabetically


@pytest.mark.parametrize(
    "args, words",
    [
        ([], "SWEEP_DIR"),
        (["{missing}"], "not a directory"),
        (["{empty}"], "no runs"),
        (["{sweep}", "--alpha", "1.5"], "--alpha"),
        (["{sweep}", "--alpha", "abc"], "--alpha"),
        (["{sweep}", "--power", "0"], "--power"),
        (["{sweep}", "--extrapolate", "7e9,seven"], "--extrapolate"),
        (["{sweep}", "--extrapolate", "-5"], "--extrapolate"),
        (["{sweep}", "--effect", "0"], "--effect"),
        (["{sweep}", "--baselines", "standard,nosuch"], "nosuch"),
        (["{sweep}", "--baselines", "standard,"], "--baselines"),
        (["{sweep}", "--reference", "nosuch"], "nosuch"),
        (["{sweep}", "--bogus"], "--bogus"),
    ],
)
def test_bad_input_exits_2_with_one_line(sweep, tmp_path, args, words):
    (tmp_path / "empty").mkdir()
    fill = {"sweep": sweep, "missing": tmp_path / "missing", "empty": tmp_path / "empty"}
    res = report(*[a.format(**fill) for a in args], "--out", tmp_path / "out")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("rrtrain report: error: ") and words in lines[0]
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "out").exists()
