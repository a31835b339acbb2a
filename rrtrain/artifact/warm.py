"""Warm starts: `init.from: RUN_DIR[@STEP] | EXPORT_DIR | hf:PATH` gives a new run its first weights (only: the
optimizer and the schedule start fresh).

- `RUN_DIR[@STEP]`: another run's model at STEP (default: its newest), from its artifact or its checkpoint
  (rrtrain/artifact/run.py);
- `EXPORT_DIR`: a directory `rrtrain export` wrote: its config.json's `rrtrain` section says what the model is, its
  model.safetensors holds the weights (bf16 exports are widened to fp32); a `--stock` export is read as `hf:`;
- `hf:PATH`: a local Hugging Face checkpoint of the Llama family that maps exactly onto `standard` (Arcee:
  `ArceeForCausalLM` with hidden_act gelu, tied embeddings), through the adapter that exports it
  (rrtrain/artifact/stock.py `from_hf`). A LlamaForCausalLM is refused: its MLP is gated, `standard`'s is not.

The source is untrusted: config.json and model.json are read bounded through the file layer, the weights file
through the layer (regular, no link) and parsed by safetensors from the bytes in hand (no pickle); a sharded
checkpoint (`model.safetensors.index.json`) is not read. The model it describes must be this run's: the same rule,
shape and knobs (an HF checkpoint: the same shape, norm epsilon and RoPE base). Any mismatch is one UsageError
line (exit 2), raised before the run directory is written. The run records where its weights came from in
RUN/init.json (source, kind, step, file, sha256).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from rrtrain.artifact import stock
from rrtrain.artifact.run import checkpoint_steps, load_run, read_weights, spec_of
from rrtrain.config import Config
from rrtrain.core import files
from rrtrain.core.errors import UsageError
from rrtrain.model.spec import ModelSpec
from rrtrain.rundir import layout

HF_PREFIX = "hf:"
HF_CONFIG = "config.json"
HF_WEIGHTS = "model.safetensors"


@dataclass
class WarmStart:
    """The weights a new run starts from (the unwrapped Transformer's names, fp32, CPU) and where they came from."""

    state: dict[str, torch.Tensor]
    record: dict[str, Any]


def parse(text: str) -> tuple[str, Path, Optional[int]]:
    """(kind, path, step) of an `init.from` value: kind "run", "export" or "hf"."""
    if text.startswith(HF_PREFIX):
        path = Path(text[len(HF_PREFIX):])
        if not (path / HF_CONFIG).is_file():
            raise UsageError(f"init.from: {path} is not a Hugging Face checkpoint directory (no {HF_CONFIG})")
        return "hf", path, None
    base, at, step_text = text.rpartition("@")
    if at and step_text.isdigit() and (Path(base) / layout.CONFIG).is_file():
        return "run", Path(base), int(step_text)
    path = Path(text)
    if (path / layout.CONFIG).is_file() and (path / layout.METRICS).is_file():
        return "run", path, None
    if (path / HF_CONFIG).is_file():
        return "export", path, None
    raise UsageError(f"init.from: {text} is neither a run directory (config.yaml, metrics.jsonl), an export "
                     f"({HF_CONFIG}) nor hf:PATH")


def same_model(found: ModelSpec, want: ModelSpec, source: str) -> None:
    """The rule, shape and knobs of `found` must be `want`'s."""
    if found.rule.name != want.rule.name:
        raise UsageError(f"init.from: {source} holds rule '{found.rule.name}', this run trains '{want.rule.name}'")
    a, b = dataclasses.asdict(found.shape), dataclasses.asdict(want.shape)
    diff = next((k for k in b if a.get(k) != b[k]), None)
    if diff is not None:
        raise UsageError(f"init.from: {source} has {diff}={a.get(diff)}, this run's model has {diff}={b[diff]}")
    ka, kb = found.knobs.values(), want.knobs.values()
    knob = next((k for k in sorted(set(ka) | set(kb)) if ka.get(k) != kb.get(k)), None)
    if knob is not None:
        raise UsageError(f"init.from: {source} has model.residual.{knob}={ka.get(knob)!r}, this run's model has "
                         f"{kb.get(knob)!r}")


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(files.read_bytes(path, "json").decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise UsageError(f"init.from: {path} cannot be read ({getattr(err, 'strerror', None) or type(err).__name__})"
                         ) from None
    if not isinstance(data, dict):
        raise UsageError(f"init.from: {path} is not a JSON object")
    return data


def from_run(path: Path, step: Optional[int], want: ModelSpec, source: str) -> WarmStart:
    run = load_run(path, step)
    same_model(run.model.spec, want, source)
    state = {k: v.detach().float().clone() for k, v in run.model.state_dict().items()}
    if run.record is not None:  # an artifact: its weights file's own sha256
        digest, file = run.record["weights"]["sha256"], str(run.checkpoint / HF_WEIGHTS)
    else:  # a checkpoint: the consolidated weights, as safetensors bytes
        from rrtrain.training.artifact import encode

        digest, file = hashlib.sha256(encode(state)).hexdigest(), str(run.checkpoint)
    return WarmStart(state, {"kind": "run", "step": run.step, "file": file, "sha256": digest})


def from_hf_dir(kind: str, path: Path, want: ModelSpec, source: str) -> WarmStart:
    config = read_json(path / HF_CONFIG)
    if not (path / HF_WEIGHTS).is_file():
        index = " (a sharded checkpoint: not read; save it as one file)" if (path / f"{HF_WEIGHTS}.index.json").exists() else ""
        raise UsageError(f"init.from: {path} holds no {HF_WEIGHTS}{index}")
    section = config.get("rrtrain")
    if kind == "export" and isinstance(section, dict):  # rrtrain's own export: the model package's names
        found = spec_of({"model": section}, path)
        same_model(found, want, source)
        tensors, digest = _weights(path)
        state = {k[len("model."):]: v.float() for k, v in tensors.items() if k.startswith("model.")}
        if len(state) != len(tensors):
            raise UsageError(f"init.from: {path / HF_WEIGHTS} holds tensors outside the model ('model.' names)")
    else:
        if want.rule.name != "standard":
            raise UsageError(f"init.from: {source} is a Hugging Face checkpoint; only the `standard` rule maps onto one "
                             f"(this run trains '{want.rule.name}')")
        problem = stock.hf_problem(config, want.shape, want.norm_eps, want.rope_base)
        if problem:
            raise UsageError(f"init.from: {source}: {problem}")
        tensors, digest = _weights(path)
        try:
            state = {k: v.float() for k, v in stock.from_hf(tensors, want.shape).items()}
        except KeyError as err:
            raise UsageError(f"init.from: {path / HF_WEIGHTS} holds no {err.args[0]}") from None
        except ValueError as err:
            raise UsageError(f"init.from: {path / HF_WEIGHTS}: {err}") from None
        kind = "hf"
    return WarmStart(state, {"kind": kind, "step": None, "file": str(path / HF_WEIGHTS), "sha256": digest})


def _weights(path: Path) -> tuple[dict[str, torch.Tensor], str]:
    try:
        return read_weights(path / HF_WEIGHTS)
    except UsageError as err:
        raise UsageError(f"init.from: {err}") from None


def check_shapes(state: dict[str, torch.Tensor], want: ModelSpec, source: str) -> None:
    """Every tensor of the model, of its shape, and nothing else (built on meta: no memory, no RNG)."""
    from rrtrain.model.transformer import Transformer

    with torch.device("meta"):
        own = Transformer(want, seed=None).state_dict()
    missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or extra:
        raise UsageError(f"init.from: {source} does not hold this run's model "
                         f"({'no ' + missing[0] if missing else 'an extra ' + extra[0]})")
    for name, tensor in own.items():
        if tuple(state[name].shape) != tuple(tensor.shape):
            raise UsageError(f"init.from: {source}: {name} is {tuple(state[name].shape)}, this run's model has "
                             f"{tuple(tensor.shape)}")


def read_source(text: str, want: ModelSpec) -> WarmStart:
    """The weights `init.from` names, checked against the model `want` describes."""
    kind, path, step = parse(text)
    if kind == "run":
        warm = from_run(path, step, want, text)
    else:
        warm = from_hf_dir(kind, path, want, text)
    check_shapes(warm.state, want, text)
    warm.record = {"source": text, **warm.record}
    return warm


def prepare(cfg: Config) -> Optional[WarmStart]:
    """Before the run directory is written: the warm start `cfg.init` asks for, read and checked against the run's
    model (resolved against its dataset); None when there is none, or when the run has a checkpoint to resume
    (its own weights win)."""
    text = cfg.init.from_
    if not text:
        return None
    if cfg.train.branch_from:
        raise UsageError("init.from and train.branch_from both set: a branch starts from its parent's full state; "
                         "set one")
    if cfg.run.dir and checkpoint_steps(cfg.run.dir):
        return None
    from rrtrain.data.manifest import read_manifest
    from rrtrain.resolve import resolve

    if cfg.data.sources:
        from rrtrain.data.sources import read_mixture

        manifest = read_mixture(cfg.data).manifest
    elif cfg.data.path:
        manifest = read_manifest(cfg.data.path)
    else:
        raise UsageError("data.path is not set: point it at a directory written by `rrtrain prep`")
    return read_source(text, resolve(cfg, manifest).model_spec)


def record_bytes(warm: WarmStart) -> bytes:
    """RUN/init.json."""
    return (json.dumps(warm.record, indent=2) + "\n").encode("utf-8")
