"""A residual rule shipped from its own package: the example of docs/residuals.md ("Your own rule"), taken
from the doc as written, is pip-installed into a throwaway virtual environment, found through the
`rrtrain.residuals` entry-point group, trained by `rrtrain train` with its own knob, and passes every
generic check of `rrtrain check-rule`.

The environment sees the project's packages (torch, rrtrain itself) through a `site.addsitedir` line: a venv
made with --system-site-packages would see the base interpreter's packages, not the project venv's. pip runs
with --no-deps --no-build-isolation --no-index, so nothing is downloaded. Runtime: about 45 s of CPU time,
most of it the five short training processes of the resume and FSDP checks (two of them FSDP's ranks)
and the two of the test's own `rrtrain train`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from trainutil import REPO, TINY, env, final

DOC = REPO / "docs" / "residuals.md"
BLOCK = re.compile(r"<!-- external-rule: (\S+) -->\n```\w*\n(.*?)\n```\n", re.S)


def doc_package(out: Path) -> Path:
    """Write the files of the doc's example package; the doc promises a rule in under 60 lines."""
    files = dict(BLOCK.findall(DOC.read_text()))
    assert set(files) == {"pyproject.toml", "rrtrain_scaled.py"}, sorted(files)
    assert sum(len(text.splitlines()) for text in files.values()) < 60
    out.mkdir()
    for name, text in files.items():
        (out / name).write_text(text + "\n")
    return out


def throwaway_venv(root: Path) -> Path:
    """A fresh venv that also sees this interpreter's site-packages; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    py = root / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "project_venv.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    # it finds the project's packages, and no rule `scaled` is registered yet (found, not imported: torch's import
    # is proven by the runs below)
    probe = subprocess.run([str(py), "-c", "import importlib.metadata as m, importlib.util as u; print([n for n in "
                            "('setuptools', 'pip', 'torch', 'rrtrain.residuals') if u.find_spec(n) is None], "
                            "[e.name for e in m.entry_points(group='rrtrain.residuals')])"],
                           capture_output=True, text=True, timeout=300, env=env())
    assert probe.returncode == 0 and probe.stdout.startswith("[] ") and "scaled" not in probe.stdout, \
        probe.stdout + probe.stderr[-2000:]
    return py


def run(py: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(py), *args], cwd=REPO, env=env(), capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_a_rule_from_its_own_package_installs_trains_and_passes_the_checks(tmp_path, stories_data):
    py = throwaway_venv(tmp_path / "venv")
    pip = run(py, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "--quiet",
              str(doc_package(tmp_path / "rrtrain-scaled")))
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-2000:]

    # its knob joins model.residual: an unknown key names it as the closest
    bad = run(py, "-m", "rrtrain", "train", TINY, "model.variant=scaled", "model.residual.scaled_int=0.3")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "did you mean 'model.residual.scaled_init'?" in bad.stderr

    out = tmp_path / "run"
    proc = run(py, "-m", "rrtrain", "train", TINY, "model.variant=scaled", "model.residual.scaled_init=0.3",
               f"data.path={stories_data}", f"run.dir={out}", "train.max_steps=3", "train.log_every=1",
               "train.eval_every=0", "train.ckpt_every=0", "train.global_batch=8", "train.micro_batch=8",
               "data.eval_batches=1")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert final(out)["status"] == "completed"
    assert "scaled_init: 0.3" in (out / "config.yaml").read_text()

    checks = run(py, "-m", "rrtrain", "check-rule", "scaled", "--data", str(stories_data), "--json")
    report = json.loads(checks.stdout)
    assert checks.returncode == 0 and report["passed"], checks.stdout[-3000:] + checks.stderr[-2000:]
    assert [c["check"] for c in report["checks"]] == ["sanity", "params", "compile", "resume", "fsdp"]
