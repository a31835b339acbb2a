"""DeepSpeed ZeRO on CPU (gloo, `DS_ACCELERATOR=cpu`) with 2 ranks against one process.

Every run: the `tiny` preset (review variant) on `synthetic:stories`, 20 optimizer steps of 8 sequences x 64
tokens (one process: 4 micro-batches of 2; two ranks: 2 micro-batches of 2 each, so accumulation keeps the
global batch), fp32, a NaN loss injected at step 7 (`train.fail_at_step=7`), per-block gradient norms every
5 steps.

Tolerance: per-step losses agree with the one-process run to a relative difference <= 1e-5. Measured
(2 CPU cores, torch 2.14.1, deepspeed 0.19.8): at most 1.5e-7 for ZeRO-1, -2 and -3, i.e. one or two fp32
ulps of the loss. The runs differ only in summation order (gradients summed over ranks and micro-batches in
another order, AdamW applied to DeepSpeed's flat fp32 partitions instead of per tensor, the clipping norm
summed per partition), which is round-off; anything wrong in the arithmetic (a missing or doubled
micro-batch, a wrong gradient scale, an update that was not discarded, a step count off by one in AdamW's
bias correction) moves the losses by 1e-3 or more. Per-block gradient norms: <= 1e-4.
Resume after SIGKILL is checked bit for bit (a DeepSpeed run against itself).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-5
DIAG_TOL = 1e-4
STEPS, FAULT = 20, 7
COMMON = [
    f"train.max_steps={STEPS}", "train.global_batch=8", "train.micro_batch=2", "train.warmup_steps=2",
    "train.log_every=1", "train.eval_every=0", "train.ckpt_every=0", "train.diag_every=5",
    f"train.fail_at_step={FAULT}", "data.eval_batches=1", "parallel.precision=fp32",
]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"  # two ranks on two cores; the one-process run uses the same thread count
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args]


def _train_cmd(run_dir: Path, data: Path, *extra: str, ranks: int = 2) -> list[str]:
    args = ["configs/train/tiny.yaml", f"data.path={data}", f"run.dir={run_dir}", *COMMON, *extra]
    if ranks == 1:
        return [sys.executable, "-m", "rrtrain.train", *args]
    return _torchrun("-m", "rrtrain.train", *args)


def _run(cmd: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)}\nexit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: (math.nan if r["loss"] is None else r["loss"]) for r in _records(run_dir) if "loss" in r}


def _diag(run_dir: Path) -> dict[int, list[float]]:
    return {r["step"]: r["block_grad_norm"] for r in _records(run_dir) if r.get("kind") == "diag"}


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), 1e-12)


def _ds_counters(run_dir: Path) -> dict[str, int]:
    """DeepSpeed's own counters as saved in the final checkpoint (every rank's model-states file)."""
    import torch

    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    files = sorted((run_dir / "checkpoints" / latest / "state" / "zero").glob("*model_states.pt"))
    assert files, f"no DeepSpeed model states under {run_dir}"
    out = set()
    for f in files:
        sd = torch.load(f, map_location="cpu", weights_only=False)
        out.add((sd["global_steps"], sd["skipped_steps"]))
    assert len(out) == 1, f"ranks disagree on DeepSpeed's counters: {out}"
    steps, skipped = out.pop()
    return {"global_steps": steps, "skipped_steps": skipped}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ds_data") / "stories"
    _run([sys.executable, "-m", "rrtrain", "prep", "--source", "synthetic:stories", "--tokenizer", "byte",
          "--seq-len", "64", "--num-docs", "400", "--out", str(out)])
    return out


@pytest.fixture(scope="module")
def baseline(data, tmp_path_factory) -> Path:
    """One process, `parallel.backend=none`, the same global batch."""
    run_dir = tmp_path_factory.mktemp("ds_none") / "run"
    _run(_train_cmd(run_dir, data, "parallel.backend=none", ranks=1))
    return run_dir


def _check_against_baseline(run_dir: Path, baseline: Path) -> float:
    """Per-step losses and per-block gradient norms vs the one-process run; the NaN step skipped everywhere."""
    ref, got = _losses(baseline), _losses(run_dir)
    assert sorted(got) == list(range(1, STEPS + 1)), f"steps logged: {sorted(got)}"
    assert math.isnan(ref[FAULT]) and math.isnan(got[FAULT])
    worst = 0.0
    for step in range(1, STEPS + 1):
        if step == FAULT:
            continue
        rel = _rel(ref[step], got[step])
        worst = max(worst, rel)
        assert rel <= TOL, f"step {step}: loss {got[step]!r} vs one process {ref[step]!r} (rel {rel:.2e})"
    ref_diag, got_diag = _diag(baseline), _diag(run_dir)
    assert sorted(got_diag) == sorted(ref_diag) == [5, 10, 15, 20]
    for step, norms in ref_diag.items():
        for i, (a, b) in enumerate(zip(norms, got_diag[step])):
            assert _rel(a, b) <= DIAG_TOL, f"step {step} block {i}: grad norm {b} vs {a}"
    final = json.loads((run_dir / "final.json").read_text())
    assert final["status"] == "completed" and final["step"] == STEPS
    assert final["nonfinite_skipped"] == 1 and "nonfinite_steps" in final["flags"]
    assert _ds_counters(run_dir) == {"global_steps": STEPS, "skipped_steps": 1}
    print(f"\n{run_dir.parent.name}: max relative loss difference vs one process over {STEPS} steps: {worst:.2e}")
    return worst


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_matches_one_process(stage, data, baseline, tmp_path):
    """ZeRO-1 / ZeRO-2, 2 ranks: same per-step losses as one process; the NaN step is skipped on all ranks,
    counted in final.json, and DeepSpeed's global_steps / skipped_steps stay in line with the loop."""
    run_dir = tmp_path / f"zero{stage}"
    _run(_train_cmd(run_dir, data, "parallel.backend=deepspeed", f"parallel.zero_stage={stage}"))
    _check_against_baseline(run_dir, baseline)


