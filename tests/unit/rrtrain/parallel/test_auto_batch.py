"""`train.micro_batch: auto`: the choice from the planner's figures and a free-memory figure (pure, no GPU), its
resolution into an int, and its refusal on a CPU (one line, exit 2, nothing written). Runtime: a few seconds."""

from __future__ import annotations

import pytest

from trainutil import TINY

from rrtrain.config import load_config
from rrtrain.core.errors import UsageError
from rrtrain.parallel import auto_batch
from rrtrain.parallel import memory as planner
from rrtrain.resolve import load, resolve

GIB = 2**30


def test_divisors_largest_first():
    assert auto_batch.divisors(12) == [12, 6, 4, 3, 2, 1]
    assert auto_batch.divisors(1) == [1]
    assert auto_batch.divisors(49) == [49, 7, 1]


def test_pick_is_the_largest_divisor_under_the_free_memory_less_the_margin():
    peak = lambda m: 10 * GIB + m * GIB  # noqa: E731  a fixed state and 1 GiB of activations per sequence
    # 100 GiB free, 15% margin: 85 GiB usable -> up to 75 sequences; the largest divisor of 96 below is 48
    assert auto_batch.pick_micro_batch(96, peak, 100 * GIB) == 48
    assert auto_batch.pick_micro_batch(96, peak, 100 * GIB, margin=0.0) == 48  # 90 GiB: 80 sequences, still 48
    assert auto_batch.pick_micro_batch(96, peak, 200 * GIB) == 96
    assert auto_batch.pick_micro_batch(7, peak, 20 * GIB) == 7  # 17 GiB usable: 7 fits
    assert auto_batch.pick_micro_batch(8, peak, 12 * GIB) is None  # 10.2 GiB usable: not even one


def test_resolved_from_the_planners_figures_into_an_int():
    cfg = load(TINY, ["train.micro_batch=auto", "train.global_batch=32", "model.vocab_size=258"])
    run = resolve(cfg)
    peak = auto_batch.planned_peak(run, 1)
    per_seq = peak(2) - peak(1)
    assert per_seq > 0 and peak(4) - peak(2) == 2 * per_seq  # activations scale with the micro-batch
    free = int((peak(8) + per_seq // 2) / (1 - auto_batch.MARGIN))  # room for 8, not for 16
    out, choice = auto_batch.resolve_micro_batch(run, 1, None, announce=False, free_bytes=free)
    assert out.train.micro_batch == 8 and choice.micro_batch == 8 and choice.planned_bytes == peak(8)
    assert "train.micro_batch=auto: 8 (planned peak" in choice.line()
    s = planner.Setup(model=cfg.model, run=run, gpus=1, backend="none", micro_batch=8, global_batch=32,
                      precision="fp32")
    assert planner.plan(s).total() == peak(8)  # the planner's own figure, as `rrtrain plan` prints it
    with pytest.raises(UsageError, match="not even one sequence per GPU fits"):
        auto_batch.resolve_micro_batch(run, 1, None, announce=False, free_bytes=peak(1) // 2)
    fixed, none = auto_batch.resolve_micro_batch(resolve(load(TINY, ["train.micro_batch=4"])), 1, None, free_bytes=1)
    assert none is None and fixed.train.micro_batch == 4  # an int is left alone


def test_config_accepts_auto_and_integers_only():
    assert load_config(TINY, ["train.micro_batch=auto"]).train.micro_batch == "auto"
    for bad in ("0", "-2", "max"):
        with pytest.raises(UsageError, match="train.micro_batch"):
            load_config(TINY, [f"train.micro_batch={bad}"])


def test_train_refuses_auto_on_cpu_in_one_line_and_writes_nothing(tmp_path, capsys):
    """`rrtrain train` in this process (the command's main)."""
    from rrtrain.cli.main import main

    run_dir = tmp_path / "run"
    assert main(["train", TINY, f"run.dir={run_dir}", f"data.path={tmp_path}", "train.micro_batch=auto"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "train.micro_batch=auto needs a CUDA device" in lines[0], err
    assert not run_dir.exists()


def test_rrtrain_plan_plans_auto_as_the_trainer_would_choose_on_an_empty_gpu():
    from rrtrain.cli.plan import auto_setup

    cfg = load(TINY, ["model.vocab_size=258"])
    run = resolve(cfg)
    s = planner.Setup(model=cfg.model, run=run, gpus=2, gpu="l4", backend="fsdp", micro_batch=1, global_batch=64)
    chosen = auto_setup(s)
    usable = planner.gpu_spec("l4")[1] * (1 - planner.HEADROOM) * (1 - auto_batch.MARGIN)
    assert chosen.micro_batch == 32  # 64 / 2 GPUs: the tiny model fits all 32 in an L4
    assert planner.plan(chosen).total() <= usable
