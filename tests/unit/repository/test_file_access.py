"""One file-access layer (`rrtrain.core.files`, with `io` beside it): a static pass over every
module of ROOTS fails when code outside the layer opens, reads, writes, renames or deletes a path itself
(`open(`, `Path.read_text/write_text/read_bytes/write_bytes/open`, `os.open`, `shutil.rmtree`, `os.replace`,
`os.rename`, `os.unlink/remove`, `Path.unlink`), signals a process (`os.kill`) or runs `scancel`, except the
short ALLOWLIST below (each entry: module, function, call, and why it may stay). The pass is checked against a
planted violation. Then the layer's own promises, file by file: no link on the way or at the end, no FIFO, a
bound per kind, a line-length bound, appends never through a link, and deletes only of directories rrtrain
made that hold no input. Runtime: about 1 s."""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Iterator

import pytest

from rrtrain.core import files, io as rrio
from trainutil import REPO

ROOTS = ("rrtrain", "data_prep", "launchers")  # the packages whose modules the pass reads
#: the layer: the only modules that may touch a path directly
LAYER = ("rrtrain/core/files.py", "rrtrain/core/io.py")
LAYER_MODULES = ("rrtrain.core.files", "rrtrain.core.io")

#: (module path, function, call) -> why it may stay outside the layer: package resources, the kernel's own
#: files, paths that are no one's. Kept short; an entry that no longer matches a call fails the pass.
ALLOWLIST: dict[tuple[str, str, str], str] = {
    ("rrtrain/core/command.py", "_quiet_stdout", "os.open"):
        "/dev/null, opened to silence stdout after a broken pipe: no one's file",
    ("rrtrain/export/bundle.py", "package_files", "Path.read_text"):
        "rrtrain's own installed model package (rrtrain/model/, rrtrain/residuals/), copied into an export",
    ("rrtrain/export/bundle.py", "template_files", "Path.read_text"):
        "the export templates shipped in the package (rrtrain/export/remote/)",
    ("rrtrain/sizing.py", "presets", "Path.read_text"):
        "the size presets shipped with the project (configs/sizes/*.yaml)",
    ("rrtrain/rundir/events.py", "EventFile._write", "os.open"):
        "the event file appended with O_APPEND | O_NOFOLLOW | O_NONBLOCK and an fstat check (the layer's rules), "
        "the records TensorBoard's RecordWriter framed written in one os.write",
    # the seal runs on its own in a job script (`python -I`, the standard library alone), before anything of
    # rrtrain may be imported: it keeps the layer's rules itself (O_NOFOLLOW at every step, regular files only,
    # a bound, the user's own)
    ("launchers/sweep/seal.py", "open_beneath", "os.open"):
        "a snapshot's file, walked from the snapshot's root one O_NOFOLLOW directory at a time, checked regular",
    ("launchers/sweep/seal.py", "config_digest", "os.open"):
        "a run's config, O_NOFOLLOW | O_NONBLOCK, checked a regular file of the user's, read to a bound",
    ("launchers/sweep/seal.py", "record_refusal", "os.open"):
        "final.json's temporary, O_CREAT | O_EXCL | O_NOFOLLOW, 0600, linked into place without replacing",
    ("launchers/sweep/seal.py", "record_refusal", "os.unlink"):
        "that temporary, made by this very call",
    ("launchers/sweep/seal.py", "_open_made", "os.open"):
        "a directory on the way to the agents' log directory, opened from the one above O_DIRECTORY | O_NOFOLLOW "
        "and judged by fstat (the user's or root's, writable by no one else)",
    ("launchers/sweep/seal.py", "make_job_dir", "os.open"):
        "the root directory, where that walk starts (O_DIRECTORY | O_NOFOLLOW)",
    ("launchers/sweep/seal.py", "inline_source", "Path.read_text"):
        "rrtrain's own seal.py and payload.py, read to be written into a job script at submission",
    ("launchers/cancel.py", "_stop_slurm_job", "scancel"):
        "the one place that cancels a job: an id that is a Slurm job id in full, recorded by this sweep, that "
        "squeue shows as this user's with the sweep directory's mark as its comment (docs/reliability.md, trust "
        "rules)",
    ("launchers/cancel.py", "_stop_job", "os.kill"):
        "the one place that signals a run: a pid proven by its start time, command line and the lock file's "
        "device and inode (trust rules)",
    ("launchers/executors/local.py", "open_log", "open()"):
        "/dev/null, where a run's output goes when its log's name is a link or a FIFO: no one's file",
    ("launchers/executors/warm.py", "_handle", "os.kill"):
        "a signal the executor asked for, to a child of this server it has not reaped yet (so the pid is still "
        "that child's): never any other process",
    ("launchers/executors/warm.py", "run_as_main", "os.kill"):
        "a run forked by the server ending itself by SIGINT, as the interpreter ends on an uncaught "
        "KeyboardInterrupt",
    ("launchers/executors/warm.py", "_child", "os.open"):
        "/dev/null as a forked run's stdin, as a subprocess has it: no one's file",
    ("launchers/executors/render.py", "render", "Path.read_text"):
        "the sbatch templates shipped with the project (slurm/*.sbatch)",
    ("launchers/sweep/snapshot.py", "take", "shutil.rmtree"):
        "the directory mkdtemp made in this very call (a fresh name), removed when the copy fails",
    ("launchers/sweep/snapshot.py", "take", "os.rename"):
        "the directory mkdtemp made in this very call, renamed into place; rename(2) fails rather than replace "
        "a snapshot that appeared meanwhile",
    ("data_prep/cluster.py", "run_task", "os.rename"):
        "a prep task's own directory, made by make_temp_dir in this very call inside prep's private staging "
        "directory, renamed into place once complete; rename(2) of a directory fails rather than replace one",
    ("data_prep/atomic.py", "_pid_alive", "os.kill"):
        "signal 0 to a pid named by a staging directory: asks whether it lives, sends nothing",
}

