"""`tests/benchmarks/gpu_device.sh` on CPU (ALLOW_CPU=1, tiny shapes): the one script a lent GPU runs unattended.

It must work the first time there, so everything but the GPU is exercised here, through the scripts it drives
(gpu.sh, gpu_rules.sh, gpu_matrix.py, the depth study): the interpreter checked once, each of the five parts in
its own processes and its own time, each printing its tables (the sizes table, the float8 pair with its bf16
half on Markov-chain batches and its float8 half reported unsupported on a CPU, every rule against `standard`
and `review` against its matched baseline, the depth study's verdicts, the large model at the plan's
recommendation), the summary, and the parts left out for want of time. It covers what the CPU runs of
gpu.sh and gpu_rules.sh covered before (they run as its parts now).
Runtime: about 45 s of CPU for the whole run, 5 s for the short one (a part that fails, one left out for time).
"""

from __future__ import annotations

import json
import stat
import subprocess

import pytest

from trainutil import PY, REPO, env

SCRIPT = REPO / "tests" / "benchmarks" / "gpu_device.sh"
VERDICTS = ("trained", "stalled", "diverged", "undecided")
TINY = {"ALLOW_CPU": "1", "PYTHON": PY, "SIZE": "micro", "SEQ": "32", "COMPILE": "false", "MICRO": "2", "STEPS": "1",
        "WARMUP": "0", "EXTRA": "model.vocab_size=258 model.seq_len=32"}

pytestmark = pytest.mark.slow  # it starts a dozen processes


def run(tmp_path, **knobs):
    e = {**env(), **TINY, "RESULTS_DIR": str(tmp_path / "res"), **knobs}
    return subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=e, capture_output=True, text=True, timeout=600)


def parts(out: str) -> dict[int, str]:
    """Each part's stdout, by its number."""
    chunks = out.split("\n# Part ")[1:]
    return {int(c[0]): c for c in chunks}


