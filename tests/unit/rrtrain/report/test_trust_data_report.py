"""`rrtrain report` writes only into a directory of its own: a `SWEEP/report` (or `--out`) that is a symbolic link is
refused in one line, exit 2, and nothing is written where it points; the files are written beneath the opened
directory, never through a link at their names, even when the directory is swapped for a link meanwhile.
Budget: about 10 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rrtrain.core.errors import UsageError
from trainutil import REPO, env


def write_run(root: Path, variant: str, seed: int, loss: float) -> None:
    d = root / "tiny" / f"{variant}-{seed}"
    d.mkdir(parents=True)
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": loss + 1.0 / (s + 1)}) + "\n"
                                             for s in range(10)) + json.dumps({"step": 9, "val_loss": loss}) + "\n")
    (d / "final.json").write_text(json.dumps({
        "status": "completed", "step": 10, "tokens": 1000, "final_val_loss": loss, "best_val_loss": loss,
        "params": 1e6, "variant": variant, "size": "tiny", "seed": seed, "wall_s": 1.0, "flags": []}))


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    root = tmp_path / "sweep"
    for seed in range(2):
        write_run(root, "review", seed, 3.0 + 0.01 * seed)
        write_run(root, "standard", seed, 3.02 + 0.01 * seed)
    return root


def report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rrtrain", "report", *args], cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=120)


def test_a_report_dir_that_is_a_link_is_refused(sweep, tmp_path):
    """The default SWEEP/report planted as a link sent the report's six files wherever it pointed."""
    victim = tmp_path / "docs"
    victim.mkdir()
    (victim / "report.md").write_text("mine\n")
    (sweep / "report").symlink_to(victim)
    res = report(str(sweep))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().count("\n") == 0 and "is a symbolic link" in res.stderr
    assert sorted(p.name for p in victim.iterdir()) == ["report.md"] and (victim / "report.md").read_text() == "mine\n"


def test_a_report_dir_that_is_a_loop_of_links_is_one_line(sweep, capsys):
    from rrtrain.cli.report import main

    (sweep / "report").symlink_to(sweep / "report")
    with pytest.raises(UsageError, match="is a symbolic link"):
        main([str(sweep)])


def test_files_are_written_beneath_the_opened_directory(sweep, tmp_path):
    """A link planted at a file's name is replaced, not written through; a directory swapped for a link after it
    was opened redirects nothing."""
    from rrtrain.cli.report import main, output_dir

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "bashrc").write_text("mine\n")
    out = sweep / "report"
    out.mkdir()
    (out / "report.md").symlink_to(victim / "bashrc")
    assert main([str(sweep)]) == 0
    assert (victim / "bashrc").read_text() == "mine\n"
    assert (out / "report.md").is_file() and not (out / "report.md").is_symlink()

    where = output_dir(out)
    os.rename(out, sweep / "moved")
    out.symlink_to(victim)
    (where / "summary.json").write_text("{}")
    assert sorted(p.name for p in victim.iterdir()) == ["bashrc"]
    assert (sweep / "moved" / "summary.json").read_text() == "{}"


@pytest.mark.slow  # a fresh interpreter: matplotlib reads ./matplotlibrc when it is imported (~4 s of CPU)
def test_a_matplotlibrc_in_the_working_directory_draws_nothing_differently(sweep, tmp_path):
    """A co-tenant's `matplotlibrc` where the report is started (a shared directory) asked for LaTeX: the report
    ran `latex` with their preamble, or ended in a traceback where LaTeX is missing; it draws in matplotlib's own
    style instead, the same PNGs as from a directory of the user's own."""
    from rrtrain.core.child_python import module_argv

    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "matplotlibrc").write_text("text.usetex: True\ntext.latex.preamble: \\input{/etc/hostname}\n")
    read = subprocess.run([sys.executable, "-P", "-c", "import matplotlib; print(matplotlib.rcParams['text.usetex'])"],
                          cwd=shared, env=env(), capture_output=True, text=True, timeout=60)
    assert read.stdout.strip() == "True", read.stderr[-2000:]  # matplotlib itself honours the file there
    pngs = {}
    for where in (shared, REPO):
        out = tmp_path / f"report-{where.name}"
        res = subprocess.run(module_argv("rrtrain", "report", str(sweep), "--out", str(out)), cwd=where, env=env(),
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
        pngs[where] = {p.name: p.read_bytes() for p in out.glob("*.png")}
    assert pngs[shared] and pngs[shared] == pngs[REPO]