#: attribute calls that touch a path on any receiver (Path, a file object's class, io, codecs, ...)
ANY_RECEIVER = {"open": "Path.open", "read_text": "Path.read_text", "write_text": "Path.write_text",
                "read_bytes": "Path.read_bytes", "write_bytes": "Path.write_bytes", "unlink": "Path.unlink",
                "rmtree": "shutil.rmtree", "rename": "Path.rename"}
#: attribute calls that touch a path or a process only on these modules (str.replace, list.remove are not)
ON_MODULE = {"os": {"open", "replace", "rename", "renames", "unlink", "remove", "rmdir", "removedirs", "kill",
                    "killpg"},
             "shutil": {"rmtree", "move"}}


def _kind(receiver: str, attr: str) -> str:
    if receiver in ON_MODULE and attr in ON_MODULE[receiver]:
        return f"{receiver}.{attr}"
    return ANY_RECEIVER[attr]


def violations(source: str, path: str) -> Iterator[tuple[str, str, str, int]]:
    """(path, function, call, line) for every call of `source` that touches a path or a process itself."""
    tree = ast.parse(source)
    layer_names: set[str] = set()  # local names bound to a layer module (`from rrtrain.core import files`)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if f"{node.module}.{alias.name}" in LAYER_MODULES:
                    layer_names.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in LAYER_MODULES and alias.asname:
                    layer_names.add(alias.asname)
    found: list[tuple[str, str, str, int]] = []
    stack: list[str] = []

    class Visitor(ast.NodeVisitor):
        def scoped(self, node: ast.AST) -> None:
            stack.append(node.name)  # type: ignore[attr-defined]
            self.generic_visit(node)
            stack.pop()

        visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = scoped

        def add(self, call: str, node: ast.AST) -> None:
            found.append((path, ".".join(stack) or "<module>", call, node.lineno))  # type: ignore[attr-defined]

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            for alias in node.names:  # `from os import unlink` would hide the call's module
                if node.module in ON_MODULE and alias.name in ON_MODULE[node.module]:
                    self.add(f"{node.module}.{alias.name}", node)

        def visit_Call(self, node: ast.Call) -> None:
            func = node.func
            if isinstance(func, ast.Name) and func.id == "open":
                self.add("open()", node)
            elif isinstance(func, ast.Attribute):
                receiver = func.value.id if isinstance(func.value, ast.Name) else ""
                if receiver not in layer_names and (
                        func.attr in ANY_RECEIVER or func.attr in ON_MODULE.get(receiver, ())):
                    self.add(_kind(receiver, func.attr), node)
            argv = [a for arg in node.args for a in (arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else [arg])]
            if any(isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.split(" ")[0] == "scancel"
                   for a in argv):
                self.add("scancel", node)
            self.generic_visit(node)

    Visitor().visit(tree)
    yield from found


