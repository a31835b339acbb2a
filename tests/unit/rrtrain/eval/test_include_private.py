"""lm-eval imports the `!function` modules of a task directory, so `--include` and `eval.downstream.include`
must be the user's alone (rrtrain/eval/task_files.py): a directory, a file in it, a YAML its `include:` names or a
module outside it that someone else can write is one line before anything is imported. Budget: well under 1 s
(no lm-eval index is built, no model loaded)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from evalutil import write_tasks
from rrtrain.config import load_config
from rrtrain.core.errors import UsageError
from rrtrain.eval.tasks import check_include

pytest.importorskip("lm_eval")

#: a module whose import would leave a sentinel file beside it: lm-eval importing it is the attack
PWN = "import pathlib\npathlib.Path(__file__).with_name('PWNED').write_text('ran')\ndef pwn(docs):\n    return docs\n"


def planted(root: Path) -> Path:
    """The shipped tasks with a co-tenant's `process_docs: !function utils.pwn` and its utils.py."""
    tasks = write_tasks(root)
    with open(tasks / "tiny_mc.yaml", "a") as fh:
        fh.write("process_docs: !function utils.pwn\n")
    (tasks / "utils.py").write_text(PWN)
    return tasks


def refused(include: Path, where: str = "--include", *words: str) -> str:
    with pytest.raises(UsageError) as got:
        check_include(include, where)
    message = str(got.value)
    assert message.startswith(f"{where}: ") and "\n" not in message and "can be written by" in message, message
    assert all(w in message for w in words), message
    assert not list(include.parent.rglob("PWNED"))  # nothing was imported
    return message


def test_a_group_writable_task_directory_is_refused_before_its_code_is_imported(tmp_path: Path) -> None:
    tasks = planted(tmp_path / "tasks")
    assert check_include(tasks) == tasks  # the user's own directory: theirs to trust
    os.chmod(tasks, 0o775)  # proj/tasks, group-writable: mallory's YAML and utils.py are in it
    refused(tasks, "--include", str(tasks), "group")
    refused(tasks / "tiny_mc.yaml", "--include", str(tasks))  # one YAML of it named alone: the same place
    os.chmod(tasks, 0o755)
    os.chmod(tmp_path, 0o757)  # a directory on its way that others can write
    refused(tasks, "--include", str(tmp_path), "others")
    assert not (tasks / "PWNED").exists()


def test_a_writable_file_or_subdirectory_inside_is_refused(tmp_path: Path) -> None:
    tasks = planted(tmp_path / "tasks")
    os.chmod(tasks / "utils.py", 0o664)
    refused(tasks, "--include", "utils.py")
    os.chmod(tasks / "utils.py", 0o644)
    (tasks / "sub").mkdir()
    os.chmod(tasks / "sub", 0o777)  # empty now, but anyone could plant a task YAML in it before lm-eval indexes
    refused(tasks, "--include", "sub")


def test_code_named_from_outside_the_directory_must_be_private_too(tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "base.yaml").write_text("process_docs: !function utils.pwn\n")
    (shared / "utils.py").write_text(PWN)
    with open(tasks / "tiny_mc.yaml", "a") as fh:
        fh.write(f"include: {shared / 'base.yaml'}\n")
    assert check_include(tasks) == tasks
    os.chmod(shared, 0o777)  # the module beside the included YAML is what lm-eval imports
    refused(tasks, "--include", str(shared))
    os.chmod(shared, 0o755)
    another = 12345  # another user's module
    os.chown(shared / "utils.py", another, another)
    with pytest.raises(UsageError, match="utils.py' belongs to another user"):
        check_include(tasks)
    os.chown(shared / "utils.py", 0, 0)
    (shared / "__pycache__").mkdir()
    os.chmod(shared / "__pycache__", 0o777)  # a compiled module could be planted where Python looks first
    with pytest.raises(UsageError, match="__pycache__"):
        check_include(tasks)


def test_the_training_time_include_is_refused_the_same_way(tmp_path: Path) -> None:
    from rrtrain.eval.callback import DownstreamEval

    tasks = planted(tmp_path / "tasks")
    os.chmod(tasks, 0o775)
    cfg = load_config(None, ["eval.downstream.tasks=[tiny_mc]", f"eval.downstream.include={tasks}"])
    with pytest.raises(UsageError) as got:
        DownstreamEval(cfg.eval.downstream, 0)
    message = str(got.value)
    assert message.startswith("eval.downstream.include: ") and "\n" not in message and "can be written by" in message
    assert not (tasks / "PWNED").exists()


def test_the_module_of_a_linked_yaml_is_checked_where_lm_eval_imports_it(tmp_path: Path) -> None:
    """lm-eval resolves a task YAML before it imports its `!function` modules: a YAML reached through a link
    imports the module beside the link's target, which must be the one checked (the third review: a writable
    module beside the target ran while the link's own directory, which has none, passed)."""
    real = planted(tmp_path / "real")
    os.chmod(real / "utils.py", 0o666)  # beside the target: writable by anyone
    inc = tmp_path / "inc"
    inc.mkdir()
    (tmp_path / "linked.yaml").symlink_to(real / "tiny_mc.yaml")  # outside the include directory (inside: refused)
    (inc / "t.yaml").write_text(f"task: linked_task\ninclude: {tmp_path / 'linked.yaml'}\n")
    with pytest.raises(UsageError) as got:
        check_include(inc)
    assert "utils.py" in str(got.value) and "can be written by" in str(got.value) and "\n" not in str(got.value)
    assert not list(tmp_path.rglob("PWNED"))
