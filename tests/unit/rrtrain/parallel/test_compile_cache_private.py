"""torch.compile's cache is the user's own: inductor loads pickled graphs and compiled modules from
TORCHINDUCTOR_CACHE_DIR, whose default (/tmp/torchinductor_USER) is a name in a shared directory that torch uses
whoever made it. A run that compiles points it at a directory only the user can write first
(`private_compile_cache`); one someone else could write, the default name made first by a co-tenant or one the
user set, is refused in one line. Nothing is compiled here (a CPU compile takes tens of seconds)."""

from __future__ import annotations

import os
import shutil
import stat

import pytest
import torch

from rrtrain.core.errors import UsageError
from rrtrain.parallel.compile_policy import (CACHE_ENV, TRITON_CACHE_ENV, default_compile_cache,
                                             private_compile_cache, resolve_compile)


@pytest.fixture(autouse=True)
def no_cache_settings(monkeypatch):
    """Neither cache variable set (what a user who never heard of them has); restored after each test."""
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.delenv(TRITON_CACHE_ENV, raising=False)


def one_line_refusal(err: pytest.ExceptionInfo, path: object, name: str) -> None:
    text = str(err.value)
    assert "\n" not in text and str(path) in text and name in text, text


def test_the_default_cache_is_a_private_directory_torch_is_pointed_at(tmp_path):
    path = private_compile_cache(root=str(tmp_path))
    assert path == default_compile_cache(str(tmp_path)) == os.environ[CACHE_ENV]
    assert path != os.path.join(str(tmp_path), f"torchinductor_{os.environ.get('USER', 'root')}")
    st = os.lstat(path)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


@pytest.mark.parametrize("planted", ["group-writable", "another user's", "a file"])
def test_the_default_name_made_first_by_someone_else_is_refused(tmp_path, planted):
    """A co-tenant who made the (predictable) default name first, writable by them, gets nothing loaded from it."""
    path = default_compile_cache(str(tmp_path))
    if planted == "a file":
        open(path, "w").close()
    else:
        os.mkdir(path)
        os.chmod(path, 0o777) if planted == "group-writable" else os.chown(path, 12345, 12345)
    with pytest.raises(UsageError) as err:
        private_compile_cache(root=str(tmp_path))
    one_line_refusal(err, path, CACHE_ENV)
    assert CACHE_ENV not in os.environ


@pytest.mark.parametrize("name", [CACHE_ENV, TRITON_CACHE_ENV])
def test_a_cache_the_user_set_is_honoured_only_when_private(tmp_path, monkeypatch, name):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)  # group-writable: anyone in the group could plant a graph there
    monkeypatch.setenv(name, str(shared))
    with pytest.raises(UsageError) as err:
        private_compile_cache(root=str(tmp_path))
    one_line_refusal(err, shared, name)
    shared.chmod(0o700)
    path = private_compile_cache(root=str(tmp_path))
    assert path == (str(shared) if name == CACHE_ENV else default_compile_cache(str(tmp_path)))


@pytest.mark.skipif(not any(shutil.which(cc) for cc in ("g++", "c++", "clang++")), reason="no C++ compiler")
def test_a_run_that_compiles_is_refused_a_shared_cache_before_compiling(tmp_path, monkeypatch):
    """Through the trainer's own decision (`resolve_compile`): the cache is checked when compiling is decided."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv(CACHE_ENV, str(shared))
    with pytest.raises(UsageError) as err:
        resolve_compile(True, torch.device("cpu"), 10)
    one_line_refusal(err, shared, CACHE_ENV)
    assert resolve_compile(False, torch.device("cpu"), 10) is False  # eager: no cache looked at
