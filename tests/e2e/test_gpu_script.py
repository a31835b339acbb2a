"""`tests/benchmarks/gpu.sh` on CPU (ALLOW_CPU=1, tiny shapes): the script a lent GPU runs unattended.

It must work the first time there, so everything but the GPU is exercised here: the interpreter choice
without a venv or pip, the one-process driver (FSDP2 on a one-rank group, `rrtrain bench`'s step), the
table, the review/standard ratio, and the report of measurements that failed, were skipped or never ran.
Runtime: one process with two one-step measurements, about 10 s.
"""

from __future__ import annotations

import json
import subprocess
import sys

from trainutil import PY, REPO, env

sys.path.insert(0, str(REPO / "tests" / "benchmarks"))

import gpu_matrix  # noqa: E402

SCRIPT = REPO / "tests" / "benchmarks" / "gpu.sh"


def test_gpu_script_measures_and_prints_the_table_on_cpu(tmp_path):
    results = tmp_path / "r.jsonl"
    e = {**env(), "ALLOW_CPU": "1", "PYTHON": PY, "SIZES": "micro", "VARIANTS": "standard review",
         "COMPILE_MODES": "false", "STEPS": "1", "WARMUP": "0", "MICRO": "2", "RESULTS": str(results),
         "EXTRA": "model.vocab_size=258 model.seq_len=32", "TIME_LIMIT": "240"}
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=e, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "| size | variant | params | compile | seqs/GPU x seq | tokens/s/GPU | MFU | peak GiB | step ms |" in out
    assert "| micro | standard |" in out and "| micro | review |" in out
    assert "| micro | no | " in out  # the review / standard step-time ratio
    assert "not measured" not in out
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [(r["variant"], r["backend"], r["precision"], r["compile"]) for r in rows] == [
        ("standard", "fsdp", "bf16", False), ("review", "fsdp", "bf16", False)]
    assert all(r["steps"] == 1 and r["micro_batch"] == 2 and r["tokens_per_s"] > 0 for r in rows)


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
