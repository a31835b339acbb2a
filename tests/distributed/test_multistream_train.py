"""The multi-stream and depth-aggregating rules under the real trainer: FSDP2 parity on 2 CPU ranks for gr
and mhc; exact resume for gr; activation checkpointing changes no loss, on a (B,T,n,D) state and on a tuple
state; bf16 with AC, under autocast and under FSDP2's bf16 policy, for every new rule. All but the resume use a
small model (SHORT: d_model 32, 2 blocks, 2 heads; selective AC then checkpoints one of the two blocks): the
state's shape under AC and casting does not depend on the width. The resume keeps the tiny preset, whose steps
are slow enough that the kill lands between two checkpoints. The bf16 checks step each rule's engine as training
builds it (`build_engine`: AC, FSDP2's policy or autocast) with the trainer's own optimizer step
(tests/distributed/bf16_rules_worker.py): every rule in turn in this process (autocast) and in ONE job of 2
ranks (FSDP2), not a training run per rule and layout (a launch each, 10 of them, a third of this file).

Helpers come from tests/trainutil.py (the lead's); the synthetic-stories data from tests/conftest.py.
"""

from __future__ import annotations

import json
import math
import random
import signal

import pytest
import torch

from distributed.bf16_rules_worker import run_cases
from distributed.rankutil import run_ranks
from rrtrain.core.dist import DistInfo
from trainutil import checkpoint_tensors, final, kill_group, losses, max_rel_diff, start, train, wait_for_step

pytestmark = pytest.mark.distributed

NEW = ["gr", "hc", "mhc", "attnres", "deepnorm"]
SHORT = ["train.log_every=1", "train.eval_every=0", "train.ckpt_every=0", "train.warmup_steps=2", "model.d_model=32",
         "model.n_layers=2", "model.n_heads=2", "data.eval_batches=1"]


# FSDP2 parity for gr and mhc: tests/distributed/test_fsdp.py (parametrised over variants).


@pytest.mark.slow
def test_gr_exact_resume_after_sigkill(tmp_path, stories_data):
    args = ["model.variant=gr", "train.max_steps=16", "train.log_every=1", "train.eval_every=0",
            "train.ckpt_every=8", "train.global_batch=8", "train.micro_batch=4", "train.warmup_steps=3"]
    ref = tmp_path / "ref"
    train(ref, stories_data, *args)
    run = tmp_path / "killed"
    proc = start(run, stories_data, *args)
    wait_for_step(run, random.Random(6).randint(9, 13), proc)
    kill_group(proc, signal.SIGKILL)
    proc.wait()
    assert 8 < max(losses(run)) < 16  # killed between the checkpoints at steps 8 and 16 (the end)
    train(run, stories_data, *args)
    assert final(run)["status"] == "completed" and sorted(losses(run)) == list(range(1, 17))
    assert max_rel_diff(losses(ref), losses(run)) == 0.0
    pa, pb = checkpoint_tensors(ref), checkpoint_tensors(run)
    assert pa.keys() == pb.keys()
    for key in pa:
        assert torch.equal(pa[key], pb[key]), key


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["gr", "attnres"])
def test_activation_checkpointing_gives_the_same_losses(tmp_path, stories_data, variant):
    """The trainer's composable AC on an (B,T,n,D) and a tuple state (every rule: tests/unit, in-process)."""
    args = [*SHORT, f"model.variant={variant}", "train.max_steps=6", "train.global_batch=4", "train.micro_batch=4"]
    train(tmp_path / "none", stories_data, *args)
    train(tmp_path / "full", stories_data, *args, "parallel.ac=full")
    ref, ac = losses(tmp_path / "none"), losses(tmp_path / "full")
    assert len(ref) == 6 and max_rel_diff(ref, ac) < 1e-6


BF16_STEPS = 4
#: a global batch of 4: one micro-batch of 4 in one process, one of 2 on each of 2 ranks
BF16 = ["train.global_batch=4", "parallel.precision=bf16"]


def check_bf16(got: dict[str, list[float]]) -> None:
    """Every step ran (none skipped as non-finite), every loss finite, and the rule learned."""
    losses_, skipped = got["losses"], got["skipped"]
    assert len(losses_) == BF16_STEPS and all(math.isfinite(v) for v in losses_), got
    assert skipped == [0.0] * BF16_STEPS, got
    assert losses_[-1] < losses_[0], got


@pytest.fixture(scope="module")
def autocast_steps() -> dict[str, dict[str, list[float]]]:
    """Every rule of NEW, one process, bf16 autocast with selective AC, stepped in this process."""
    cases = {v: [f"model.variant={v}", *BF16, "train.micro_batch=4", "parallel.ac=selective"] for v in NEW}
    return run_cases(cases, BF16_STEPS, DistInfo(0, 1, 0, torch.device("cpu")))


@pytest.fixture(scope="module")
def fsdp_bf16_steps(tmp_path_factory) -> dict[str, dict[str, list[float]]]:
    """Every rule of NEW under FSDP2's bf16 policy with full AC on 2 ranks, all in one job."""
    tmp = tmp_path_factory.mktemp("fsdp_bf16")
    cases = {v: [f"model.variant={v}", *BF16, "train.micro_batch=2", "parallel.backend=fsdp", "parallel.ac=full"]
             for v in NEW}
    (tmp / "cases.json").write_text(json.dumps(cases))
    proc = run_ranks("tests.distributed.bf16_rules_worker",
                     [str(tmp / "out.json"), str(tmp / "cases.json"), str(BF16_STEPS)], 2)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-5000:]}"
    return json.loads((tmp / "out.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("variant", NEW)
def test_bf16_autocast_with_activation_checkpointing(autocast_steps, variant):
    check_bf16(autocast_steps[variant])


@pytest.mark.slow
@pytest.mark.parametrize("variant", NEW)
def test_fsdp_bf16_with_activation_checkpointing(fsdp_bf16_steps, variant):
    """FSDP2 casts each block's inputs (the (B,T,n,D) or tuple state) to bf16: every rule must train under it."""
    check_bf16(fsdp_bf16_steps[variant])
