"""The chaos run: one run SIGKILLed (the whole process tree) at 10 moments on one process (5 on two FSDP
ranks, whose point is the distributed checkpoint under a kill), some inside checkpoint writes, some inside
evaluation, some at random, and restarted each time, ends with every step in metrics.jsonl exactly once and
losses bitwise identical to the uninterrupted run (which writes no checkpoint until its end: saving one
changes nothing the run computes). Every other restart writes its checkpoints in the
background (`train.ckpt_async`): kills land inside those writes too, and a run resumes across the change of
mode. The two FSDP ranks start as srun or submitit start them (one process each, forked by the tests' fork
server, `trainutil.start_ranks`) and every kill takes both ranks with whatever they started: torchrun's agent,
SIGKILLed with its ranks, would play no part. The model is the tiny preset, not smaller: a "random" kill
comes up to 1.5 s after a step, and at 2 blocks of d_model 32 a quiet machine trains the rest of the run in
that time (the run ended before its kill). Budget: about 90 s (1 process) + 50 s (FSDP) on a quiet machine."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from trainutil import final, kill_all, losses, records, start, start_ranks, train

STEPS, EVERY_CKPT, EVERY_EVAL = 32, 2, 3
ARGS = (f"train.max_steps={STEPS}", f"train.ckpt_every={EVERY_CKPT}", f"train.eval_every={EVERY_EVAL}",
        "train.log_every=1", "train.keep_ckpts=2", "data.eval_batches=6")
BACKENDS = {"single": ((), 1), "fsdp2": (("train.micro_batch=8", "parallel.backend=fsdp"), 2)}
MODES = {  # backend: where its kills aim
    "single": ["ckpt"] * 4 + ["eval"] * 3 + ["random"] * 3,
    "fsdp2": ["ckpt"] * 2 + ["eval"] * 2 + ["random"],
}


def last_record(run: Path) -> dict:
    path = run / "metrics.jsonl"
    if not path.exists():
        return {}
    lines = path.read_text().splitlines()
    for line in reversed(lines):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return {}


def tmp_dirs(run: Path) -> set[str]:
    root = run / "checkpoints"
    return {p.name for p in root.glob(".tmp_*")} if root.exists() else set()


def in_eval(run: Path) -> bool:
    rec = last_record(run)
    return "loss" in rec and rec["step"] % EVERY_EVAL == 0 and rec["step"] < STEPS


def kill_at(run: Path, procs: list, mode: str, rng: random.Random, stale: set[str], timeout: float = 240) -> str:
    """Wait for the moment `mode` names, kill the process tree of every rank, and say where the kill landed."""
    start_step = max(losses(run), default=0)
    deadline = time.time() + timeout
    delay = rng.uniform(0.0, 1.5)
    progressed_at = None
    while time.time() < deadline:
        ended = next((p for p in procs if p.poll() is not None), None)
        if ended is not None:
            err = ended.stderr.read() if ended.stderr else ""
            raise AssertionError(f"the run ended by itself (exit {ended.returncode}):\n"
                                 f"{(ended.stdout.read() + err)[-3000:]}")
        progressed = max(losses(run), default=0) > start_step
        if progressed and progressed_at is None:
            progressed_at = time.time()
        if progressed and (
            (mode == "ckpt" and tmp_dirs(run) - stale)
            or (mode == "eval" and in_eval(run))
            or (mode == "random" and time.time() - progressed_at >= delay)
        ):
            break
        time.sleep(0.002)
    else:
        raise AssertionError(f"no moment for a {mode} kill within {timeout} s")
    kill_all(procs)
    if tmp_dirs(run) - stale:
        return "ckpt"
    return "eval" if in_eval(run) else "step"


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_chaos_run_matches_the_uninterrupted_run(tmp_path, stories_data, backend):
    extra, nproc = BACKENDS[backend]
    ref = tmp_path / "ref"  # uninterrupted, and without the checkpoints every 2 steps: none of them is read
    train(ref, stories_data, *ARGS, *extra, "train.ckpt_every=0", nproc=nproc)
    run = tmp_path / "run"
    rng = random.Random(13)
    modes = list(MODES[backend])
    rng.shuffle(modes)
    landed = {"ckpt": 0, "eval": 0, "step": 0}
    for i, mode in enumerate(modes):
        stale = tmp_dirs(run)
        writer = ("train.ckpt_async=true",) if i % 2 else ()
        args = (*ARGS, *extra, *writer)
        procs = start_ranks(run, stories_data, *args, world=nproc) if nproc > 1 else [start(run, stories_data, *args)]
        try:
            landed[kill_at(run, procs, mode, rng, stale)] += 1
        finally:
            kill_all(procs)  # kill_at failed: no run is left training behind the test
            for p in procs:
                p.communicate()
    train(run, stories_data, *ARGS, *extra, nproc=nproc)
    print(f"\nchaos {backend}: {len(modes)} SIGKILLs, {landed['ckpt']} inside a checkpoint write, {landed['eval']} "
          f"inside evaluation, {landed['step']} elsewhere; {len(modes)} restarts recovered; steps lost: 0")
    steps = [r["step"] for r in records(run) if "loss" in r]
    assert steps == list(range(1, STEPS + 1))  # every step exactly once
    evals = [r["step"] for r in records(run) if "val_loss" in r]
    assert evals == sorted(set(evals)) == [r["step"] for r in records(ref) if "val_loss" in r]
    assert losses(run) == losses(ref)  # bitwise
    assert final(run)["status"] == "completed" and final(run)["final_val_loss"] == final(ref)["final_val_loss"]
    assert landed["ckpt"] >= 1
