"""`rrtrain export RUN_DIR --hf OUT [--step N] [--dtype fp32|bf16] [--stock]`: a run's model (its artifact, or a
checkpoint consolidated; rrtrain/artifact/) as a Hugging Face model directory (rrtrain/export/hf.py);
`transformers.AutoModelForCausalLM.from_pretrained(OUT, trust_remote_code=True)` loads it, for any residual rule,
without rrtrain (docs/evaluation.md)."""

from __future__ import annotations

import argparse
import importlib.util

from rrtrain.core.args import CommandParser
from rrtrain.core.errors import UsageError


def parse(argv: list[str]) -> argparse.Namespace:
    p = CommandParser(prog="rrtrain export", description=__doc__)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory with a model artifact or a checkpoint")
    p.add_argument("--hf", required=True, metavar="OUT", help="the directory to write (absent or empty)")
    p.add_argument("--step", type=int, default=None, help="the step (default: the newest)")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="of the stored weights (default fp32)")
    p.add_argument("--stock", action="store_true",
                   help="write `standard` (model.pos=rope) as a stock ArceeForCausalLM, loaded without remote code")
    p.add_argument("--data", default=None, metavar="DIR",
                   help="the run's prepared dataset, when it has moved from the recorded data.path (its tokenizer)")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    missing = [m for m in ("transformers", "safetensors") if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"rrtrain export needs {' and '.join(missing)}: pip install 'rrtrain[eval]'")
    from rrtrain.export.hf import export_hf

    done = export_hf(args.run_dir, args.hf, step=args.step, dtype=args.dtype, stock=args.stock, data_path=args.data)
    kind = "ArceeForCausalLM (stock)" if done.stock else "RrtrainForCausalLM (trust_remote_code=True)"
    print(f"rrtrain export: {done.variant} at step {done.step} -> {done.out} ({kind}, {args.dtype}; "
          f"{', '.join(done.files)})")
    return 0
