"""torch.compile's cache is the user's own: inductor loads pickled graphs and compiled modules from
TORCHINDUCTOR_CACHE_DIR, whose default (/tmp/torchinductor_USER) is a name in a shared directory that torch uses
whoever made it. A run that compiles points it at a directory only the user can write first
(`private_compile_cache`); one someone else could write (one the user set, or the user's own name opened up) is
refused in one line, and the name made first by a co-tenant is left to them (a directory of the user's own is
used instead). Torch writes its own default into TORCHINDUCTOR_CACHE_DIR when it first asks for its cache: that is
not the user's choice. Nothing is compiled here (a CPU compile takes tens of seconds)."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile

import pytest
import torch
from torch._inductor.runtime import cache_dir_utils

from rrtrain.core.errors import UsageError
from rrtrain.parallel.compile_policy import (CACHE_ENV, TRITON_CACHE_ENV, default_compile_cache,
                                             private_compile_cache, resolve_compile)


@pytest.fixture(autouse=True)
def no_cache_settings(monkeypatch, tmp_path):
    """Neither cache variable set (what a user who never heard of them has); restored after each test. The temp
    dir (where torch's default and ours lie) and the home (where a redirect is recorded) are the test's own."""
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.delenv(TRITON_CACHE_ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    from torch._inductor import codecache, config

    for name in ("_HEADER_DIR", "_HEADER_LOCK_DIR"):  # pointed into the test's cache: given back after it
        if hasattr(codecache, name):
            monkeypatch.setattr(codecache, name, getattr(codecache, name))
    headers = config.cpp_cache_precompile_headers  # a torch config module: not for monkeypatch's undo
    yield
    config.cpp_cache_precompile_headers = headers


def one_line_refusal(err: pytest.ExceptionInfo, path: object, name: str) -> None:
    text = str(err.value)
    assert "\n" not in text and str(path) in text and name in text, text


def test_the_default_cache_is_a_private_directory_torch_is_pointed_at(tmp_path):
    path = private_compile_cache(root=str(tmp_path))
    assert path == default_compile_cache(str(tmp_path)) == os.environ[CACHE_ENV]
    assert path != os.path.join(str(tmp_path), f"torchinductor_{os.environ.get('USER', 'root')}")
    st = os.lstat(path)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


@pytest.mark.parametrize("planted", ["group-writable", "a file"])
def test_the_users_own_name_opened_to_others_is_refused(tmp_path, planted):
    """Made by the user (or root) but not as rrtrain makes it: something else put it there; nothing is loaded."""
    path = default_compile_cache(str(tmp_path))
    if planted == "a file":
        open(path, "w").close()
    else:
        os.mkdir(path)
        os.chmod(path, 0o777)
    with pytest.raises(UsageError) as err:
        private_compile_cache(root=str(tmp_path))
    one_line_refusal(err, path, CACHE_ENV)
    assert CACHE_ENV not in os.environ


@pytest.mark.parametrize("mode", [0o700, 0o777], ids=["0700", "0777"])
def test_the_name_made_first_by_another_user_stops_nothing(tmp_path, mode):
    """A co-tenant who made the (predictable) name first gets nothing loaded from it and fails no run: the user's
    processes on the host use one fresh private directory beside it instead."""
    path = default_compile_cache(str(tmp_path))
    os.mkdir(path)
    os.chmod(path, mode)
    os.chown(path, 12345, 12345)
    used = private_compile_cache(root=str(tmp_path))
    assert used != path and os.path.dirname(used) == str(tmp_path) and os.environ[CACHE_ENV] == used
    st = os.lstat(used)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700
    assert private_compile_cache(root=str(tmp_path)) == used


def test_torchs_own_default_in_the_environment_is_not_the_users_choice():
    """Torch's cache_dir() (called when torch._dynamo is imported: the first optimizer step, or importing
    torch._inductor.config) writes /tmp/torchinductor_USER into TORCHINDUCTOR_CACHE_DIR: that shared name must not
    be taken for the user's setting, and inductor then reads the private directory from the variable."""
    torch_default = cache_dir_utils.cache_dir()  # what torch's import does
    assert os.environ[CACHE_ENV] == torch_default == cache_dir_utils.default_cache_dir()
    path = private_compile_cache()
    assert path == default_compile_cache() != torch_default
    assert cache_dir_utils.cache_dir() == path  # where inductor (and, under it, Triton) now keeps its files


def test_precompiled_headers_are_kept_in_the_private_cache(tmp_path):
    """Inductor's CPU path precompiles headers into a directory torch fixes at import from its shared default,
    whatever TORCHINDUCTOR_CACHE_DIR says: a compiling run points that into its private cache too."""
    from torch._inductor import codecache, config

    assert f"{os.sep}torchinductor_" in codecache._HEADER_DIR  # torch 2.14, left to itself: its shared default
    path = private_compile_cache(root=str(tmp_path))
    if config.cpp_cache_precompile_headers:
        assert codecache._HEADER_DIR.startswith(path + os.sep)
        assert codecache._HEADER_LOCK_DIR.startswith(path + os.sep)


def test_an_eager_run_is_not_stopped_by_a_file_at_torchs_default_name(tmp_path):
    """Torch makes its cache directory when the first optimizer step imports torch._dynamo, compiled or not: a
    file a co-tenant planted at /tmp/torchinductor_USER crashed every run there. Every run points the variable at
    its private directory first (`resolve_compile`, whatever train.compile says)."""
    planted = cache_dir_utils.default_cache_dir()
    open(planted, "w").close()
    with pytest.raises(FileExistsError):
        cache_dir_utils.cache_dir()  # torch, left to itself
    del os.environ[CACHE_ENV]
    assert resolve_compile(False, torch.device("cpu"), 10) is False
    assert cache_dir_utils.cache_dir() == default_compile_cache()  # torch's import now finds a directory of ours
    assert os.path.isfile(planted)


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