def tree_violations() -> list[tuple[str, str, str, int]]:
    out = []
    for root in ROOTS:
        for file in sorted((REPO / root).rglob("*.py")):
            rel = file.relative_to(REPO).as_posix()
            if rel not in LAYER:
                out.extend(violations(file.read_text(), rel))
    return out


def test_only_the_layer_touches_paths_and_processes():
    found = tree_violations()
    bad = [f"{p}:{line} {func}: {call}" for p, func, call, line in found if (p, func, call) not in ALLOWLIST]
    assert not bad, "calls outside rrtrain.core.files (use the layer, or add a commented ALLOWLIST entry):\n" + \
        "\n".join(bad)
    stale = set(ALLOWLIST) - {(p, func, call) for p, func, call, _ in found}
    assert not stale, f"ALLOWLIST entries that match no call any more (remove them): {sorted(stale)}"


def test_the_pass_catches_planted_violations():
    planted = '''
import os, shutil, subprocess
from pathlib import Path
from os import unlink
from rrtrain.core import files as layer

def reader(p):
    layer.read_bytes(p)  # the layer: fine
    "a-b".replace("-", "_")  # str.replace: fine
    return open(p).read() + Path(p).read_text()

class Cleaner:
    def go(self, p, job):
        shutil.rmtree(p)
        os.replace(p, p + ".x")
        Path(p).unlink()
        os.kill(1, 15)
        subprocess.run(["scancel", job])
'''
    got = {(func, call) for _, func, call, _ in violations(planted, "x.py")}
    assert got == {("<module>", "os.unlink"), ("reader", "open()"), ("reader", "Path.read_text"),
                   ("Cleaner.go", "shutil.rmtree"), ("Cleaner.go", "os.replace"), ("Cleaner.go", "Path.unlink"),
                   ("Cleaner.go", "os.kill"), ("Cleaner.go", "scancel")}


# -- the layer's promises ---------------------------------------------------------------------------------


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "outside").write_text("someone else's\n")
    (tmp_path / "root" / "sub").mkdir(parents=True)
    (tmp_path / "root" / "sub" / "f.json").write_text("{}\n")
    return tmp_path / "root"


def test_a_link_in_the_middle_or_at_the_end_is_refused(root: Path):
    assert files.read_beneath(root, "sub/f.json", "json") == b"{}\n"
    (root / "via").symlink_to(root / "sub")
    with pytest.raises(files.LinkRefused, match="a symbolic link on the way"):
        files.read_beneath(root, "via/f.json")
    (root / "sub" / "last.json").symlink_to(root.parent / "outside")
    with pytest.raises(files.LinkRefused, match="not a regular file"):
        files.read_beneath(root, "sub/last.json")
    with pytest.raises(files.LinkRefused):
        files.read_bytes(root / "sub" / "last.json")  # the path form: the file itself never a link
    assert files.read_named(root / "sub" / "last.json") == b"someone else's\n"  # a file the user named: followed
    for bad in ("../outside", "/etc/passwd", "sub/../../outside", ""):
        with pytest.raises(files.BadPath):
            files.read_beneath(root, bad)
    os.close(files.open_dir(root / "sub" / "."))  # `--out .`: a directory like any other
    with pytest.raises(files.LinkRefused):
        files.open_dir(root / "via")


def test_a_fifo_is_refused_at_once(root: Path):
    os.mkfifo(root / "fifo")
    with pytest.raises(files.NotRegular, match="not a regular file"):
        files.read_beneath(root, "fifo")  # non-blocking open: no writer needed to return
    with pytest.raises(files.NotRegular):
        files.open_append(root / "fifo")


def test_a_file_over_its_kind_s_bound_is_refused(root: Path):
    with open(root / "big.json", "wb") as f:
        f.truncate(files.LIMITS["lock"] + 1)  # sparse: no disk spent
    with pytest.raises(files.TooLarge, match=f"larger than {files.LIMITS['lock']} bytes"):
        files.read_beneath(root, "big.json", "lock")
    assert len(files.read_beneath(root, "big.json", "json")) == files.LIMITS["lock"] + 1


