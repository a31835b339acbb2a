"""Downstream evaluation end to end, offline: a multiple-choice task, a perplexity task and a generation task as
local files (a YAML beside a JSONL each), a tiny run that evaluates them in the loop at its checkpoint steps, paused
after step 6 and resumed to its end (step 8). Each evaluation step is logged exactly once; the logged values equal
`rrtrain eval RUN --step S` on the same checkpoints and `lm_eval --model hf` on the exported model (to the
harness's printed precision, 4 decimals), and rrtrain's generated texts are the exported model's under
transformers' `generate`, request for request; bad input is one line, exit status 2, and nothing written.
The parts on their own: tests/unit/rrtrain/eval/test_eval_tasks.py, test_eval_generate.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from evalutil import KEY, LIMIT, TASKS, close, downstream, write_tasks
from trainutil import TINY, train


@pytest.fixture(scope="module")
def trained(stories_data, tmp_path_factory):
    """The run (8 steps, checkpoints at 4 and 8, paused after 6 and resumed), its tasks, both consoles."""
    root = tmp_path_factory.mktemp("eval")
    with pytest.MonkeyPatch.context() as mp:  # lm-eval's and datasets' caches of this test, and no network
        mp.setenv("HF_HOME", str(root / "hf"))
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("HF_DATASETS_OFFLINE", "1")
        tasks = write_tasks(root / "tasks")
        run_dir = root / "run"
        run_dir.mkdir()
        (run_dir / "pause.json").write_text('{"step": 6}')
        settings = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "train.max_steps=8",
                    "train.ckpt_every=4", "train.eval_every=4", "train.log_every=2", "train.stop_check_every=2",
                    "train.keep_ckpts=5", f"eval.downstream.tasks=[{','.join(TASKS)}]",
                    f"eval.downstream.include={tasks}", f"eval.downstream.limit={LIMIT}",
                    "eval.downstream.batch_size=4"]
        first = train(run_dir, stories_data, *settings, expect=5)  # paused after step 6, checkpointed there
        (run_dir / "pause.json").unlink()
        second = train(run_dir, stories_data, *settings)
        yield {"run": run_dir, "tasks": tasks, "root": root, "consoles": (first.stdout, second.stdout)}


def test_each_evaluation_step_is_logged_exactly_once_across_the_resume(trained):
    logged = downstream(trained["run"])
    assert [r["step"] for r in logged] == [4, 8]
    keys = {"downstream/tiny_mc/acc", "downstream/tiny_mc/acc_norm", "downstream/tiny_ppl/word_perplexity",
            "downstream/tiny_ppl/byte_perplexity", "downstream/tiny_ppl/bits_per_byte",
            "downstream/tiny_gen/exact_match"}
    for rec in logged:
        assert set(rec) == {"kind", "step", "seconds"} | keys
        assert rec["seconds"] >= 0 and 0 <= rec["downstream/tiny_mc/acc"] <= 1
    first, second = trained["consoles"]
    assert "downstream eval at step 4:" in first and "steps |" in first and "at step 8" not in first
    assert "downstream eval at step 8:" in second and "at step 4" not in second
    final = json.loads((trained["run"] / "final.json").read_text())
    assert final["status"] == "completed" and final["step"] == 8


def test_logged_values_equal_rrtrain_eval_on_the_same_checkpoints(trained, capsys):
    """`rrtrain eval RUN --step S` (rrtrain.cli.main, in this process) at both evaluation steps."""
    from rrtrain.cli.main import main

    run_dir = trained["run"]
    logged = {r["step"]: r for r in downstream(run_dir)}
    codes = [main(["eval", str(run_dir), "--step", str(step), "--tasks", ",".join(reversed(TASKS)), "--include",
                   str(trained["tasks"]), "--limit", str(LIMIT), "--batch-size", "3"]) for step in (4, 8)]
    printed = capsys.readouterr()
    assert codes == [0, 0], printed.err[-3000:]
    assert printed.out.count("| tiny_mc  | acc ") == 2
    for step in (4, 8):
        result = json.loads((run_dir / "eval" / f"step_{step:08d}-{KEY}.json").read_text())
        assert set(result) == {"step", "tasks", "num_fewshot", "limit", "source", "seconds", "lm_eval_version",
                               "results"}
        assert (result["step"], result["tasks"], result["num_fewshot"], result["limit"], result["source"]) == \
            (step, TASKS, None, LIMIT, "eval")
        assert result["results"]["tiny_mc"]["acc_stderr"] is not None
        for task, metrics in result["results"].items():
            for name, value in metrics.items():
                if not name.endswith("_stderr"):
                    assert close(logged[step][f"downstream/{task}/{name}"], value), (step, task, name)


def test_lm_eval_finds_the_model_class_by_name(trained):
    from lm_eval.api.registry import get_model

    import rrtrain.eval.lm  # noqa: F401 - registers `rrtrain`

    lm = get_model("rrtrain").create_from_arg_string(f"run_dir={trained['run']},step=8",
                                                     {"batch_size": 4, "device": "cpu"})
    assert (lm.max_length, lm.batch_size, lm.eot_token_id) == (64, 4, 256)
    ((ll, _),) = lm.score([([256], list(b"Once upon a time"))])
    assert -16 * 8 < ll < 0


def test_bad_input_is_one_line_exit_2_and_nothing_written(trained, stories_data, tmp_path, capsys):
    from rrtrain.cli.main import main

    run_dir, tasks = trained["run"], str(trained["tasks"])
    before = sorted(p.name for p in (run_dir / "eval").iterdir()) if (run_dir / "eval").exists() else []
    cases = [
        ([str(run_dir), "--tasks", "no_such_task_xyz"], "unknown task 'no_such_task_xyz'"),
        ([str(run_dir), "--step", "5", "--tasks", "tiny_mc", "--include", tasks], "no model at step 5"),
        ([str(tmp_path), "--tasks", "tiny_mc", "--include", tasks], "is not a run directory"),
        ([str(run_dir), "--tasks", "tiny_gen_long", "--include", tasks], "generates up to 256 tokens"),
        ([str(run_dir), "--tasks", "tiny_mc", "--limit", "0", "--include", tasks], "--limit must be at least 1"),
        ([str(run_dir), "--tasks", "tiny_mc", "--include", str(tmp_path / "none")], "neither a directory"),
    ]
    for argv, message in cases:
        assert main(["eval", *argv]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
    after = sorted(p.name for p in (run_dir / "eval").iterdir()) if (run_dir / "eval").exists() else []
    assert after == before
    # the same checks in training: an unknown task is refused before the run writes anything
    new_run = tmp_path / "never"
    code = main(["train", TINY, f"data.path={stories_data}", f"run.dir={new_run}",
                 "eval.downstream.tasks=[no_such_task_xyz]"])
    assert code == 2 and "unknown task 'no_such_task_xyz'" in capsys.readouterr().err
    assert not new_run.exists()


def test_the_exported_model_gives_the_same_numbers_with_lm_eval_hf(trained, capsys):
    """`rrtrain export` and lm-eval's `hf` model (what `lm_eval --model hf --model_args
    pretrained=DIR,trust_remote_code=True` runs: `simple_evaluate`) in this process, over an index of the task files
    alone (the command line's --include_path indexes lm-eval's ~15,000 registered tasks too, 11 s of CPU)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from rrtrain.cli.main import main

    run_dir, root = trained["run"], trained["root"]
    out = root / "hf8"
    assert main(["export", str(run_dir), "--hf", str(out), "--step", "8"]) == 0, capsys.readouterr().err[-3000:]
    evaluated = lm_eval.simple_evaluate(
        model="hf", model_args=f"pretrained={out},trust_remote_code=True", tasks=TASKS,
        task_manager=TaskManager(include_path=str(trained["tasks"]), include_defaults=False), limit=LIMIT,
        device="cpu", batch_size=4, log_samples=True)
    results = evaluated["results"]
    logged = {r["step"]: r for r in downstream(run_dir)}[8]
    compared = 0
    for task in TASKS:
        for key, value in results[task].items():
            name, _, filt = key.partition(",")
            if filt == "none" and not name.endswith("_stderr"):
                assert close(logged[f"downstream/{task}/{name}"], value), (task, name, value)
                compared += 1
    assert compared == 6

    # the texts themselves: transformers' generate on the export (with its cache), request for request, against
    # rrtrain's model class on the same checkpoint (the path `rrtrain eval` takes)
    from lm_eval.api.registry import get_model

    import rrtrain.eval.lm  # noqa: F401 - registers `rrtrain`

    samples = evaluated["samples"]["tiny_gen"]
    hf_texts = [s["filtered_resps"][0] for s in samples]
    lm = get_model("rrtrain").create_from_arg_string(f"run_dir={run_dir},step=8", {"batch_size": 4, "device": "cpu"})
    requests = [SimpleNamespace(args=tuple(s["arguments"][0])) for s in samples]  # (context, generation kwargs)
    assert len(samples) == LIMIT and any(hf_texts)
    assert lm.generate_until(requests) == hf_texts
