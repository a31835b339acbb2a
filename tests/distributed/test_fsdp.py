"""FSDP2 on 2 CPU ranks (gloo) against one process, and exact resume under FSDP (both ranks SIGKILLed at once)
with checkpoints written in the foreground and in the background (`train.ckpt_async`). The ranks start srun-style,
forked by the tests' fork server (`trainutil.start_ranks`): what is tested is the checkpoint a killed job leaves
and the resume from it, not the launcher (torchrun's fresh interpreters, one per rank and one for its agent, cost
about 10 CPU seconds a launch). The parity runs use a small model (d_model 32, 2 blocks, 2 heads): the sharding,
the gradient reduction and the rules' own state under it do not depend on the width. The resume runs keep the
tiny preset, whose steps are slow enough that the kill lands between two checkpoints. Parity over 10 steps (4 of
warmup, then 6 at and after the peak learning rate): a missing or doubled micro-batch, a wrong gradient scale or
a rule's state sharded wrongly moves the losses past the bound within the first steps."""

from __future__ import annotations

import random
import time

import pytest
import torch

from distributed.rankutil import kill_ranks, wait_for_step
from trainutil import checkpoint_tensors, final, losses, max_rel_diff, start_ranks, train

pytestmark = pytest.mark.distributed

PARITY = ["train.max_steps=10", "train.log_every=1", "train.eval_every=0", "train.global_batch=8",
          "train.warmup_steps=4", "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "data.eval_batches=1"]


@pytest.mark.parametrize("variant", ["review", "gr", "mhc", "fixup"])
def test_fsdp_two_ranks_matches_one_process(tmp_path, stories_data, variant):
    args = [*PARITY, f"model.variant={variant}"]
    train(tmp_path / "one", stories_data, *args, "train.micro_batch=8")
    train(tmp_path / "fsdp", stories_data, *args, "train.micro_batch=2", "parallel.backend=fsdp", nproc=2)
    one, two = losses(tmp_path / "one"), losses(tmp_path / "fsdp")
    assert len(one) == 10
    assert max_rel_diff(one, two) < 1e-4
    assert final(tmp_path / "fsdp")["world_size"] == 2


# killed between the checkpoints at steps 8 and 16 (the end): the resumed run recomputes from 8 to the end
RESUME = ["train.max_steps=16", "train.log_every=1", "train.eval_every=0", "train.ckpt_every=8",
          "train.global_batch=8", "train.micro_batch=4", "parallel.backend=fsdp"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, stories_data):
    """The uninterrupted RESUME run on 2 ranks (checkpoints written in the foreground)."""
    ref = tmp_path_factory.mktemp("reference") / "ref"
    train(ref, stories_data, *RESUME, nproc=2)
    return ref


def assert_same_run(ref, run) -> None:
    assert max_rel_diff(losses(ref), losses(run)) == 0.0
    pa, pb = checkpoint_tensors(ref), checkpoint_tensors(run)
    for key in pa:
        assert torch.equal(pa[key], pb[key]), key


def test_fsdp_exact_resume_after_sigkill(tmp_path, stories_data, reference):
    run = tmp_path / "killed"
    procs = start_ranks(run, stories_data, *RESUME, world=2)
    try:
        wait_for_step(run, random.Random(99).randint(9, 13), procs)
    finally:
        kill_ranks(procs)
    assert 8 < max(losses(run)) < 16
    train(run, stories_data, *RESUME, nproc=2)
    assert_same_run(reference, run)


def test_fsdp_exact_resume_after_sigkill_with_async_checkpoints(tmp_path, stories_data, reference):
    """Each rank writes its shards in the background over a gloo group of its own; step 8 is published at a
    stop check (every 2 steps) once both ranks have written it."""
    args = [*RESUME, "train.ckpt_async=true", "train.stop_check_every=2"]
    run = tmp_path / "killed"
    procs = start_ranks(run, stories_data, *args, world=2)
    try:
        wait_for_step(run, random.Random(99).randint(9, 13), procs)
        latest = run / "checkpoints" / "latest"
        deadline = time.time() + 120
        while not (latest.exists() and latest.read_text().strip() == "step_00000008") and time.time() < deadline:
            time.sleep(0.02)
    finally:
        kill_ranks(procs)
    assert 8 < max(losses(run)) < 16
    assert latest.read_text().strip() == "step_00000008"
    proc = train(run, stories_data, *args, nproc=2)
    assert "resumed at step 8" in proc.stdout, proc.stdout
    assert_same_run(reference, run)
