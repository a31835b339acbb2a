"""Private by construction, and deletion only of what is proven (docs/reliability.md, "Security").

What the file layer makes is 0700 / 0600 under any umask (0750 / 0640 with RRTRAIN_GROUP_READ=1); a place
someone else can write, on the way to it included, is refused in one line (StrictModes); a marker proves
only what this very process made at that very place: a copied marker, a renamed directory and another
process's marker prove nothing. The suite runs as root, so the refusals are of modes, not of permissions.
Runtime: about 2 s (one small Python subprocess)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rrtrain.core import files, io as rrio
from rrtrain.core.errors import UsageError
from trainutil import REPO


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture(params=[0o002, 0o022])
def loose_umask(request):
    """A shared project's umask (002) and the usual one (022): neither may widen what rrtrain makes."""
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def made_by_the_layer(root: Path) -> dict[str, Path]:
    """One of each thing the file layer creates, under `root`."""
    out = {"make_dir": Path(files.make_dir(root / "a" / "made")), "make_dirs": Path(files.make_dirs(root / "b" / "c")),
           "make_temp_dir": Path(files.make_temp_dir("t-", root))}
    files.atomic_write_file(root / "d" / "atomic.json", "{}")
    out["atomic_write_file"], out["its parent"] = root / "d" / "atomic.json", root / "d"
    files.atomic_write_beneath(root, "e/f/beneath.txt", b"x")
    out["atomic_write_beneath"], out["made on the way"] = root / "e" / "f" / "beneath.txt", root / "e" / "f"
    with files.open_append(root / "appended.log") as log:
        log.write("line\n")
    out["open_append"] = root / "appended.log"
    os.close(files.open_lock_file(root / "x.lock"))
    out["open_lock_file"] = root / "x.lock"
    with rrio.atomic_path(root / "g" / "plot.png") as tmp:
        tmp.write_bytes(b"png")  # as a library writes it: with its own open()
    out["atomic_path"] = root / "g" / "plot.png"
    assert rrio.unwritable_reason(root / "h" / "run") is None
    out["unwritable_reason's directory"] = root / "h" / "run"
    return out


def test_what_the_layer_makes_is_the_users_alone_whatever_the_umask(tmp_path, loose_umask, monkeypatch):
    monkeypatch.delenv(files.GROUP_READ_ENV, raising=False)
    for what, path in made_by_the_layer(tmp_path).items():
        want = 0o700 if path.is_dir() else 0o600
        assert mode(path) == want, f"{what}: {path} is {mode(path):04o} under umask {loose_umask:03o}"


def test_group_read_gives_the_group_read_never_write(tmp_path, loose_umask, monkeypatch):
    monkeypatch.setenv(files.GROUP_READ_ENV, "1")
    for what, path in made_by_the_layer(tmp_path).items():
        want = 0o750 if path.is_dir() else 0o640
        assert mode(path) == want, f"{what}: {path} is {mode(path):04o}"
    monkeypatch.setenv(files.GROUP_READ_ENV, "yes")
    with pytest.raises(UsageError, match="RRTRAIN_GROUP_READ='yes': set it to 1"):
        files.dir_mode()


def test_set_private_modes_takes_back_what_a_library_gave_away(tmp_path, loose_umask, monkeypatch):
    monkeypatch.delenv(files.GROUP_READ_ENV, raising=False)
    top = tmp_path / "staged"
    (top / "sub").mkdir(parents=True, mode=0o777)
    (top / "sub").chmod(0o777)
    (top / "model.safetensors").write_bytes(b"w")
    (top / "model.safetensors").chmod(0o666)
    (top / "run.sh").write_text("#!/bin/sh\n")
    (top / "run.sh").chmod(0o775)
    outside = tmp_path / "outside"
    outside.write_text("not ours")
    outside.chmod(0o644)
    (top / "link").symlink_to(outside)
    files.set_private_modes(top)
    assert [mode(top), mode(top / "sub"), mode(top / "model.safetensors"), mode(top / "run.sh")] == \
        [0o700, 0o700, 0o600, 0o700]
    assert mode(outside) == 0o644  # what a link names is never changed


def test_a_command_runs_under_the_private_umask_and_gives_the_old_one_back(tmp_path, loose_umask, monkeypatch):
    from rrtrain.core.command import run_command

    monkeypatch.delenv(files.GROUP_READ_ENV, raising=False)

    def entry(argv: list[str]) -> int:  # what a library does: open() with the umask's modes
        (tmp_path / "lib").mkdir()
        (tmp_path / "lib" / "event").write_text("x")
        return 0

    assert run_command("rrtrain test", entry, []) == 0
    assert mode(tmp_path / "lib") == 0o700 and mode(tmp_path / "lib" / "event") == 0o600
    assert files.umask() == loose_umask


# -- the StrictModes check ----------------------------------------------------------------------------


def test_the_suites_own_temporary_directories_pass(tmp_path):
    assert files.private_path_problem(tmp_path) is None  # /tmp is sticky, pytest-of-root 0700 above it
    assert files.private_path_problem(tmp_path / "not" / "made" / "yet") is None
    files.check_private_path(tmp_path)


