"""Every Python child rrtrain starts imports nothing from the directory it runs in (rrtrain.core.child_python):
Python puts the current directory first on sys.path for `python -m X`, so a co-tenant who can write where the
user runs rrtrain would otherwise run code as the user with a planted package named like the child's module
(`tensorboard/`, `data_prep/`, `rrtrain/`). Shown on real child starts with a planted package in the working
directory: the helper's command line (3.11's `-P`, and 3.10's bootstrap line run on this interpreter), what the
child starts in turn (PYTHONSAFEPATH), and a prep task's launch by the local executor; and, structurally, that
no other code of rrtrain builds a Python command line of its own."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from data_prep.cluster import PrepTask
from launchers.executors.base import SubmitError
from launchers.executors.local import run_array
from rrtrain.core.child_python import HAS_SAFE_PATH, child_env, module_argv, script_argv

REPO = Path(__file__).resolve().parents[4]


def plant(where: Path, package: str) -> Path:
    """`where/package/__init__.py` that leaves a marker when imported; the marker's path."""
    marker = where / f"ran-{package}"
    (where / package).mkdir()
    (where / package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    return marker


def test_the_plant_runs_under_a_plain_python_m(tmp_path):
    """The attack the helper stops: `python -m json.tool` in a directory holding `json/` runs it."""
    marker = plant(tmp_path, "json")
    subprocess.run([sys.executable, "-m", "json.tool"], input=b"{}", cwd=tmp_path, capture_output=True, timeout=30)
    assert marker.exists()


@pytest.mark.parametrize("safe_path", [True, False], ids=["-P", "3.10 bootstrap"])
def test_a_child_imports_nothing_from_its_working_directory(tmp_path, safe_path):
    if safe_path and not HAS_SAFE_PATH:
        pytest.skip("Python 3.10 has no -P")
    marker = plant(tmp_path, "json")
    proc = subprocess.run(module_argv("json.tool", "--sort-keys", safe_path=safe_path), input='{"b": 1, "a": 2}',
                          cwd=tmp_path, capture_output=True, text=True, timeout=30, env=child_env())
    assert proc.returncode == 0 and proc.stdout.split() == ["{", '"a":', "2,", '"b":', "1", "}"], proc.stderr
    assert not marker.exists()


@pytest.mark.skipif(not HAS_SAFE_PATH, reason="Python 3.10 has no PYTHONSAFEPATH")
def test_what_a_child_starts_in_turn_imports_nothing_from_there_either(tmp_path):
    """torchrun's workers (`python -u -m rrtrain.train`) and multiprocessing's spawned processes are started by
    command lines rrtrain does not build: the environment every child gets covers them."""
    marker = plant(tmp_path, "json")
    subprocess.run([sys.executable, "-m", "json.tool"], input=b"{}", cwd=tmp_path, capture_output=True, timeout=30,
                   env=child_env())
    assert not marker.exists()


def test_a_prep_task_started_by_the_local_executor_runs_no_planted_data_prep(tmp_path, monkeypatch):
    """`rrtrain prep --executor local --tasks N` from a directory holding `data_prep/`: the task (which fails
    at once here, on a work directory that holds no plan) ran the real data_prep."""
    cwd = tmp_path / "project"
    cwd.mkdir()
    marker = plant(cwd, "data_prep")
    monkeypatch.chdir(cwd)
    with pytest.raises(SubmitError) as err:
        run_array(PrepTask(str(tmp_path / "no-plan")), 1, sys.executable, tmp_path / "logs", 1, "prep")
    assert "not a prep plan" in str(err.value) or "no-plan" in str(err.value), str(err.value)
    assert not marker.exists()


@pytest.mark.parametrize("safe_path", [True, False] if HAS_SAFE_PATH else [False])
def test_a_script_started_by_rrtrain_imports_nothing_from_beside_itself(tmp_path, safe_path):
    """`script_argv` (the local executor's warm server): a package planted beside the script, and in the directory
    it runs in, is not what it imports (-P; the 3.10 form, as 3.10 runs it, without PYTHONSAFEPATH: the current
    directory dropped from sys.path, and the script's folder never put there)."""
    marker = plant(tmp_path, "yaml")
    (tmp_path / "script.py").write_text("import sys, yaml\nprint(sys.argv[1:], yaml.__name__)\n")
    env = child_env() if safe_path else {k: v for k, v in child_env().items() if k != "PYTHONSAFEPATH"}
    proc = subprocess.run(script_argv(str(tmp_path / "script.py"), "a", "b", safe_path=safe_path),
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0 and proc.stdout.split() == ["['a',", "'b']", "yaml"], proc.stderr
    assert not marker.exists()


def python_argv_literals(path: Path) -> list[str]:
    """The list and tuple literals of a module that hold `-m` or `-c` or `sys.executable`: a Python command line
    built by hand (`-I -c`, isolated, is fine: it ignores the working directory and the environment)."""
    found: list[str] = []
    text = path.read_text()
    if not any(s in text for s in ('"-m"', "'-m'", '"-c"', "'-c'", "sys.executable")):
        return found  # nothing to look at closer (most modules): the parse is the cost
    for node in ast.walk(ast.parse(text, str(path))):
        if not isinstance(node, (ast.List, ast.Tuple)):
            continue
        consts = {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        named = any("sys.executable" in ast.unparse(e) for e in node.elts)
        if ({"-m", "-c"} & consts or named) and "-I" not in consts:
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_every_python_command_line_comes_from_the_one_helper():
    helper = REPO / "rrtrain" / "core" / "child_python.py"
    found = [hit for root in ("rrtrain", "launchers", "data_prep") for path in sorted((REPO / root).rglob("*.py"))
             if path != helper for hit in python_argv_literals(path)]
    assert not found, "build it with rrtrain.core.child_python.module_argv:\n" + "\n".join(found)


def test_prep_workers_spawned_by_multiprocessing_run_no_planted_package(tmp_path, monkeypatch):
    """`rrtrain prep --workers 2` from a directory holding `multiprocessing/`: the pool's workers start as
    `python -c 'from multiprocessing.spawn import ...'` there, which would import the plant first."""
    from data_prep.encode import encode_chunks
    from data_prep.tokenizer import ByteTokenizer

    marker = plant(tmp_path, "multiprocessing")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONSAFEPATH", raising=False)
    encoded = list(encode_chunks([["ab"], ["c"]], ByteTokenizer(), None, workers=2))
    assert [[a.tolist() for a in arrays] for _, arrays in encoded] == \
        [[a.tolist() for a in ByteTokenizer().encode_batch(t)] for t in (["ab"], ["c"])]
    assert not marker.exists()