def test_gpu_device_script_runs_every_part_and_prints_its_tables_on_cpu(tmp_path):
    proc = run(tmp_path, TIME_LIMIT="900", PART_S="150 150 150", FLOAT8_MICRO="2", LOSS_STEPS="3",
               RULES="standard review standard@review mhc attnres_block_4", DEPTH_SHAPE="tiny", DEPTH_STEPS="6",
               DEPTH_MICRO="4", DEPTH_SEQ="32", DEPTH_TOKENIZER="bpe:300", DEPTH_DOCS="100", DEPTH_PRECISION="fp32",
               DEPTH_EXTRA="model.n_layers=3 model.d_model=32 model.n_heads=2", BIG_SIZE="micro", BIG_STEPS="1",
               BIG_WARMUP="0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out, res = proc.stdout, tmp_path / "res"
    assert stat.S_IMODE(res.stat().st_mode) == 0o700
    assert "not measured" not in out and "not run" not in out
    assert proc.stderr.count("CUDA device(s)") == 1 and "torchao" in proc.stderr  # checked once, versions said
    p = parts(out)
    assert sorted(p) == [1, 2, 3, 4, 5]

    # 1. standard at the size, its row of the sizes table
    assert "| size | variant | params | compile | seqs/GPU x seq | tokens/s/GPU | MFU | peak GiB | plan GiB |" in p[1]
    assert "| micro | standard | 0.1M | no | 2x32 |" in p[1]
    assert [(r["kind"], r["variant"], r["micro_batch"]) for r in rows(res / "part1.jsonl")] == [
        ("matrix", "standard", 2)]

    # 2. the float8 pair: the bf16 half trained on the Markov batches, the float8 half unsupported on a CPU
    assert "| micro | off | no | 2x32 | 3 |" in p[2]
    assert "float8 rowwise: no float8 matmuls here: no CUDA device (cpu)" in p[2]
    pair = rows(res / "part2.jsonl")
    assert [(r["kind"], r["float8"]) for r in pair] == [("float8", "off"), ("float8", "rowwise")]
    assert "unsupported" in pair[1] and len(pair[0]["losses"]) == 3 and all(0 < x < 10 for x in pair[0]["losses"])

    # 3. every rule against standard, and review against its matched baseline
    header = "| rule | params | FLOP ratio | step ms | x standard | tokens/s/GPU | MFU | peak GiB | x standard |"
    assert header in p[3] and "### micro, compile no: 2 x 32 tokens per GPU per step" in p[3]
    table = {line.split(" | ")[0][2:]: line.split(" | ") for line in p[3].splitlines()
             if line.startswith("| ") and " | " in line and not line.startswith(("| rule", "| size", "| micro"))}
    assert sorted(table) == ["attnres_block_4", "mhc", "review", "standard", "standard@review"]
    assert table["standard"][2:5:2] == ["1.000", "1.000"]  # its FLOP ratio and step-time ratio to itself
    assert float(table["mhc"][2]) > 1.0 and float(table["mhc"][4]) > 0 and table["mhc"][-1].strip(" |") == "1.10"
    assert "| size | compile | review / matched standard time per token | FLOP ratio | within target |" in p[3]
    rules = rows(res / "part3" / "rules.jsonl")
    assert [(r["variant"], r["rule"]) for r in rules] == [
        ("standard", "standard"), ("review", "review"), ("standard@review", "standard"), ("mhc", "mhc"),
        ("attnres_block_4", "attnres")]
    assert rules[2]["params"] > rules[0]["params"]  # standard widened to review's count
    assert rules[4]["shape"]["n_layers"] == 2 and all(r["compile"] is False and r["torchao"] for r in rules)

    # 4. the depth study: both gates, a verdict each, against the unigram entropy, gradient norms per block
    assert "depth study: bpe:300 synthetic stories, unigram entropy " in p[4]
    lines = [line for line in p[4].splitlines() if line.startswith("| tiny | 6 | ")]
    assert [line.split(" | ")[2:4] for line in lines] == [["review_convex", "0.0003"], ["review", "0.0003"]]
    assert all(line.split(" | ")[4].split()[0] in VERDICTS for line in lines)
    depth = rows(res / "part4" / "depth.jsonl")
    assert all(len(r["block_grad_norm"]) == 3 and len(r["block_grad_norm_init"]) == 3 for r in depth)
    assert all(r["tokenizer"] == "bpe:300" and r["seq_len"] == 32 and 0 < r["unigram_entropy"] < 6 for r in depth)

    # 5. the large model at the plan's recommendation
    assert "at rrtrain plan's recommendation (AC none, 8x32 tokens" in p[5] and "measured / planned" in p[5]
    assert [r["kind"] for r in rows(res / "part5.jsonl")] == ["big"]

    summary = out.split("# Summary: ")[1]
    assert summary.count("| done in ") == 5 and "skipped for time: none" in summary


def test_gpu_device_script_reports_a_failed_part_and_lists_what_time_leaves_out(tmp_path):
    bad = run(tmp_path, PART_S="90 120")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "gpu_device.sh: error: PART_S must be three numbers of seconds (parts 1, 2 and 3), got '90 120'"]

    # part 1 fails (a bad override), part 5 has too little time: both reported, and the summary lists part 5;
    # the interpreter counts as checked (GPU_PY_CHECKED, as the driver marks it for its parts; the test above checks it)
    proc = run(tmp_path, TIME_LIMIT="119", PART_S="115 100 100", PARTS="1 5", BIG_SIZE="micro",
               EXTRA="model.vocab_size=258 model.no_such_key=1", GPU_PY_CHECKED=PY)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "not measured: micro standard compile=false: UsageError: unknown key 'model.no_such_key'" in \
        parts(proc.stdout)[1]
    summary = proc.stdout.split("# Summary: ")[1]
    status = {cells[0][0]: cells[1] for cells in (line.strip("| ").split(" | ") for line in summary.splitlines()
                                                   if line[:3] in ("| 1", "| 2", "| 3", "| 4", "| 5"))}
    assert status["1"].startswith("not complete (exit 1) after ")
    assert status["2"] == status["3"] == status["4"] == "not asked (PARTS)"
    assert status["5"].startswith("skipped for time: ") and status["5"].endswith("it needs 130s")
    assert summary.rstrip().endswith("skipped for time: 5")
    assert not (tmp_path / "res" / "part5.jsonl").exists()


def rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]
