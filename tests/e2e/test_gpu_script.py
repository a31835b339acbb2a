"""`tests/benchmarks/gpu.sh` on CPU (ALLOW_CPU=1, tiny shapes): the script a lent GPU runs unattended.

It must work the first time there, so everything but the GPU is exercised here: the interpreter choice
without a venv or pip, the one-process driver (FSDP2 on a one-rank group, `rrtrain bench`'s step), the
table, the review/standard ratio and review against its matched baseline, the float8 pair (its bf16 half on
Markov-chain batches; the float8 half reported as unsupported on a CPU), the large model at the plan's
recommendation, and the report of measurements that failed, were skipped or never ran.
Runtime: one process with five one-to-three-step measurements at tiny shapes, about 15 s.
"""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from trainutil import PY, REPO, env

sys.path.insert(0, str(REPO / "tests" / "benchmarks"))

import gpu_matrix  # noqa: E402

SCRIPT = REPO / "tests" / "benchmarks" / "gpu.sh"


def test_gpu_script_measures_and_prints_the_table_on_cpu(tmp_path):
    results = tmp_path / "r.jsonl"
    e = {**env(), "ALLOW_CPU": "1", "PYTHON": PY, "SIZES": "micro", "VARIANTS": "standard standard@review review",
         "COMPILE_MODES": "false", "STEPS": "1", "WARMUP": "0", "MICRO": "2", "RESULTS": str(results),
         "EXTRA": "model.vocab_size=258 model.seq_len=32", "TIME_LIMIT": "240",
         "FLOAT8_SIZE": "micro", "FLOAT8_MICRO": "2", "LOSS_STEPS": "3", "FLOAT8_COMPILE": "false",
         "BIG_SIZE": "micro", "BIG_STEPS": "1", "BIG_WARMUP": "0", "BIG_COMPILE": "false"}
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=e, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "| size | variant | params | compile | seqs/GPU x seq | tokens/s/GPU | MFU | peak GiB | plan GiB | step ms |" \
        in out
    assert "| micro | standard |" in out and "| micro | review |" in out and "| micro | standard@review |" in out
    assert "| micro | no | " in out  # the review / standard step-time ratio, and against the matched baseline:
    assert "| size | compile | review / matched standard time per token | FLOP ratio | within target |" in out
    assert "float8 rowwise: no float8 matmuls here: no CUDA device (cpu)" in out  # the pair's bf16 half ran
    assert "| micro | off | no | 2x32 | 3 |" in out
    assert "at rrtrain plan's recommendation (AC none, 8x32 tokens" in out and "measured / planned" in out
    assert "not measured" not in out
    assert "torchao" in proc.stderr.splitlines()[0] or "torchao" in proc.stderr  # the versions that ran
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [(r.get("kind"), r["variant"]) for r in rows] == [
        ("float8", "standard"), ("float8", "standard"), ("big", "standard"),
        ("matrix", "standard"), ("matrix", "standard@review"), ("matrix", "review")]
    assert [rows[0]["float8"], rows[1]["float8"]] == ["off", "rowwise"]
    assert "unsupported" in rows[1] and len(rows[0]["losses"]) == 3 and all(0 < x < 10 for x in rows[0]["losses"])
    matrix = rows[3:]
    assert [(r["backend"], r["precision"], r["compile"]) for r in matrix] == [("fsdp", "bf16", False)] * 3
    assert all(r["steps"] == 1 and r["micro_batch"] == 2 and r["tokens_per_s"] > 0 for r in matrix)
    assert matrix[1]["params"] > matrix[0]["params"]  # widened to review's count
    assert all(r["torch"] and r["torchao"] for r in rows)


def test_render_reports_what_was_not_measured(tmp_path, capsys):
    results = tmp_path / "r.jsonl"
    rows = [{"size": "rr-1b", "variant": "standard", "compile_mode": "true", "error": "OutOfMemoryError: CUDA"},
            {"size": "rr-60m", "variant": "review", "compile_mode": "true", "skipped": "12 s of the time budget left"}]
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert gpu_matrix.render(results, expected=3) == 1
    out = capsys.readouterr().out
    assert "not measured: rr-1b standard compile=true: OutOfMemoryError: CUDA" in out
    assert "not measured: rr-60m review compile=true: skipped, 12 s of the time budget left" in out
    assert "not measured: 1 more (the run was stopped at its time limit)" in out


def test_plan_runs_eager_first_then_compiled_from_the_largest():
    assert gpu_matrix.plan(["rr-60m", "rr-1b"], ["standard", "review"], ["false", "true"]) == [
        ("rr-60m", "standard", "false"), ("rr-60m", "review", "false"),
        ("rr-1b", "standard", "false"), ("rr-1b", "review", "false"),
        ("rr-1b", "standard", "true"), ("rr-1b", "review", "true"),
        ("rr-60m", "standard", "true"), ("rr-60m", "review", "true")]


def test_render_checks_the_float8_loss_bound_and_the_plan(tmp_path, capsys):
    common = {"size": "rr-1b", "variant": "standard", "compile_mode": "true", "compile": True, "micro_batch": 16,
              "shape": {"seq_len": 1024}, "mfu": 0.4, "peak_mem_gb": 40.0, "step_time_s": 0.2, "device": "NVIDIA H200",
              "world_size": 1, "precision": "bf16", "peak_source": "table:H200:bf16", "peak_flops": 989e12}
    bf16 = {**common, "kind": "float8", "float8": "off", "tokens_per_s": 80_000.0, "losses": [10.0, 6.0, 4.0, 3.0]}
    f8 = {**common, "kind": "float8", "float8": "rowwise", "tokens_per_s": 100_000.0, "losses": [10.0, 6.0, 4.0, 3.1]}
    big = {**common, "kind": "big", "size": "frontier-7b", "params": 5.7e9, "ac": "none", "micro_batch": 2,
           "tokens_per_s": 9_000.0, "peak_mem_gb": 110.0, "planned_gb": 102.4, "plan_gpu": "h200",
           "peak_mem_kind": "cuda max allocated"}
    results = tmp_path / "r.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in (bf16, f8, big)))
    assert gpu_matrix.render(results, expected=3, loss_bound=0.05) == 0
    out = capsys.readouterr().out
    assert "float8 rowwise / bf16: tokens/s x1.250 (target >= 1.20); loss +3.33% (bound 5%): within" in out
    assert "measured 110.0 GiB, planned 102.4 GiB (measured / planned 1.074; within ±20%: yes)" in out
    assert gpu_matrix.render(results, expected=3, loss_bound=0.02) == 1  # drifted beyond the bound: a failure
    assert "OUTSIDE THE BOUND" in capsys.readouterr().out


def test_markov_batches_are_seeded_and_learnable():
    a = gpu_matrix.markov_batches(300, 16, 3, seed=1, step=5, device="cpu")[0]
    assert a.shape == (3, 17) and int(a.max()) < 300
    assert torch.equal(a, gpu_matrix.markov_batches(300, 16, 3, seed=1, step=5, device="cpu")[0])
    assert not torch.equal(a, gpu_matrix.markov_batches(300, 16, 3, seed=1, step=6, device="cpu")[0])
    successors = {}
    for row in a.tolist():
        for x, y in zip(row, row[1:]):
            successors.setdefault(x, set()).add(y)
    assert max(len(v) for v in successors.values()) <= 4  # each token has at most 4 successors
