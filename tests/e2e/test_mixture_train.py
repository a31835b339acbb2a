"""A run on a weighted mixture of two prepared datasets (`data.sources`), end to end: paused after step 6 and
started again, it gives the uninterrupted run's losses, validation losses per source (`val/<name>`) and weights bit
for bit; config.yaml records the sources' paths absolute; `rrtrain eval RUN --data SOURCE` from another folder
gives the loss on that source's validation split. On two FSDP2 ranks (each reading its own part of every global
batch of the mixture) the losses are the one-process run's within the FSDP parity bound
(tests/distributed/test_fsdp.py). The parts on their own: tests/unit/rrtrain/data/test_sources.py."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
import yaml

from trainutil import checkpoint_tensors, final, losses, max_rel_diff, records, train

pytestmark = pytest.mark.slow

SETTINGS = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "train.max_steps=8", "train.log_every=1",
            "train.eval_every=4", "train.ckpt_every=4", "train.stop_check_every=2", "train.global_batch=8",
            "train.micro_batch=4", "train.warmup_steps=2", "data.eval_batches=1"]


@pytest.fixture(scope="module")
def reference(stories_data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """The uninterrupted one-process run on a 3:1 mixture of the stories and a copy of them: (run, the copy's
    directory, the data.sources override)."""
    root = tmp_path_factory.mktemp("mixture")
    second = root / "second"
    shutil.copytree(stories_data, second)  # another directory: a source of its own
    mixture = f"data.sources=[{{path: {stories_data}, weight: 3}}, {{path: {second}, weight: 1, name: copy}}]"
    train(root / "ref", None, mixture, *SETTINGS)
    return root / "ref", second, mixture


def test_a_mixture_paused_and_resumed_gives_the_uninterrupted_run(stories_data, tmp_path, reference, monkeypatch,
                                                                 capsys):
    ref, second, mixture = reference
    run = tmp_path / "paused"
    run.mkdir()
    (run / "pause.json").write_text('{"step": 6}')
    train(run, None, mixture, *SETTINGS, expect=5)  # paused after step 6, checkpointed there
    assert max(losses(run)) == 6
    (run / "pause.json").unlink()
    train(run, None, mixture, *SETTINGS)
    assert final(run)["status"] == "completed" and sorted(losses(run)) == list(range(1, 9))
    assert losses(run) == losses(ref)  # bit for bit
    evals = {r["step"]: r for r in records(run) if "val_loss" in r}
    assert evals == {r["step"]: r for r in records(ref) if "val_loss" in r} and sorted(evals) == [4, 8]
    for r in evals.values():
        assert r["val_loss"] == pytest.approx((3 * r[f"val/{stories_data.name}"] + r["val/copy"]) / 4, rel=1e-12)
    a, b = checkpoint_tensors(ref), checkpoint_tensors(run)
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    # `rrtrain eval --data` (rrtrain.cli.main, in this process), from another folder: the loss on one source's
    # whole validation split
    from rrtrain.cli.main import main

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    code = main(["eval", str(run), "--data", str(second), "--batch-size", "16"])
    got = capsys.readouterr()
    assert code == 0, got.err[-2000:]
    loss = float(re.search(r"validation loss on .*: ([0-9.]+) \(\d+ sequences, step 8\)", got.out).group(1))
    assert abs(loss - evals[8]["val/copy"]) < 0.3  # the run's own evaluation reads 4 of those sequences
    sources = yaml.safe_load((run / "config.yaml").read_text())["data"]["sources"]
    assert sources == [{"path": os.path.abspath(stories_data), "weight": 3.0, "name": stories_data.name},
                       {"path": os.path.abspath(second), "weight": 1.0, "name": "copy"}]


def test_a_mixture_on_two_fsdp_ranks_trains_as_on_one_process(tmp_path, reference):
    ref, _, mixture = reference
    run = tmp_path / "two"
    train(run, None, mixture, *SETTINGS, "parallel.backend=fsdp", nproc=2)
    assert final(run)["world_size"] == 2
    assert max_rel_diff(losses(ref), losses(run)) < 1e-4
    evals = [r for r in records(run) if "val_loss" in r]
    assert [r["step"] for r in evals] == [4, 8] and all("val/copy" in r for r in evals)
