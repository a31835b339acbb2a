"""The artifact a run leaves for everything downstream (`rrtrain export`, `rrtrain eval`, a warm start): the model's
consolidated weights and what rebuilds the model, written by training itself.

Layout: RUN/artifact/step_NNNNNNNN/ holds
- `model.safetensors`: every tensor of the unwrapped Transformer's state dict, fp32, its own names;
- `model.json`: {"format", "step", "tokens", "val_loss", "model": ModelSpec.to_dict() (shape, rule, the rule's
  knobs, norm / init / RoPE settings, parametrization), "tokenizer": the dataset's tokenizer reference (spec, eos,
  bos, vocabulary size and hash, the saved file's name), "weights": {file, sha256, bytes}};
- `tokenizer.json`: the dataset's saved tokenizer file, when it has one (`bpe:` / `hf:` tokenizers), so that the
  artifact stands without the dataset.

Written at the end of a run that ends with a checkpoint (not on preemption) and every `train.artifact_every` steps.
Every rank takes part in the consolidation (`Engine.full_model_state`, a collective); rank 0 alone writes, into a
hidden `.tmp_*` directory renamed into place when complete (as checkpoints are), files 0600 and directories 0700
through the file layer. A write that fails (a full disk) is one warning line: the run's checkpoint is what it
resumes from, and export can still consolidate that.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any, Optional

from rrtrain.core import dist
from rrtrain.core import files as rrfiles
from rrtrain.core.io import replace_dir
from rrtrain.rundir import layout

FORMAT = 1
WEIGHTS = "model.safetensors"
SPEC = "model.json"
TOKENIZER = "tokenizer.json"
STEP_PREFIX = "step_"


def step_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:08d}"


def tokenizer_reference(manifest: dict[str, Any], data_dir: Optional[str]) -> dict[str, Any]:
    """What rebuilds the dataset's tokenizer (the manifest's own fields), and where its saved file is."""
    ref = {k: manifest.get(k) for k in ("tokenizer", "tokenizer_file", "eos_id", "bos_id", "vocab_size",
                                        "tokenizer_hash")}
    ref["tokenizer"] = ref["tokenizer"] or "byte"
    ref["data_dir"] = data_dir
    return ref


def encode(state: dict[str, Any]) -> bytes:
    """safetensors bytes of a state dict: each tensor its own contiguous CPU copy (no shared storage)."""
    from safetensors.torch import save

    return save({k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}, metadata={"format": "pt"})


def write(engine: Any, run_dir: Path, step: int, tokens: int, val_loss: Optional[float],
          tokenizer: dict[str, Any], is_main: bool) -> Optional[Path]:
    """Collective: consolidate the weights on every rank, then rank 0 publishes RUN/artifact/step_N/. Returns the
    published directory on rank 0 (None elsewhere, or when the write failed and was reported)."""
    state = engine.full_model_state()
    published = None
    if is_main:
        try:
            published = _publish(engine.inner.spec.to_dict(), state, Path(run_dir), step, tokens, val_loss,
                                 tokenizer)
        except (OSError, ImportError) as err:
            print(f"rrtrain: warning: the model artifact of step {step} was not written "
                  f"({getattr(err, 'strerror', None) or err}); `rrtrain export` reads the checkpoint instead",
                  file=sys.stderr, flush=True)
    dist.barrier()
    return published


def _publish(spec: dict[str, Any], state: dict[str, Any], run_dir: Path, step: int, tokens: int,
             val_loss: Optional[float], tokenizer: dict[str, Any]) -> Path:
    root = run_dir / layout.ARTIFACT
    if root.is_symlink():  # refused at the start (rrtrain.rundir.own_files); one made since is not written through
        raise OSError(errno.ELOOP, f"{root} is a symbolic link: rrtrain follows a link at checkpoints/ only")
    rrfiles.make_dirs(root)
    key = rrfiles.directory_key(root)
    final = root / step_name(step)
    tmp = Path(rrfiles.make_temp_dir(f".tmp_{step_name(step)}_", root, key=key))
    try:
        blob = encode(state)
        rrfiles.atomic_write_file(tmp / WEIGHTS, blob)
        ref = {k: v for k, v in tokenizer.items() if k != "data_dir"}
        saved = tokenizer.get("tokenizer_file")
        if saved and tokenizer.get("data_dir"):
            rrfiles.atomic_write_file(tmp / TOKENIZER, rrfiles.read_bytes(Path(tokenizer["data_dir"]) / saved,
                                                                          "tokenizer"))
            ref["tokenizer_file"] = TOKENIZER
        else:
            ref["tokenizer_file"] = None
        record = {"format": FORMAT, "step": step, "tokens": tokens,
                  "val_loss": val_loss if val_loss is not None and math.isfinite(val_loss) else None,
                  "model": spec, "tokenizer": ref,
                  "weights": {"file": WEIGHTS, "sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob),
                              "dtype": "fp32"}}
        rrfiles.atomic_write_file(tmp / SPEC, json.dumps(record, indent=2) + "\n")
        rrfiles.set_private_modes(tmp)
        replace_dir(tmp, final, key=key)
    except BaseException:
        rrfiles.discard_made_dir(tmp, key=key)
        raise
    return final
