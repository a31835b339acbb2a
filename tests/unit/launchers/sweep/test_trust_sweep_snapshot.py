"""The sweep's code snapshot runs in every run, so sweep.json never chooses it: the recorded snapshot is used only
where rrtrain puts one and only while every entry under it (anything Python might import or execute) hashes to
what was recorded and is the user's own; otherwise `rrtrain sweep` refuses in one line, exit 2. An untouched
snapshot, imported from as runs import from it, is still reused."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from launchers.sweep import record, snapshot
from rrtrain.core.errors import UsageError
from sweeputil import write_record
from trainutil import PY, REPO


def _sweep_file(tmp_path: Path) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"name": "g", "config": str(REPO / "configs/train/tiny.yaml"), "data": "/data/x",
                                 "variants": ["review"], "sizes": {"tiny": {"seeds": 1}},
                                 "overrides": {"train": {"max_steps": 4}}}))
    return p


def _taken(out: Path) -> dict:
    """A snapshot taken and recorded in sweep.json, as a submission leaves it."""
    out.mkdir(parents=True)
    entry = snapshot.take(out, None)
    write_record(out, {"version": 1, "name": "g", "runs": {}, "submissions": [], "code": entry})
    return entry


def _plant(code: Path, kind: str) -> None:
    if kind == "sitecustomize":
        (code / "sitecustomize.py").write_text("import os; os.system('touch /tmp/owned')\n")
    elif kind == "pth":
        (code / "evil.pth").write_text("import os\n")
    elif kind == "dist_info":
        (code / "evil-1.0.dist-info").mkdir()
        (code / "evil-1.0.dist-info" / "entry_points.txt").write_text("[rrtrain.residuals]\nx = evil:X\n")
    elif kind == "pyc":
        (code / "rrtrain" / "__pycache__").mkdir(exist_ok=True)
        (code / "rrtrain" / "__pycache__" / "config.cpython-311.pyc").write_bytes(b"\x00" * 32)
    elif kind == "shadow":
        (code / "yaml.py").write_text("raise SystemExit('shadowed')\n")
    elif kind == "edited":
        with (code / "rrtrain" / "config.py").open("a") as fh:
            fh.write("\nimport os\n")
    elif kind == "mode":
        (code / "rrtrain" / "config.py").chmod(0o666)
    elif kind == "link":
        target = code / "rrtrain" / "config.py"
        (code.parent / "elsewhere.py").write_bytes(target.read_bytes())
        target.unlink()
        target.symlink_to(code.parent / "elsewhere.py")


KINDS = ["sitecustomize", "pth", "dist_info", "pyc", "shadow", "edited", "mode", "link"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_planted_snapshot_is_refused(tmp_path, kind):
    out = tmp_path / "sweep"
    entry = _taken(out)
    _plant(out / "code", kind)
    with pytest.raises(UsageError, match="code snapshot is not what was taken") as err:
        snapshot.take(out, entry)
    assert "\n" not in str(err.value)


def test_rrtrain_sweep_refuses_it_in_one_line_exit_2(tmp_path, capsys, monkeypatch):
    """`rrtrain sweep` in this process (the command's main)."""
    from rrtrain.cli.main import main

    out = tmp_path / "sweep"
    _taken(out)
    _plant(out / "code", "sitecustomize")
    monkeypatch.chdir(tmp_path)
    code = main(["sweep", str(_sweep_file(tmp_path)), "--out", str(out), "--dry-run"])
    got = capsys.readouterr()
    assert code == 2, got.out + got.err
    assert len(got.err.strip().splitlines()) == 1 and "code snapshot is not what was taken" in got.err


def test_sweep_json_never_chooses_the_code(tmp_path):
    out = tmp_path / "sweep"
    entry = _taken(out)
    evil = out / "evil"  # inside the sweep, hashed by whoever planted it: still not where rrtrain puts code
    evil.mkdir()
    (evil / "sitecustomize.py").write_text("print('owned')\n")
    forged = {**entry, "path": str(evil), "sha256": snapshot.tree_hash(evil)}
    with pytest.raises(UsageError, match="not where rrtrain puts one"):
        snapshot.take(out, forged)
    (out / "code-link").symlink_to(out / "code")  # a name that leads to the snapshot: the derived place is used
    assert snapshot.take(out, {**entry, "path": str(out / "code-link")})["path"] == entry["path"]


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user needs root")
def test_a_snapshot_another_user_made_is_refused(tmp_path):
    out = tmp_path / "sweep"
    entry = _taken(out)
    os.chown(out / "code" / "rrtrain" / "config.py", 12345, 12345)  # the same bytes, someone else's file
    with pytest.raises(UsageError, match="not yours"):
        snapshot.take(out, entry)


def test_an_untouched_snapshot_is_reused_after_runs_imported_from_it(tmp_path):
    out = tmp_path / "sweep"
    entry = _taken(out)
    assert entry["hash"] == snapshot.HASH_KIND and entry["path"] == str((out / "code").resolve())
    env = {**os.environ, "PYTHONPATH": entry["path"], **snapshot.NO_BYTECODE}
    subprocess.run([PY, "-c", "import rrtrain.config, launchers.executors.entry"], env=env, cwd=entry["path"], check=True)
    assert snapshot.take(out, entry) == entry
    assert snapshot.take(out, record.load(out).code) == entry


def test_an_unrecorded_code_directory_that_differs_is_never_used(tmp_path):
    out = tmp_path / "sweep"
    out.mkdir()
    first = snapshot.take(out, None)
    _plant(out / "code", "sitecustomize")  # sweep.json lost: `code` is not reused, a fresh copy goes beside it
    other = snapshot.take(out, None)
    assert other["path"] == str((out / f"code-{first['sha256'][:12]}").resolve())
    assert not (Path(other["path"]) / "sitecustomize.py").exists()


def test_a_snapshot_recorded_by_an_older_rrtrain_is_replaced_not_trusted(tmp_path, capsys):
    out = tmp_path / "sweep"
    entry = _taken(out)
    _plant(out / "code", "pyc")  # the older hash skipped __pycache__: it cannot vouch for this
    old = {k: v for k, v in entry.items() if k != "hash"}
    fresh = snapshot.take(out, old)
    assert fresh["path"] != entry["path"] and not (Path(fresh["path"]) / "rrtrain" / "__pycache__").exists()
    assert "older rrtrain" in capsys.readouterr().out
    assert json.loads((out / "sweep.json").read_text())["code"] == entry  # the record is the caller's to write
