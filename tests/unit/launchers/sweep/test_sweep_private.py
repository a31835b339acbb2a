"""A sweep directory is the user's alone: under a shared umask (002) everything a submission writes there (the
record, the runs' configs, the code snapshot, the lock) is 0700 / 0600 (an executable 0700); a sweep
directory, or a snapshot, that someone else can write is refused in one line, before any of its code is
imported. One in-process dry run and one snapshot, about 3 s."""

from __future__ import annotations

import os
import stat

import pytest

from launchers.sweep import snapshot
from rrtrain.cli import sweep as sweep_cli
from rrtrain.core import files
from rrtrain.core.errors import UsageError
from unit.launchers.sweep.test_trust_sweep_snapshot import _sweep_file, _taken


def test_a_sweep_directory_is_the_users_alone_under_a_shared_umask(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(files.GROUP_READ_ENV, raising=False)
    out = tmp_path / "sweep"
    old = os.umask(0o002)
    try:
        assert sweep_cli.main([str(_sweep_file(tmp_path)), "--out", str(out), "--dry-run"]) == 0
    finally:
        os.umask(old)
    made = [out, *out.rglob("*")]
    assert len(made) > 20 and (out / "code").is_dir()
    loose = [f"{p}: {stat.S_IMODE(p.lstat().st_mode):04o}" for p in made
             if not p.is_symlink() and stat.S_IMODE(p.lstat().st_mode) not in (0o700, 0o600)]
    assert loose == []


def test_a_sweep_directory_others_can_write_is_refused_in_one_line(tmp_path):
    shared = tmp_path / "project"
    shared.mkdir()
    shared.chmod(0o775)
    with pytest.raises(UsageError, match=r"cannot be written: '.*project' can be written by its group \(mode 0775\)"):
        sweep_cli.main([str(_sweep_file(tmp_path)), "--out", str(shared / "sweep"), "--dry-run"])
    assert not (shared / "sweep").exists()


def test_a_snapshot_others_can_write_is_refused_before_it_is_used(tmp_path):
    out = tmp_path / "sweep"
    entry = _taken(out)
    (out / "code").chmod(0o770)
    with pytest.raises(UsageError, match="code snapshot: '.*code' can be written by its group"):
        snapshot.take(out, entry)
