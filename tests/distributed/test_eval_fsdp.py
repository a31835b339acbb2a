"""In-loop downstream evaluation on 2 CPU ranks under FSDP2: each rank scores its share of the requests through
the sharded model (a batch count that does not divide by the ranks, so one rank runs a padding forward, or
the run would hang), the scores are gathered, and the logged metrics equal `rrtrain eval` of the same
checkpoints on one process (4 decimals); and `rrtrain eval` itself on 2 ranks gives what it gives on one process.
Every process is forked by the tests' fork server, the ranks srun-style (tests/distributed/rankutil.py): what is
tested is what the ranks compute, not how a launcher starts them. The one-process path end to end:
tests/e2e/test_eval.py."""

from __future__ import annotations

import json

import pytest

from distributed.rankutil import run_ranks, spawn_module
from evalutil import KEY, LIMIT, TASKS, close, downstream, write_tasks
from trainutil import env, train

pytestmark = pytest.mark.distributed


def test_ranks_share_the_requests_and_log_what_one_process_computes(stories_data, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    tasks = write_tasks(tmp_path / "tasks")
    run_dir = tmp_path / "run"
    # 6 documents x 4 choices = 24 requests in batches of 5: 5 batches over 2 ranks
    train(run_dir, stories_data, "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "train.max_steps=4",
          "train.ckpt_every=2", "train.log_every=2", "train.micro_batch=8", "train.keep_ckpts=3",
          "parallel.backend=fsdp", f"eval.downstream.tasks=[{','.join(TASKS)}]", f"eval.downstream.include={tasks}",
          f"eval.downstream.limit={LIMIT}", "eval.downstream.batch_size=5", nproc=2, timeout=300)
    logged = {r["step"]: r for r in downstream(run_dir)}
    assert sorted(logged) == [2, 4]
    argv = [[str(run_dir), "--step", str(s), "--tasks", ",".join(TASKS), "--include", str(tasks), "--limit",
             str(LIMIT)] for s in (2, 4)]
    for a in argv:  # `rrtrain eval` on one process, forked by the tests' fork server (torch already imported)
        proc = spawn_module("rrtrain", ["eval", *a], env())
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and "wrote " in out, err[-3000:]
    for step in (2, 4):
        result = json.loads((run_dir / "eval" / f"step_{step:08d}-{KEY}.json").read_text())["results"]
        for task, metrics in result.items():
            for name, value in metrics.items():
                if not name.endswith("_stderr"):
                    assert close(logged[step][f"downstream/{task}/{name}"], value), (step, task, name)

    # rrtrain eval on 2 ranks (srun-style, forked): each rank scores its share of the same batches of 5; the file
    # rank 0 writes holds the one-process numbers
    one = json.loads((run_dir / "eval" / f"step_{4:08d}-{KEY}.json").read_text())["results"]
    ranks = run_ranks("rrtrain", ["eval", *argv[1], "--batch-size", "5"], 2, timeout=300)
    assert ranks.returncode == 0, ranks.stderr[-3000:]
    assert ranks.stdout.count("wrote ") == 1, ranks.stdout  # rank 0 alone reports
    two = json.loads((run_dir / "eval" / f"step_{4:08d}-{KEY}.json").read_text())["results"]
    assert two.keys() == one.keys()
    for task, metrics in one.items():
        for name, value in metrics.items():
            if not name.endswith("_stderr"):
                assert close(two[task][name], value), (task, name, two[task][name], value)