@pytest.mark.parametrize("loose, who", [(0o775, "its group"), (0o757, "others"), (0o777, "its group and others")])
def test_a_directory_others_can_write_is_refused_even_as_root(tmp_path, loose, who):
    shared = tmp_path / "project"
    shared.mkdir()
    shared.chmod(loose)
    for target in (shared, shared / "run", shared / "run" / "deeper"):
        assert files.private_path_problem(target) == f"'{shared}' can be written by {who} (mode {loose:04o})"
    with pytest.raises(UsageError, match=r"^run.dir: '.*project' can be written by .*no one else can write"):
        files.check_private_path(shared / "run", "run.dir")
    assert "\n" not in files.private_path_refusal(shared / "run")
    assert "can be written" in rrio.unwritable_reason(shared / "run") and not (shared / "run").exists()


def test_a_sticky_directory_is_fine_above_the_users_own_but_not_as_the_place_itself(tmp_path):
    sticky = tmp_path / "scratch"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "mine").mkdir()
    assert files.private_path_problem(sticky / "mine" / "run") is None
    assert files.private_path_problem(sticky / "new") is None  # still to be made: its maker checks it then
    assert "can be written by its group and others (mode 1777)" in files.private_path_problem(sticky)


def test_a_link_is_judged_where_it_lies_and_where_it_leads(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    mine = tmp_path / "mine"
    mine.mkdir()
    (shared / "to-mine").symlink_to(mine)
    (mine / "to-shared").symlink_to(shared)
    shared.chmod(0o777)
    assert "'" + str(shared) + "' can be written" in files.private_path_problem(shared / "to-mine" / "run")
    assert "'" + str(shared) + "' can be written" in files.private_path_problem(mine / "to-shared" / "run")
    assert files.private_path_problem(mine / "run") is None


def test_a_place_of_another_user_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)  # nobody (the suite runs as root)
    assert files.private_path_problem(theirs / "run") == f"'{theirs}' belongs to another user (uid 65534)"


# -- deletion only of what this invocation can prove it made ------------------------------------------


def test_a_copied_marker_proves_nothing(tmp_path):
    made = Path(files.make_dir(tmp_path / "made"))
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / files.MARKER).write_bytes((made / files.MARKER).read_bytes())
    assert "does not prove" in (files.made_here(plain) or "proven")
    with pytest.raises(files.NotMade):
        files.remove_made_dir(plain)
    assert plain.is_dir()


def test_a_renamed_marked_directory_is_not_deleted(tmp_path):
    """The old marker named the inode, which a rename keeps: a user's export renamed to the name of stale
    staging was deleted by the clean-up. The marker now names the place as well."""
    made = Path(files.make_dir(tmp_path / ".out.tmp-host-1-abc"))
    (made / "model.safetensors").write_bytes(b"the user's")
    kept = tmp_path / "my-export"
    made.rename(kept)
    assert "does not prove" in (files.made_here(kept) or "proven")
    assert files.discard_made_dir(kept) is not None and (kept / "model.safetensors").is_file()
    kept.rename(made)  # and back where it was made, it is this invocation's again
    assert files.discard_made_dir(made) is None and not made.exists()


def test_a_marker_written_by_another_process_proves_nothing(tmp_path):
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "data").write_text("theirs")
    code = "import sys; from rrtrain.core import files; files.mark_made(sys.argv[1])"
    subprocess.run([sys.executable, "-c", code, str(planted)], cwd=REPO, check=True, timeout=120)
    assert (planted / files.MARKER).is_file()
    assert "does not prove" in (files.made_here(planted) or "proven")
    assert files.discard_made_dir(planted) is not None and (planted / "data").read_text() == "theirs"


def test_a_durable_key_proves_what_an_earlier_invocation_made_there_and_nothing_else(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    root.mkdir()
    key = files.directory_key(root)
    assert files.directory_key(root) == key and mode(root / files.KEY_FILE) == 0o600
    made = Path(files.make_dir(root / "step_1", key=key))
    monkeypatch.setattr(files, "_PROCESS_KEY", os.urandom(32))  # a later invocation: another process key
    assert files.made_here(made) is not None  # not under the process key
    assert files.made_here(made, key=key) is None  # under the directory's own
    other = tmp_path / "other"
    other.mkdir()
    assert files.made_here(made, key=files.directory_key(other)) is not None
    (root / files.KEY_FILE).chmod(0o640)
    with pytest.raises(UsageError, match="not a key of yours that only you can read"):
        files.directory_key(root)


def test_replace_dir_deletes_the_old_target_only_when_proven_for_that_place(tmp_path, capsys):
    out = tmp_path / "out"
    staging = Path(files.make_temp_dir(".out.tmp_", tmp_path))
    (staging / "v").write_text("1")
    rrio.replace_dir(staging, out)  # marked for `out`, by this process
    staging = Path(files.make_temp_dir(".out.tmp_", tmp_path))
    (staging / "v").write_text("2")
    rrio.replace_dir(staging, out)  # the old one is proven: deleted
    assert (out / "v").read_text() == "2" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    elsewhere = tmp_path / "elsewhere"
    out.rename(elsewhere)  # a directory marked for `out`, now under another name
    staging = Path(files.make_temp_dir(".e.tmp_", tmp_path))
    rrio.replace_dir(staging, elsewhere)  # replacing it there: its marker was made for `out`, not kept proof
    assert "kept" in capsys.readouterr().err
    assert sum((p / "v").is_file() for p in tmp_path.iterdir()) == 1  # the moved one kept beside, whole
