"""`rrtrain export RUN_DIR --hf OUT`: a run's checkpoint as a Hugging Face model directory.

OUT holds `model.safetensors`, `config.json`, `generation_config.json`, the tokenizer (tokenizer.json and its
config) and, unless `stock`, rrtrain's model package as it is (rrtrain/export/bundle.py) with the transformers
classes that load it (`trust_remote_code=True`), so that any of rrtrain's residual rules loads where rrtrain is
not installed. With
`stock` (the `standard` rule with RoPE only, rrtrain/export/stock.py) it is a stock `ArceeForCausalLM` instead.

Everything is written into a hidden directory beside OUT and renamed into place at the end: an OUT that exists
and is not empty is refused, and on any failure nothing is left behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from rrtrain.core import files as rrfiles
from rrtrain.core.errors import UsageError
from rrtrain.core.io import replace_dir
from rrtrain.artifact.stock import state_dict as stock_weights, stock_problem
from rrtrain.export import bundle, stock as stock_mod, tokenizer as tok_mod
from rrtrain.artifact import LoadedRun, load_run

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
WEIGHTS = "model.safetensors"


@dataclass(frozen=True)
class Exported:
    out: Path
    step: int
    variant: str
    files: list[str]
    stock: bool


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, got '{name}'")
    return DTYPES[name]


def check_out(out: Path) -> None:
    """OUT may be absent or an empty directory; its parent is made when missing (once the model is loaded)."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UsageError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        raise UsageError(f"{out} exists and is not empty; choose a new directory")
    if out.parent.exists() and not out.parent.is_dir():
        raise UsageError(f"{out.parent} is not a directory (the parent of the output directory)")


def rrtrain_section(run: LoadedRun) -> dict[str, Any]:
    """config.json's `rrtrain`: what the copied package needs to rebuild the model (`ModelSpec.to_dict`), and
    where it came from."""
    return {**run.model.spec.to_dict(), "step": run.step, "tokenizer": run.tokenizer.spec}


def bos_of(run: LoadedRun) -> Optional[int]:
    """The beginning-of-document token `rrtrain prep --bos` put before each document (None: none)."""
    return (run.manifest or {}).get("bos_id")


