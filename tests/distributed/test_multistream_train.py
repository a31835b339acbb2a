"""The multi-stream and depth-aggregating rules under the real trainer: FSDP2 parity on 2 CPU ranks for gr
and mhc; exact resume for gr; activation checkpointing changes no loss, on a (B,T,n,D) state and on a tuple
state; bf16 with AC, under autocast and under FSDP2's bf16 policy, for every new rule. All but the resume use a
small model (SHORT: d_model 32, 2 blocks, 2 heads; selective AC then checkpoints one of the two blocks): the
state's shape under AC and casting does not depend on the width. The resume keeps the tiny preset, whose steps
are slow enough that the kill lands between two checkpoints.

Helpers come from tests/trainutil.py (the lead's); the synthetic-stories data from tests/conftest.py.
"""

from __future__ import annotations

import math
import random
import signal

import pytest
import torch

from trainutil import checkpoint_tensors, final, kill_group, losses, max_rel_diff, start, train, wait_for_step

pytestmark = pytest.mark.distributed

NEW = ["gr", "hc", "mhc", "attnres", "deepnorm"]
SHORT = ["train.log_every=1", "train.eval_every=0", "train.ckpt_every=0", "train.warmup_steps=2", "model.d_model=32",
         "model.n_layers=2", "model.n_heads=2", "data.eval_batches=1"]


# FSDP2 parity for gr and mhc: tests/distributed/test_fsdp.py (parametrised over variants).


@pytest.mark.slow
def test_gr_exact_resume_after_sigkill(tmp_path, stories_data):
    args = ["model.variant=gr", "train.max_steps=20", "train.log_every=1", "train.eval_every=0",
            "train.ckpt_every=8", "train.global_batch=8", "train.micro_batch=4", "train.warmup_steps=3"]
    ref = tmp_path / "ref"
    train(ref, stories_data, *args)
    run = tmp_path / "killed"
    proc = start(run, stories_data, *args)
    wait_for_step(run, random.Random(6).randint(9, 13), proc)
    kill_group(proc, signal.SIGKILL)
    proc.wait()
    assert 8 < max(losses(run)) < 16  # killed between the checkpoints at steps 8 and 16
    train(run, stories_data, *args)
    assert final(run)["status"] == "completed" and sorted(losses(run)) == list(range(1, 21))
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


@pytest.mark.slow
@pytest.mark.parametrize("variant", NEW)
def test_bf16_autocast_with_activation_checkpointing(tmp_path, stories_data, variant):
    run = tmp_path / variant
    train(run, stories_data, *SHORT, f"model.variant={variant}", "train.max_steps=6", "train.global_batch=4",
          "train.micro_batch=4", "parallel.ac=selective", "parallel.precision=bf16")
    got = losses(run)
    assert sorted(got) == list(range(1, 7)) and all(math.isfinite(v) for v in got.values())
    assert got[6] < got[1]


@pytest.mark.slow
@pytest.mark.parametrize("variant", NEW)
def test_fsdp_bf16_with_activation_checkpointing(tmp_path, stories_data, variant):
    """FSDP2 casts each block's inputs (the (B,T,n,D) or tuple state) to bf16: every rule must train under it."""
    run = tmp_path / variant
    train(run, stories_data, *SHORT, f"model.variant={variant}", "train.max_steps=6", "train.global_batch=4",
          "train.micro_batch=2", "parallel.backend=fsdp", "parallel.precision=bf16", "parallel.ac=full", nproc=2)
    got = losses(run)
    assert sorted(got) == list(range(1, 7)) and all(math.isfinite(v) for v in got.values())
    assert got[6] < got[1]
    assert final(run)["status"] == "completed"
