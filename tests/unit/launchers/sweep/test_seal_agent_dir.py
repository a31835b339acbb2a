"""The multi-node job's directory for the torchrun agents' logs (RRTRAIN_AGENT_DIR) is made by the job side's program
(`seal.py agentdir`), which checks the whole path, not only its last component: a directory of the user's inside one
a co-tenant owns or can write could be swapped for theirs between the script's check and `mktemp`, and the job's log
directory made in theirs. An ancestor owned by another user or writable by others is refused in one line (exit 2),
nothing made; a private path gets its missing components (0700) and a new directory of the job's own, 0700.
Budget: well under 1 s (one `python -I` start for the inline program)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from launchers.sweep import seal

ANOTHER_USER = 12345


def agentdir(capsys, path: Path, prefix: str = "77-0.") -> tuple[int, str, str]:
    status = seal.main(["agentdir", str(path), prefix])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("how", ["group-writable", "another user's", "a file"])
def test_a_path_through_a_directory_others_control_is_refused(tmp_path: Path, capsys, how: str) -> None:
    shared = tmp_path / "shared"
    if how == "a file":
        shared.write_text("")
    else:
        shared.mkdir(mode=0o700)
    if how == "group-writable":
        os.chmod(shared, 0o770)
    elif how == "another user's":
        os.chown(shared, ANOTHER_USER, ANOTHER_USER)
    mine = shared / "alice" / "agents"  # the user's own directories, below the co-tenant's
    if how != "a file":
        mine.mkdir(parents=True, mode=0o700)
    status, out, err = agentdir(capsys, mine)
    why = {"group-writable": "can be written by others than you (mode 0770)",
           "another user's": f"belongs to another user (uid {ANOTHER_USER})", "a file": "is not a directory"}[how]
    assert status == 2 and out == "" and err.count("\n") == 1, (out, err)
    assert err.startswith(f"rrtrain multinode: error: {mine} (the torchrun agents' logs): '{shared}' {why}: "), err
    assert "RRTRAIN_AGENT_DIR" in err
    assert how == "a file" or os.listdir(mine) == []


def test_a_private_path_gets_a_new_directory_of_the_jobs_own(tmp_path: Path, capsys) -> None:
    os.chmod(tmp_path, 0o700)
    agents = tmp_path / "home" / ".rrtrain" / "torchrun"
    status, out, err = agentdir(capsys, agents)
    made = Path(out.strip())
    assert status == 0 and err == "" and made.parent == agents and made.name.startswith("77-0."), (out, err)
    for path in (tmp_path / "home", tmp_path / "home" / ".rrtrain", agents, made):
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o700 and path.is_dir() and not path.is_symlink(), path
    again = Path(agentdir(capsys, agents)[1].strip())  # a second attempt: another name, the first kept
    assert again != made and again.parent == agents and made.is_dir()
    # as the job runs it: the program's text, with `python -I`, nothing of the checkout imported
    proc = subprocess.run([sys.executable, "-I", "-c", seal.inline_source(), "agentdir", str(agents), "41-2."],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0 and Path(proc.stdout.strip()).parent == agents, proc.stderr
    assert Path(proc.stdout.strip()).name.startswith("41-2.")


def test_the_agent_dir_itself_a_link_or_a_bad_prefix_is_refused(tmp_path: Path, capsys) -> None:
    os.chmod(tmp_path, 0o700)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "agents").symlink_to(tmp_path / "elsewhere")
    status, _, err = agentdir(capsys, tmp_path / "agents")
    assert status == 2 and "is a symbolic link" in err and os.listdir(tmp_path / "elsewhere") == [], err
    status, _, err = agentdir(capsys, tmp_path / "elsewhere", "../x")
    assert status == 2 and err.startswith("usage: seal.py agentdir") and os.listdir(tmp_path / "elsewhere") == []