def test_zero3_kill_and_resume(data, baseline, tmp_path):
    """ZeRO-3, 2 ranks, checkpoints every 5 steps, SIGKILLed after step 13, restarted with the same command:
    the recomputed steps 11.. are bitwise identical to the killed run's, and the finished run matches the
    one-process run step by step (including the NaN skip at step 7, before the checkpoint it resumed from)."""
    run_dir = tmp_path / "zero3"
    cmd = _train_cmd(run_dir, data, "parallel.backend=deepspeed", "parallel.zero_stage=3", "train.ckpt_every=5")
    log = (tmp_path / "first.log").open("w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    kill_after, deadline = 13, time.time() + 300
    try:
        while True:
            steps = [r.get("step", 0) for r in _records(run_dir)] if (run_dir / "metrics.jsonl").exists() else []
            if steps and max(steps) >= kill_after:
                os.killpg(proc.pid, signal.SIGKILL)
                break
            if proc.poll() is not None:
                pytest.fail(f"the first run ended (exit {proc.returncode}) before step {kill_after}: "
                            f"{(tmp_path / 'first.log').read_text()[-3000:]}")
            assert time.time() < deadline, "the first run did not reach the kill step in time"
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
    first = _losses(run_dir)
    killed_at = max(first)
    assert kill_after <= killed_at < STEPS
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_00000010"
    assert not (run_dir / "final.json").exists()
    shutil.copy(run_dir / "metrics.jsonl", tmp_path / "metrics_first.jsonl")

    proc2 = _run(cmd)
    assert "resumed at step 10" in proc2.stdout
    second = _losses(run_dir)
    for step in range(11, killed_at + 1):  # recomputed after the restart: exactly what the killed run computed
        assert second[step] == first[step], f"step {step}: {second[step]!r} after resume vs {first[step]!r}"
    for step in range(1, 11):  # kept from before the checkpoint
        assert second[step] == first[step] or (math.isnan(second[step]) and math.isnan(first[step]))
    _check_against_baseline(run_dir, baseline)


SKIP_CHECK = r'''
import json, torch
from rrtrain import dist
from rrtrain.config import load_config
from rrtrain.model import build_model
from rrtrain.parallel import build_engine

info = dist.setup(120)
ACCUM, MICRO = 2, 2
gen = torch.Generator().manual_seed(1)
batches = [torch.randint(0, 64, (ACCUM * MICRO * info.world_size, 17), generator=gen) for _ in range(3)]

def engine(stage):
    cfg = load_config(None, ["model.size=tiny", "model.vocab_size=64", "model.seq_len=16", "model.n_layers=2",
                             "train.global_batch=8", "train.micro_batch=2", "parallel.backend=deepspeed",
                             f"parallel.zero_stage={stage}"])
    torch.manual_seed(0)
    return build_engine(build_model(cfg.model), cfg, info)

def train_step(eng, batch, skip):
    mine = batch.view(info.world_size, ACCUM, MICRO, -1)[info.rank]
    for a in range(ACCUM):
        loss = eng.forward(mine[a, :, :-1], mine[a, :, 1:])
        eng.backward(loss / ACCUM, last_micro=a == ACCUM - 1)
    norm = float(eng.clip_grad_norm(1.0))
    eng.skip() if skip else eng.step(1e-2)
    return norm

def loss_on(eng, batch):
    with torch.no_grad():
        return float(eng.forward(batch[:, :-1], batch[:, 1:]))

def adam_steps(eng):
    return sorted({float(s["step"]) for s in eng.base_opt.state.values() if "step" in s})

out = {}
for stage in (1, 2, 3):
    a, b = engine(stage), engine(stage)
    before = loss_on(a, batches[2])
    norm = train_step(a, batches[0], skip=True)      # finite gradients, discarded by the loop's decision
    r = {"norm": norm, "after_skip": loss_on(a, batches[2]), "before": before,
         "counters_after_skip": a.counters(), "adam_steps_after_skip": adam_steps(a)}
    train_step(a, batches[1], skip=False)
    train_step(b, batches[1], skip=False)            # b never saw batches[0]
    r.update(a_final=loss_on(a, batches[2]), b_final=loss_on(b, batches[2]), counters_final=a.counters(),
             adam_steps_a=adam_steps(a), adam_steps_b=adam_steps(b))
    out[stage] = r
if info.is_main:
    print("RESULT " + json.dumps(out))
dist.teardown()
'''


def test_skip_discards_finite_gradients(tmp_path):
    """`skip()` with finite gradients (the loop's decision, e.g. a non-finite loss): no weight, moment or
    AdamW step-count change, DeepSpeed's counters advance (global_steps 1, skipped_steps 1, micro_steps =
    accumulation), and the next step is bitwise what an engine that never saw the discarded batch does."""
    script = tmp_path / "skip_check.py"
    script.write_text(SKIP_CHECK)
    proc = _run(_torchrun(str(script)))
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    for stage, r in json.loads(line[len("RESULT "):]).items():
        assert math.isfinite(r["norm"]) and r["norm"] > 0, (stage, r)
        assert r["after_skip"] == r["before"], (stage, r)
        assert r["counters_after_skip"] == {"global_steps": 1, "skipped_steps": 1, "micro_steps": 2}, (stage, r)
        assert r["adam_steps_after_skip"] == [], (stage, r)
        assert r["adam_steps_a"] == r["adam_steps_b"] == [1.0], (stage, r)
        assert r["a_final"] == r["b_final"] != r["before"], (stage, r)
        assert r["counters_final"] == {"global_steps": 2, "skipped_steps": 1, "micro_steps": 4}, (stage, r)
