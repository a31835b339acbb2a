"""`tests/benchmarks/gpu_rules.sh` on CPU (ALLOW_CPU=1, tiny shapes): the script a lent GPU runs unattended.

Everything but the GPU is exercised: the interpreter choice, part 1 (the depth study with a BPE vocabulary, two
rules at two learning rates) and part 2 (four rules against `standard` through gpu_matrix.py, FSDP2 on a one-rank
group), and both tables with their contents. About 15 s of CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys

from trainutil import PY, REPO, env

sys.path.insert(0, str(REPO / "tests" / "benchmarks"))

import gpu_matrix  # noqa: E402

SCRIPT = REPO / "tests" / "benchmarks" / "gpu_rules.sh"
VERDICTS = ("trained", "stalled", "diverged", "undecided")


def test_gpu_rules_script_prints_both_tables_on_cpu(tmp_path):
    e = {**env(), "ALLOW_CPU": "1", "PYTHON": PY, "RESULTS_DIR": str(tmp_path / "res"), "TIME_LIMIT": "240",
         "DEPTH_SHAPES": "tiny", "DEPTH_RULES": "review_convex review", "DEPTH_LR_FACTORS": "1 3", "DEPTH_STEPS": "6",
         "DEPTH_MICRO": "4", "DEPTH_SEQ": "32", "DEPTH_TOKENIZER": "bpe:300", "DEPTH_DOCS": "100",
         "DEPTH_PRECISION": "fp32", "DEPTH_EXTRA": "model.n_layers=3 model.d_model=32 model.n_heads=2",
         "DEPTH_TIME": "100", "RULE_SIZES": "micro", "RULES": "standard review mhc attnres_block_4",
         "RULE_COMPILE": "false", "STEPS": "1", "WARMUP": "0", "MICRO": "2",
         "EXTRA": "model.vocab_size=258 model.seq_len=32"}
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=e, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    depth_part, _, rules_part = out.partition("## The rules' cost")
    assert "## The depth study" in depth_part and "not run" not in out and "not measured" not in out
    assert "depth study: bpe:300 synthetic stories, unigram entropy " in depth_part
    lines = [line for line in depth_part.splitlines() if line.startswith("| tiny | 6 | ")]
    assert [line.split(" | ")[2:4] for line in lines] == [
        ["review_convex", "0.0003"], ["review_convex", "0.0009"], ["review", "0.0003"], ["review", "0.0009"]]
    assert all(line.split(" | ")[4].split()[0] in VERDICTS for line in lines)
    depth = [json.loads(line) for line in (tmp_path / "res" / "depth.jsonl").read_text().splitlines()]
    assert all(len(r["block_grad_norm"]) == 3 and len(r["block_grad_norm_init"]) == 3 for r in depth)
    assert all(r["tokenizer"] == "bpe:300" and r["seq_len"] == 32 and 0 < r["unigram_entropy"] < 6 for r in depth)
    assert depth[0]["lr"] == 3e-4  # the default: configs/train/paper.yaml's train.lr

    header = "| rule | params | FLOP ratio | step ms | x standard | tokens/s/GPU | MFU | peak GiB | x standard |"
    assert header in rules_part
    assert "### micro, compile no: 2 x 32 tokens per GPU per step" in rules_part
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in rules_part.splitlines()
            if line.startswith("| ") and not line.startswith("| rule")}
    assert sorted(rows) == ["attnres_block_4", "mhc", "review", "standard"]
    assert rows["standard"][2:5:2] == ["1.000", "1.000"]  # its FLOP ratio and step-time ratio to itself
    assert float(rows["mhc"][2]) > 1.0 and float(rows["mhc"][4]) > 0 and rows["mhc"][-1].strip(" |") == "1.10"
    rules = [json.loads(line) for line in (tmp_path / "res" / "rules.jsonl").read_text().splitlines()]
    assert [(r["variant"], r["rule"]) for r in rules] == [
        ("standard", "standard"), ("review", "review"), ("mhc", "mhc"), ("attnres_block_4", "attnres")]
    assert rules[3]["shape"]["n_layers"] == 2 and all(r["compile"] is False for r in rules)


def test_variant_labels_carry_their_residual_settings():
    assert gpu_matrix.variant_overrides("hc_static") == ["model.variant=hc", "model.residual.hc_dynamic=false"]
    assert gpu_matrix.variant_overrides("attnres_block_4") == ["model.variant=attnres",
                                                                "model.residual.attnres_block_size=4"]
    assert gpu_matrix.variant_overrides("gr") == ["model.variant=gr"]


def test_render_rules_reports_what_was_not_measured(tmp_path, capsys):
    results = tmp_path / "r.jsonl"
    rows = [{"size": "rr-1b", "variant": "mhc", "compile_mode": "true", "error": "OutOfMemoryError: CUDA"},
            {"size": "rr-150m", "variant": "gr", "compile_mode": "true", "skipped": "12 s of the time budget left"}]
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert gpu_matrix.render_rules(results, expected=3) == 1
    out = capsys.readouterr().out
    assert "not measured: rr-1b mhc compile=true: OutOfMemoryError: CUDA" in out
    assert "not measured: rr-150m gr compile=true: skipped, 12 s of the time budget left" in out
    assert "not measured: 1 more (the run was stopped at its time limit)" in out
