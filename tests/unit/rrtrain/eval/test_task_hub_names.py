"""A task's `dataset_path` that is a Hugging Face Hub name (lm-eval's registry tasks: `EleutherAI/lambada_openai`)
is a Hub name: `datasets` looked it up first as a directory relative to the working directory, so a co-tenant who
can write the directory the user runs `rrtrain eval` (or a run with eval.downstream.tasks) from chose the task's
data. Where a path of that name is there, loading the tasks is refused in one line, before `datasets` reads or
downloads anything; a builder of `datasets` (json...) with local data files is unaffected. Budget: about 0.5 s
(an index over one include directory, no model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rrtrain.core.errors import UsageError

pytest.importorskip("lm_eval")

from rrtrain.eval.tasks import load_tasks, task_manager  # noqa: E402 - after the skip

TASK = ("task: {name}\ndataset_path: {path}\n{kwargs}test_split: test\noutput_type: loglikelihood_rolling\n"
        'doc_to_text: ""\ndoc_to_target: "{{{{text}}}}"\nmetric_list:\n  - metric: word_perplexity\n')


def test_a_task_whose_hub_dataset_is_a_path_here_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "hub_task.yaml").write_text(TASK.format(name="hub_task", path="EleutherAI/lambada_openai", kwargs=""))
    shared = tmp_path / "shared"  # where the user runs from; the co-tenant planted the "Hub" dataset in it
    planted = shared / "EleutherAI" / "lambada_openai"
    planted.mkdir(parents=True)
    (planted / "test.jsonl").write_text(json.dumps({"text": "every answer is mallory"}) + "\n")
    monkeypatch.chdir(shared)
    manager = task_manager(["hub_task"], tasks)
    with pytest.raises(UsageError) as got:
        load_tasks(manager, ["hub_task"], None, "eval.downstream.tasks")
    message = str(got.value)
    assert message.startswith("eval.downstream.tasks: dataset_path 'EleutherAI/lambada_openai' is a Hugging Face "
                              "Hub name") and "\n" not in message and "run from another directory" in message, message


def test_a_builder_with_local_data_files_is_not_a_hub_name(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    data = tmp_path / "ppl.jsonl"
    data.write_text(json.dumps({"text": "once upon a time"}) + "\n")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    kwargs = f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
    (tasks / "local_task.yaml").write_text(TASK.format(name="local_task", path="json", kwargs=kwargs))
    (tmp_path / "json").mkdir()  # a directory named as the builder: `datasets` never looks it up
    monkeypatch.chdir(tmp_path)
    loaded = load_tasks(task_manager(["local_task"], tasks), ["local_task"], None)
    assert list(loaded["tasks"]) == ["local_task"]
