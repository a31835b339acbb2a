"""The repository stands alone: no file in it points at design notes that are not in it. What the code relies
on (the rules' equations and hand-worked vectors, the run-directory contract, published throughput figures) is
in docs/, in the project's own words."""

from __future__ import annotations

import re
from pathlib import Path
from trainutil import REPO

TRACKED = ("rrtrain", "launchers", "data_prep", "tests", "docs", "configs", "slurm", "tools", ".ci")
TOP = ("README.md", "DEVELOPERS.md", "Makefile", "pyproject.toml")
OUTSIDE = re.compile(r"\b(RESIDUALS|DESIGN|ANCHORS|STYLE)\.md\b|\.\./shared\b|\bseed 00\d\b")


def files() -> list[Path]:
    found = [REPO / name for name in TOP]
    for top in TRACKED:
        found += [p for p in (REPO / top).rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix not in {".png", ".pyc"}]
    return found


def test_no_file_points_outside_the_repository() -> None:
    me = Path(__file__).resolve()
    hits = []
    for path in files():
        if path.resolve() == me:
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{path.relative_to(REPO)}:{n}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)
