"""The files lm-eval opens for tasks of the user's own (`--include`) are checked by rrtrain first
(rrtrain/eval/task_files.py): a FIFO, a device or a link among them, in the task directory, behind an
`include:`, as a `!function` module or as a task's data file, is one line, exit 2, within a bounded time (before,
lm-eval opened it and hung); a task YAML that does not parse is one line naming it. Budget: about 5 s (one
`rrtrain eval` subprocess, refused before any model is loaded)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from evalutil import write_tasks
from rrtrain.core.errors import UsageError
from rrtrain.eval.tasks import check_include
from trainutil import REPO, env

pytest.importorskip("lm_eval")

TIMEOUT_S = 120  # the refusal takes the interpreter's start-up and well under a second more


@pytest.fixture
def tasks(tmp_path: Path) -> Path:
    return write_tasks(tmp_path / "tasks")


def refused(include: Path, *words: str) -> str:
    with pytest.raises(UsageError) as got:
        check_include(include)
    message = str(got.value)
    assert message.startswith("--include: ") and "\n" not in message and all(w in message for w in words), message
    return message


def fake_run(root: Path) -> Path:
    """As much of a run directory as `rrtrain eval` looks at before it reads the tasks (no model is loaded)."""
    (root / "checkpoints" / "step_00000002").mkdir(parents=True)
    (root / "config.yaml").write_text("{}\n")
    (root / "metrics.jsonl").write_text("")
    return root


def test_a_fifo_task_yaml_is_one_line_from_rrtrain_eval(tasks: Path, tmp_path: Path) -> None:
    (tasks / "tiny_mc.yaml").unlink()
    os.mkfifo(tasks / "tiny_mc.yaml")
    got = subprocess.run([sys.executable, "-m", "rrtrain", "eval", str(fake_run(tmp_path / "run")), "--tasks",
                          "tiny_mc", "--include", str(tasks)], cwd=REPO, env=env(), capture_output=True, text=True,
                         timeout=TIMEOUT_S)
    err = got.stderr.strip()
    assert got.returncode == 2 and "\n" not in err and "tiny_mc.yaml" in err and "not a regular file" in err, err


def test_the_task_directories_that_ship_pass(tasks: Path) -> None:
    assert check_include(tasks) == tasks
    assert check_include(REPO / "configs" / "tasks") == REPO / "configs" / "tasks"
    assert check_include(tasks / "tiny_ppl.yaml") == tasks / "tiny_ppl.yaml"


def test_a_link_or_a_fifo_anywhere_in_the_directory_is_one_line(tasks: Path, tmp_path: Path) -> None:
    (tmp_path / "elsewhere.yaml").write_text("task: elsewhere\n")
    (tasks / "sub").mkdir()
    (tasks / "sub" / "linked.yaml").symlink_to(tmp_path / "elsewhere.yaml")
    refused(tasks, "linked.yaml", "symbolic link")
    (tasks / "sub" / "linked.yaml").unlink()
    os.mkfifo(tasks / "sub" / "notes.txt")  # lm-eval would not read it, but nothing in a task directory is a FIFO
    refused(tasks, "notes.txt", "not a regular file")


def test_what_a_task_yaml_names_is_checked_too(tasks: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    os.mkfifo(outside / "template.yaml")
    (tasks / "with_include.yaml").write_text(f"include: {outside / 'template.yaml'}\ntask: with_include\n")
    refused(tasks, "template.yaml", "not a regular file")
    (tasks / "with_include.yaml").unlink()

    (tasks / "with_function.yaml").write_text("task: with_function\nprocess_docs: !function helpers.process\n")
    os.mkfifo(tasks / "helpers.py")
    refused(tasks, "helpers.py", "not a regular file")
    (tasks / "helpers.py").unlink()
    (tasks / "helpers.py").write_text("def process(docs):\n    return docs\n")
    assert check_include(tasks) == tasks

    os.mkfifo(tmp_path / "data.jsonl")
    (tasks / "with_data.yaml").write_text(f"task: with_data\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                                          f"    test: [{tmp_path / 'data.jsonl'}]\n")
    refused(tasks, "data.jsonl", "not a regular file")
    (tasks / "with_data.yaml").write_text(f"task: with_data\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                                          f"    test: {tmp_path / '*.jsonl'}\n")  # a glob, expanded as datasets does
    refused(tasks, "data.jsonl", "not a regular file")


def test_a_task_yaml_that_does_not_parse_is_one_line(tasks: Path) -> None:
    (tasks / "broken.yaml").write_text("task: broken\nmetric_list: [acc\n")
    refused(tasks, "broken.yaml", "not a task YAML line")
    (tasks / "broken.yaml").write_text("a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdef", "bcdefg")))
    refused(tasks, "broken.yaml", "expands to more than")
    (tasks / "broken.yaml").write_bytes(b"task: \xff\xfe\n")
    refused(tasks, "broken.yaml", "not UTF-8")
