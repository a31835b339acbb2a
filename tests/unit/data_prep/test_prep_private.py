"""A prepared dataset is the user's alone (0700 / 0600 under a shared umask), an OUT someone else can write is
refused in one line, and a dead prep's staging directory is named in a warning and left (nothing proves this
invocation made it). In-process preps of 30 documents; about 2 s."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

from data_prep import atomic
from prep_helpers import prep
from rrtrain.core import files

ARGS = ["--source", "synthetic:stories", "--num-docs", "30", "--seq-len", "32", "--min-val-samples", "4"]


def test_a_dataset_is_the_users_alone_under_a_shared_umask(tmp_path, monkeypatch):
    monkeypatch.delenv(files.GROUP_READ_ENV, raising=False)
    out = tmp_path / "data" / "stories"
    old = os.umask(0o002)
    try:
        assert prep(*ARGS, "--out", str(out)) == 0  # data_prep's own entry: not under a command's umask
    finally:
        os.umask(old)
    made = [tmp_path / "data", out, *out.rglob("*")]
    assert len(made) > 4
    assert {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in made
            if stat.S_IMODE(p.stat().st_mode) != (0o700 if p.is_dir() else 0o600)} == {}


def test_an_out_others_can_write_is_refused_in_one_line(tmp_path, capsys):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o757)
    assert prep(*ARGS, "--out", str(shared / "stories")) == 2
    err = capsys.readouterr().err
    assert f"'{shared}' can be written by others (mode 0757)" in err and err.count("\n") == 1
    assert os.listdir(shared) == []


def test_a_dead_preps_staging_is_named_and_left(tmp_path, capsys):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True, timeout=60)
    name = f".stories.tmp-{atomic._host()}-{int(dead.stdout)}-abc"
    stale = tmp_path / name
    stale.mkdir()
    (stale / "shard").write_text("half a dataset, or a directory someone renamed to this name")
    (stale / files.MARKER).write_text("rrtrain-made-dir-v2 " + "0" * 64 + "\n")  # the dead process's marker
    atomic.remove_stale_staging(str(tmp_path), "stories")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"kept the staging directory of a prep that is gone, {stale}: " in err
    assert (stale / "shard").is_file()
