"""Helpers shared by the downstream-evaluation tests (tests/e2e/test_eval.py, tests/distributed/test_eval_fsdp.py):
three small local lm-eval tasks (multiple choice, perplexity, generation), and the run's downstream records."""

from __future__ import annotations

import json
from pathlib import Path

from trainutil import records

TASKS = ["tiny_gen", "tiny_mc", "tiny_ppl"]
LIMIT = 6
KEY = f"tiny_gen+tiny_mc+tiny_ppl-limit{LIMIT}"
#: the generation task's limit on new tokens (the tiny runs' seq_len is 64)
GEN_TOKENS = 8
COLORS = ["red", "blue", "green", "yellow"]


def write_tasks(root: Path) -> Path:
    """A multiple-choice task of 8 items, a rolling-perplexity task of 4 texts, a generation task on the
    multiple-choice questions (greedy, up to GEN_TOKENS tokens or a full stop), and the same asking for lm-eval's
    default 256 tokens (more than the tiny runs' 64: refused)."""
    root.mkdir()
    mc = [{"question": f"Tom had a {COLORS[i % 4]} ball and a {COLORS[(i + 1) % 4]} cup. The ball was",
           "choices": [f" {c}." for c in COLORS], "answer": i % 4} for i in range(8)]
    (root / "mc.jsonl").write_text("".join(json.dumps(d) + "\n" for d in mc))
    texts = [{"text": "Once upon a time there was a little dog. " * (i + 1) + "The end."} for i in range(4)]
    (root / "ppl.jsonl").write_text("".join(json.dumps(d) + "\n" for d in texts))
    source = "dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {}\ntest_split: test\n"
    (root / "tiny_mc.yaml").write_text(
        "task: tiny_mc\n" + source.format(root / "mc.jsonl") + "output_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: "{{answer}}"\n'
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n")
    (root / "tiny_ppl.yaml").write_text(
        "task: tiny_ppl\n" + source.format(root / "ppl.jsonl") + "output_type: loglikelihood_rolling\n"
        'doc_to_text: ""\ndoc_to_target: "{{text}}"\n'
        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n")
    gen = ("output_type: generate_until\ndoc_to_text: \"{{question}}\"\ndoc_to_target: \"{{choices[answer]}}\"\n"
           "metric_list:\n  - metric: exact_match\n")
    (root / "tiny_gen.yaml").write_text(
        "task: tiny_gen\n" + source.format(root / "mc.jsonl") + gen
        + f'generation_kwargs: {{until: ["."], max_gen_toks: {GEN_TOKENS}, do_sample: false}}\n')
    (root / "tiny_gen_long.yaml").write_text("task: tiny_gen_long\n" + source.format(root / "mc.jsonl") + gen)
    return root


def downstream(run_dir: Path) -> list[dict]:
    """The run's in-loop downstream records, in file order."""
    return [r for r in records(run_dir) if r.get("kind") == "downstream"]


def close(a: float, b: float) -> bool:
    """Equal to 4 decimals (relative to the value for perplexities of many digits)."""
    return abs(a - b) <= 5e-5 * max(1.0, abs(b))