def remote_config(run: LoadedRun, dtype: torch.dtype, pad_id: Optional[int]) -> Any:
    """The export's own RrtrainConfig (its class from rrtrain/export/remote/, imported for the writing only)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("rrtrain_export_configuration",
                                                  bundle.TEMPLATES / "configuration_rrtrain.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.RrtrainConfig(
        rrtrain=rrtrain_section(run), tie_word_embeddings=True, bos_token_id=bos_of(run),
        eos_token_id=run.tokenizer.eos_id,
        pad_token_id=pad_id, torch_dtype=dtype, architectures=["RrtrainForCausalLM"],
        auto_map={"AutoConfig": "configuration_rrtrain.RrtrainConfig",
                  "AutoModelForCausalLM": "modeling_rrtrain.RrtrainForCausalLM"})


def save_weights(tensors: dict[str, torch.Tensor], path: Path, dtype: torch.dtype) -> None:
    """safetensors, every tensor its own contiguous copy in `dtype` (safetensors refuses shared storage)."""
    from safetensors.torch import save_file

    save_file({k: v.detach().to("cpu", dtype).contiguous().clone() for k, v in tensors.items()}, str(path),
              metadata={"format": "pt"})


def write_into(tmp: Path, run: LoadedRun, dtype: torch.dtype, stock: bool) -> None:
    from transformers import GenerationConfig

    assert run.shape is not None
    tok = run.tokenizer
    pad_id = getattr(tok, "pad_id", None)
    tok_mod.write(tmp, tok, run.shape.seq_len)
    state = run.model.state_dict()
    if stock:
        cfg = stock_mod.config(run.shape, run.config.model.norm_eps, run.config.model.rope_base, tok.eos_id,
                               pad_id, dtype)
        save_weights(stock_weights(state, run.shape), tmp / WEIGHTS, dtype)
    else:
        cfg = remote_config(run, dtype, pad_id)
        save_weights({f"model.{k}": v for k, v in state.items()}, tmp / WEIGHTS, dtype)
        bundle.write(tmp, run.model.rule)
    cfg.save_pretrained(str(tmp))
    GenerationConfig(eos_token_id=tok.eos_id, pad_token_id=pad_id if pad_id is not None else tok.eos_id,
                     bos_token_id=bos_of(run), use_cache=True).save_pretrained(str(tmp))
    rrfiles.atomic_write_file(tmp / "README.md", model_card(run, stock))


def model_card(run: LoadedRun, stock: bool) -> str:
    """README.md: what the model is (rule, size, shape), what it saw (data, tokens) and how it did (validation
    loss), from the run's own records."""
    cfg, shape = run.config, run.shape
    params = sum(p.numel() for p in run.model.parameters())
    data = cfg.data.path or ", ".join(getattr(s, "path", str(s)) for s in (cfg.data.sources or [])) or "unknown"
    val = f"{run.val_loss:.4f}" if run.val_loss is not None else "not recorded"
    tokens = f"{run.tokens:,}" if run.tokens is not None else "not recorded"
    loading = ("`AutoModelForCausalLM.from_pretrained(DIR)` (stock `ArceeForCausalLM`)" if stock else
               "`AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)` (`RrtrainForCausalLM`)")
    return (f"---\nlibrary_name: transformers\ntags: [rrtrain, {cfg.model.variant}]\n---\n\n"
            f"# {cfg.run.name or Path(cfg.run.dir).name} (rrtrain, `{cfg.model.variant}`)\n\n"
            f"A language model trained with rrtrain, exported at step {run.step}.\n\n"
            f"| | |\n| --- | --- |\n"
            f"| residual rule | `{cfg.model.variant}` |\n"
            f"| size | `{cfg.model.size}`: {params:,} parameters; d_model {shape.d_model}, {shape.n_layers} blocks, "
            f"{shape.n_heads} heads, d_ff {shape.d_ff}, seq_len {shape.seq_len}, positions {shape.pos} |\n"
            f"| tokenizer | `{run.tokenizer.spec}` ({run.tokenizer.vocab_size} tokens) |\n"
            f"| data | `{data}` |\n"
            f"| tokens seen | {tokens} |\n"
            f"| validation loss | {val} |\n\n"
            f"Load it with {loading}.\n")


def export_hf(run_dir: str | Path, out: str | Path, step: Optional[int] = None, dtype: str = "fp32",
              stock: bool = False, data_path: Optional[str] = None) -> Exported:
    """Export `run_dir`'s checkpoint of `step` (None: the newest usable one) into `out`."""
    out = Path(out)
    torch_dtype = parse_dtype(dtype)
    check_out(out)
    rrfiles.check_private_path(out, f"export output '{out}'")  # the trust_remote_code module goes there
    run = load_run(run_dir, step, data_path=data_path)
    if stock:
        assert run.shape is not None
        problem = stock_problem(run.config.model.variant, run.shape, run.model.knobs.values())
        if problem:
            raise UsageError(f"--stock: {problem}")
    else:
        bundle.check_exportable(run.model.rule)
    rrfiles.make_dirs(out.parent)  # the input is good: the output's parent may be made now
    tmp = Path(rrfiles.make_temp_dir(f".{out.name}.tmp_", out.parent))  # marked: deleted below only if made here
    try:
        write_into(tmp, run, torch_dtype, stock)
        rrfiles.set_private_modes(tmp)  # the user's alone, whatever the writers chose
        check_out(out)  # still absent or empty: nobody wrote there meanwhile
        replace_dir(tmp, out, mark=False)
        rrfiles.unmark(out)  # rrtrain's own marker is no part of the model directory
    except BaseException:
        rrfiles.discard_made_dir(tmp)
        raise
    files = sorted(p.name for p in out.iterdir())
    return Exported(out=out, step=run.step, variant=run.config.model.variant, files=files, stock=stock)