def test_a_long_line_stops_at_the_bound_and_is_never_held_whole(root: Path):
    (root / "m.jsonl").write_bytes(b"short\n" + b"x" * 5000 + b"\nnext\n" + b"y" * 70)
    with files.open_regular(root / "m.jsonl") as fh:
        got = list(files.lines(fh, 64))
    assert got == [b"short\n", None, b"next\n", None]


def test_appends_and_writes_never_go_through_a_link(root: Path):
    (root / "log").symlink_to(root.parent / "outside")
    with pytest.raises(files.LinkRefused):
        files.open_append(root / "log")
    (root / "dangling").symlink_to(root / "nothing")
    with pytest.raises(files.LinkRefused):
        files.open_append(root / "dangling")
    assert not (root / "nothing").exists()
    files.atomic_write_beneath(root, "log", b"mine\n")  # a write replaces the link as a name
    assert not (root / "log").is_symlink() and (root / "log").read_bytes() == b"mine\n"
    assert (root.parent / "outside").read_text() == "someone else's\n"
    (root / "way").symlink_to(root.parent)
    with pytest.raises(files.LinkRefused):
        files.atomic_write_beneath(root, "way/outside", b"x")
    assert (root.parent / "outside").read_text() == "someone else's\n"
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []  # nothing left aside
    with files.open_append(root / "log") as log:
        log.write("more\n")
    assert (root / "log").read_text() == "mine\nmore\n"


def test_only_a_directory_rrtrain_made_is_removed(tmp_path: Path):
    plain = tmp_path / "plain"
    (plain / "data").mkdir(parents=True)
    with pytest.raises(files.NotMade, match="has no .rrtrain-made marker"):
        files.remove_made_dir(plain)
    made = Path(files.make_dir(tmp_path / "made"))
    (made / "x").write_text("x")
    (plain / files.MARKER).write_bytes((made / files.MARKER).read_bytes())  # a marker copied from `made`
    with pytest.raises(files.NotMade, match="does not prove this invocation made it"):
        files.remove_made_dir(plain)
    (tmp_path / "link").symlink_to(made)
    with pytest.raises(files.NotMade, match="symbolic link"):
        files.remove_made_dir(tmp_path / "link")
    with pytest.raises(files.NotMade, match="holds '.*x', an input of this command"):
        files.remove_made_dir(made, inputs=[made / "x"])
    assert plain.is_dir() and (made / "x").is_file()
    files.remove_made_dir(made)
    assert not made.exists() and plain.is_dir()


def test_a_made_directory_appears_marked_or_not_at_all(tmp_path: Path, monkeypatch):
    """A process killed between making a directory and marking it must not leave an unmarked one in place."""
    made = Path(files.make_dir(tmp_path / "a" / "step_10"))
    assert (made / files.MARKER).is_file() and oct(made.stat().st_mode & 0o777) == oct(files.dir_mode())
    assert sorted(p.name for p in made.parent.iterdir()) == ["step_10"]
    with pytest.raises(FileExistsError):
        files.make_dir(made)
    assert files.make_dir(made, exist_ok=True) == str(made)

    def killed(path, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(files, "mark_made", killed)
    with pytest.raises(KeyboardInterrupt):
        files.make_dir(tmp_path / "a" / "step_20")
    assert sorted(p.name for p in made.parent.iterdir()) == ["step_10"]


def test_replace_dir_deletes_only_what_rrtrain_made(tmp_path: Path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "theirs").write_text("kept")
    new = tmp_path / ".new"
    new.mkdir()
    rrio.replace_dir(new, out)  # the old OUT was not made by rrtrain: moved aside and kept, said in one line
    kept = [p for p in tmp_path.iterdir() if p.name not in ("out",)]
    assert len(kept) == 1 and (kept[0] / "theirs").read_text() == "kept"
    err = capsys.readouterr().err.strip()
    assert "kept" in err and "\n" not in err
    src = tmp_path / "src.txt"
    src.write_text("input")
    with pytest.raises(files.NotMade, match="an input of this command"):
        rrio.replace_dir(tmp_path / ".newer", tmp_path, inputs=[src])
