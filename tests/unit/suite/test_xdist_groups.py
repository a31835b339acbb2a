"""`make test`'s `--dist loadgroup` scheduler (tests/xdist_groups.py): tests of one `xdist_group` run on one
worker, in collection order, the others spread, on whatever pytest and pytest-xdist are installed (pytest 9.2
dropped the node-id rewrite pytest-xdist's own loadgroup relies on). A pytest of its own on two workers (as
`make test-fast` runs; `make test` runs three: each worker more is an interpreter more, and two already show a
group kept whole on one of them while the rest spread) over dummy files in a temporary folder. Runtime: about 5 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from trainutil import REPO

TESTS = REPO / "tests"

CONFTEST = f'''
import sys
sys.path.insert(0, {str(TESTS)!r})
import pytest
import xdist_groups

def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in ("test_a.py", "test_b.py"):
            item.add_marker(pytest.mark.xdist_group("cluster"))

@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    xdist_groups.configure_node(node.config, node)

@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    return xdist_groups.GroupScheduling(config, log) if config.getvalue("dist") == "loadgroup" else None

@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session):
    xdist_groups.write_groups(session)

def pytest_unconfigure(config):
    xdist_groups.unconfigure(config)
'''

DUMMY = '''
import json, os, time

def record(name):
    with open(os.environ["RECORD"], "a") as f:
        f.write(json.dumps({"test": name, "worker": os.environ["PYTEST_XDIST_WORKER"]}) + "\\n")

'''


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> list[dict]:
    root = tmp_path_factory.mktemp("dummy")
    (root / "conftest.py").write_text(CONFTEST)
    (root / "pytest.ini").write_text("[pytest]\n")
    for name in "abcdef":
        body = "".join(f"def test_{name}{i}():\n    record('{name}{i}')\n\n" for i in range(4))
        (root / f"test_{name}.py").write_text(DUMMY + body)
    record = root / "record.jsonl"
    # pytest-xdist alone of the installed plugins (the others cost each of the three interpreters seconds of imports)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "xdist", "-n", "2",
                           "--dist", "loadgroup", "--rootdir", str(root), "-c", str(root / "pytest.ini"), str(root)],
                          cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RECORD": str(record), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "24 passed" in proc.stdout, proc.stdout[-2000:]
    return [json.loads(line) for line in record.read_text().splitlines()]


def test_a_group_runs_whole_on_one_worker_in_order(ran):
    grouped = [r for r in ran if r["test"][0] in "ab"]
    assert len(grouped) == 8 and len({r["worker"] for r in grouped}) == 1
    assert [r["test"] for r in grouped] == [f"{f}{i}" for f in "ab" for i in range(4)]


def test_every_test_runs_once_and_the_rest_spread(ran):
    assert sorted(r["test"] for r in ran) == sorted(f"{f}{i}" for f in "abcdef" for i in range(4))
    assert len({r["worker"] for r in ran}) >= 2  # not everything on the group's worker
