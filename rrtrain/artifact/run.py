"""A trained run's model, loaded on one process: from the model artifact training wrote
(RUN/artifact/step_N/, rrtrain/training/artifact.py), or, for a run that ended before artifacts existed (or a
step that has a checkpoint and no artifact), consolidated from its checkpoint by the engines' own reader
(rrtrain/parallel/consolidate.py).

`rrtrain eval`, `rrtrain export` and a warm start (`init.from: RUN_DIR[@STEP]`) start here: a run directory is
turned back into rrtrain's own single-device `Transformer` (any residual rule), its recorded config, the step and
the tokenizer it was trained with.

Everything read is untrusted: the config and model.json through the bounded reader; the artifact's weights
through the file layer, checked against the sha256 model.json records, then parsed by safetensors (no pickle);
a checkpoint only after its files matched the manifest in `train_state.json` (the checks resume makes,
`CheckpointManager.problem`); the tokenizer file through the bounded reader. Bad input is one UsageError line
and nothing is written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from data_prep.tokenizer import HFTokenizer, Tokenizer, reload
from rrtrain import config as config_mod
from rrtrain import residuals, sizing
from rrtrain.config import Config
from rrtrain.core import files
from rrtrain.core.dist import DistInfo
from rrtrain.core.errors import UsageError
from rrtrain.data.manifest import read_manifest
from rrtrain.knobs import check_keys, drop_other_rules_knobs, rule_knobs
from rrtrain.model.spec import ModelSpec
from rrtrain.model.transformer import DOC_POSITIONS, Transformer
from rrtrain.parallel.consolidate import load_checkpoint_weights, stored_model_elements
from rrtrain.resolve import check_model, model_spec, resolve, rules_in_play, with_knobs
from rrtrain.rundir import layout, readers
from rrtrain.sizing import ModelShape
from rrtrain.training import artifact as artifact_out
from rrtrain.training.checkpoint import CheckpointManager
from rrtrain.training.continuation import checkpoint_steps as published_checkpoints

STEP_DIR = re.compile(r"^step_(\d{1,18})$")
#: a tokenizer.json larger than this is not one a dataset of rrtrain's holds (GPT-2's is 1.4 MB)
MAX_TOKENIZER_BYTES = files.LIMITS["tokenizer"]
#: the largest weights file read whole (a 64 GiB fp32 model: 16 B parameters)
MAX_WEIGHTS_BYTES = 64 << 30
#: the buffers a record's model may build from its shape beyond its weights' count (never stored: RoPE's tables, a
#: rule's masks; a tiny model's long context): 2^26 numbers, 256 MB in fp32
MAX_TABLE_SLACK = 1 << 26


@dataclass
class LoadedRun:
    """What a consumer of a trained model needs: the model (eval mode), how it was configured, and its tokenizer."""

    model: nn.Module  # rrtrain's own single-device Transformer, eval mode
    config: Config  # RUN_DIR/config.yaml, validated
    step: int  # the step of the weights
    tokenizer: Tokenizer  # the run's tokenizer (data_prep.tokenizer)
    checkpoint: Path  # where the weights came from: an artifact directory, or a checkpoint
    shape: Optional[ModelShape] = None  # the model's resolved shape (matched d_ff included)
    manifest: Optional[dict] = None  # the tokenizer's reference: the dataset's manifest, or the artifact's record
    record: Optional[dict] = None  # the artifact's model.json (None: loaded from a checkpoint)
    tokens: Optional[int] = None  # tokens seen up to `step`
    val_loss: Optional[float] = None  # the run's last validation loss at `step` (None: none recorded)


def checkpoint_steps(run_dir: str | Path) -> list[int]:
    """The steps of the run's published checkpoints (renamed into place: complete when written), ascending, listed
    as training lists them: through a link the user made at `checkpoints/` (whose target `choose_checkpoint`'s
    manager resolves once and checks is theirs alone, as training does); a link or a file named like a checkpoint
    is not one."""
    return sorted(published_checkpoints(Path(run_dir)))


def _step_of(path: Path) -> Optional[int]:
    m = STEP_DIR.match(path.name)
    return int(m.group(1)) if m else None


def read_run_config(run_dir: str | Path) -> Config:
    """RUN_DIR/config.yaml (read bounded, as untrusted), built and validated as a run's config is, and checked
    against the registry and the presets."""
    run_dir = Path(run_dir)
    problems: list[str] = []
    data = readers.read_config(run_dir, problems)
    if problems:
        raise UsageError(f"{run_dir}: {problems[0]}")
    try:
        cfg = config_mod.build(Config, data)
        config_mod.validate(cfg)
        cfg = drop_other_rules_knobs(cfg, rules_in_play(cfg))
        check_model(cfg)
    except UsageError as err:
        raise UsageError(f"{run_dir / layout.CONFIG} does not validate: {err}") from None
    return with_knobs(cfg)


def require_run_dir(run_dir: str | Path) -> Path:
    """`run_dir` when it is a run directory (config.yaml and metrics.jsonl, regular files); UsageError otherwise."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is not a run directory (not a directory)")
    missing = [name for name in (layout.CONFIG, layout.METRICS)
               if (run_dir / name).is_symlink() or not (run_dir / name).is_file()]
    if missing:
        raise UsageError(f"{run_dir} is not a run directory (no {' / '.join(missing)})")
    return run_dir


def choose_checkpoint(run_dir: Path, cfg: Config, step: Optional[int]) -> Path:
    """The checkpoint to load, its files checked against its manifest as resume checks them: `step`'s, or the
    newest usable one (newer unusable ones are passed over with a warning, as resume does). The manager resolves a
    link at `checkpoints/` once and refuses, in one line, a place someone else could change, as training does."""
    if not checkpoint_steps(run_dir):
        raise UsageError(f"{run_dir} has no checkpoint (nothing under {run_dir / layout.CHECKPOINTS})")
    manager = CheckpointManager(run_dir, keep=1, info=DistInfo(0, 1, 0, torch.device("cpu")),
                                allow_unverified=cfg.train.allow_unverified_checkpoint)  # only read: no save, no prune
    found = {s: p for p in manager.complete() if (s := _step_of(p)) is not None}
    if step is None:
        path = manager.latest()
        if path is None:  # gone since they were listed
            raise UsageError(f"{run_dir} has no checkpoint (nothing under {manager.root})")
        return path
    if step not in found:
        raise UsageError(f"{run_dir} has no checkpoint at step {step} (checkpoints: "
                         f"{', '.join(map(str, sorted(found))) or 'none'})")
    path = found[step]
    problem = manager.problem(path)
    if problem is not None:
        raise UsageError(f"checkpoint {path} is unusable: {problem}")
    return path


def checked_shape(raw: Any, what: str) -> ModelShape:
    """A recorded model shape (untrusted): exactly ModelShape's fields, each size an int in [1, 2^31)."""
    names = {f.name for f in dataclasses.fields(ModelShape)}
    ok = isinstance(raw, dict) and set(raw) == names and raw.get("pos") in ("learned", "rope") and all(
        type(raw[k]) is int and 1 <= raw[k] < 2**31 for k in names - {"pos"})
    if not ok:
        raise UsageError(f"{what} is not a model shape (got {str(raw)[:80]})")
    shape = ModelShape(**raw)
    try:
        sizing.check_shape(shape, key="")
    except UsageError as err:
        raise UsageError(f"{what}: {err}") from None
    return shape


def recorded_shape(state: dict[str, Any]) -> Optional[ModelShape]:
    """The shape train_state.json recorded (None: an older checkpoint without it); a malformed one is refused."""
    raw = state.get("shape")
    return None if raw is None else checked_shape(raw, "train_state.json: field 'shape'")


def check_fits(spec: ModelSpec, stored: int | dict[str, tuple[int, ...]], where: Path) -> None:
    """Refuse, before anything is allocated, a recorded model that the weights stored are not: a record naming
    10^12 rows, a rule's 2^17 streams or 2^30 positions would end in the allocator's traceback or fill the
    machine's memory. `stored` is the stored tensors' shapes by name, or, for a checkpoint (whose tensors are
    compared with the model's as they load), how many numbers it holds. The shape's weights are counted first
    (which bounds the model's size), then the model is built on the meta device (nothing allocated): its tensors
    must be the stored ones, and the buffers it makes from the shape and never stores (RoPE's tables, a rule's
    masks) no larger than the weights justify."""
    elements = stored if isinstance(stored, int) else sum(math.prod(s) for s in stored.values())
    need = sizing.backbone_params(spec.shape)
    if need > elements:
        raise UsageError(f"{where}: the recorded shape needs {need:,} weights, more than the {elements:,} stored")
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = Transformer(spec, seed=None)
    own = model.state_dict()
    if isinstance(stored, int):
        held = sum(t.numel() for t in own.values())
        if held > elements:
            raise UsageError(f"{where}: the recorded model has {held:,} weights, more than the {elements:,} stored")
    else:
        problem = mismatch({k: tuple(t.shape) for k, t in own.items()}, stored)
        if problem:
            raise UsageError(f"{where} does not hold this model ({problem})")
    tables = sum(b.numel() for name, b in model.named_buffers() if name not in own)
    if tables > max(elements, MAX_TABLE_SLACK):
        raise UsageError(f"{where}: the buffers the recorded model builds from its shape and never stores "
                         f"({tables:,} numbers; seq_len {spec.shape.seq_len:,}) are more than its {elements:,} "
                         "weights justify")


def mismatch(own: dict[str, tuple[int, ...]], stored: dict[str, tuple[int, ...]]) -> Optional[str]:
    """How the stored tensors' shapes differ from the model's, said in a few words; None when they are the same."""
    missing, extra = sorted(set(own) - set(stored)), sorted(set(stored) - set(own))
    if missing or extra:
        return f"no {missing[0]}" if missing else f"an extra {extra[0]}"
    for name, shape in own.items():
        if tuple(stored[name]) != shape:
            return f"{name} is {tuple(stored[name])}, the model has {shape}"
    return None


def read_tokenizer(data_path: str, manifest: dict[str, Any]) -> Tokenizer:
    """The tokenizer a dataset was prepared with, rebuilt from its manifest (a trained or hf one from its saved
    tokenizer.json, read bounded) and checked against the manifest's vocabulary size and hash."""
    spec = manifest.get("tokenizer") or "byte"
    saved = manifest.get("tokenizer_file")
    if not (isinstance(spec, str) and (saved is None or isinstance(saved, str))
            and type(manifest.get("eos_id")) is int):
        raise UsageError(f"the tokenizer reference of {data_path} is malformed ('tokenizer' and 'tokenizer_file' "
                         "strings, 'eos_id' an integer)")
    try:
        if spec.startswith(("bpe:", "hf:")):
            if not saved or "/" in saved or saved in (".", ".."):
                raise UsageError(f"the manifest of {data_path} names no tokenizer file for '{spec}'")
            try:
                text = files.read_bytes(Path(data_path) / saved, MAX_TOKENIZER_BYTES).decode("utf-8")
            except (OSError, UnicodeDecodeError) as err:
                raise UsageError(f"{Path(data_path) / saved} cannot be read "
                                 f"({getattr(err, 'strerror', None) or type(err).__name__})") from None
            from tokenizers import Tokenizer as RustTokenizer

            try:
                tok: Tokenizer = HFTokenizer(spec, RustTokenizer.from_str(text), int(manifest["eos_id"]))
            except Exception as err:  # the tokenizers library's own parse errors
                why = str(err).splitlines()[0][:120] if str(err) else type(err).__name__
                raise UsageError(f"{Path(data_path) / saved} is not a tokenizer ({why})") from None
        else:
            tok = reload(spec, None, int(manifest["eos_id"]))
    except ValueError as err:
        raise UsageError(f"the tokenizer of {data_path} cannot be rebuilt: {err}") from None
    if tok.vocab_size != manifest["vocab_size"]:
        raise UsageError(f"the tokenizer of {data_path} ({spec}) has {tok.vocab_size} tokens but its manifest "
                         f"records {manifest['vocab_size']}")
    recorded = manifest.get("tokenizer_hash")
    if recorded is not None and tok.vocab_hash() != recorded:
        raise UsageError(f"the tokenizer of {data_path} ({spec}) does not match the vocabulary hash its manifest "
                         "records")
    return tok


def check_vocab(shape: ModelShape, cfg: Config, tok: Tokenizer, data_path: str) -> None:
    """The tokenizer must be the one the model was trained with: the embedding has exactly its vocabulary
    (or, with `model.vocab_size` set, room for it)."""
    v = tok.vocab_size
    fits = shape.vocab_size == v if cfg.model.vocab_size is None else v <= shape.vocab_size
    if not fits:
        raise UsageError(f"the tokenizer of {data_path} ({tok.spec}, {v} tokens) does not match the checkpoint's "
                         f"embedding ({shape.vocab_size} rows)")


def build_empty(spec: ModelSpec) -> Transformer:
    """The model on the CPU in fp32, not initialised from the seed (the weights overwrite every tensor). Torch's
    global RNG, which nn's default initialisers draw from, is left as it was."""
    with torch.random.fork_rng(devices=[]), torch.device("cpu"):
        return Transformer(spec, seed=None)


# -- the artifact ---------------------------------------------------------------------------------


def artifact_steps(run_dir: str | Path) -> list[int]:
    """The steps of the run's published model artifacts (renamed into place: complete when written), ascending.
    Links, and directories without model.json, are not artifacts."""
    root = Path(run_dir) / layout.ARTIFACT
    if root.is_symlink() or not root.is_dir():
        return []
    steps = []
    for p in root.iterdir():
        step = _step_of(p)
        if step is not None and not p.is_symlink() and p.is_dir() and (p / artifact_out.SPEC).is_file():
            steps.append(step)
    return sorted(steps)


def model_steps(run_dir: str | Path) -> list[int]:
    """Every step a model can be loaded at: its artifacts' and its checkpoints'."""
    return sorted(set(artifact_steps(run_dir)) | set(checkpoint_steps(run_dir)))


def read_record(directory: Path) -> dict[str, Any]:
    """An artifact's model.json, read bounded and checked field by field (a bad one: UsageError naming it)."""
    path = directory / artifact_out.SPEC
    try:
        record = json.loads(files.read_bytes(path, "json").decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise UsageError(f"{path} cannot be read ({getattr(err, 'strerror', None) or type(err).__name__})") from None
    ok = (isinstance(record, dict) and record.get("format") == artifact_out.FORMAT
          and type(record.get("step")) is int and record["step"] >= 0 and isinstance(record.get("model"), dict)
          and isinstance(record.get("tokenizer"), dict) and isinstance(record.get("weights"), dict)
          and isinstance(record["weights"].get("sha256"), str) and type(record["weights"].get("bytes")) is int)
    if not ok:
        raise UsageError(f"{path} is not a model artifact's record (format {artifact_out.FORMAT})")
    return record


def spec_of(record: dict[str, Any], where: Path) -> ModelSpec:
    """The ModelSpec model.json records, its rule found among the registered ones, every field checked as a
    config's would be (the shape's sizes, the rule's knobs typed and checked by the rule, positive numbers)."""
    path = where / artifact_out.SPEC
    model = record["model"]
    name = model.get("variant")
    if not isinstance(name, str) or name not in residuals.names():
        raise UsageError(f"{path}: 'model.variant' names no registered residual rule (got {str(name)[:40]!r})")
    rule = residuals.get(name)
    shape = checked_shape(model.get("shape"), f"{path}: 'model.shape'")
    check_keys(model.get("residual", {}), [rule], key=f"{path}: model.residual")
    knobs = rule_knobs(rule, model.get("residual", {}), key=f"{path}: model.residual")
    bad = [f"'model.{k}' is not a positive number" for k in ("norm_eps", "init_std", "rope_base")
           if not (_number(model.get(k), float) or 0) > 0]
    if not isinstance(model.get("doc_mask", False), bool):
        bad.append("'model.doc_mask' is not true or false")
    if model.get("doc_positions", "restart") not in DOC_POSITIONS:
        bad.append(f"'model.doc_positions' is not one of {', '.join(DOC_POSITIONS)}")
    eod = model.get("eod_id")
    if not (eod is None or (type(eod) is int and 0 <= eod < shape.vocab_size)):
        bad.append("'model.eod_id' is not a token id")
    if bad:
        raise UsageError(f"{path}: {bad[0]}")
    try:
        return ModelSpec.from_dict({**model, "shape": dataclasses.asdict(shape), "residual": knobs.values()}, [rule])
    except (KeyError, TypeError, ValueError) as err:
        raise UsageError(f"{path}: 'model' does not describe a model ({err})"[:300]) from None


def read_weights(path: Path, sha256: Optional[str] = None, limit: int = MAX_WEIGHTS_BYTES) -> tuple[dict, str]:
    """A safetensors file read through the file layer (regular, no link, bounded), checked against `sha256` when
    given, then parsed from the bytes in hand (safetensors holds no code). Returns (tensors, its sha256)."""
    try:
        with files.open_regular(path) as fh:  # regular, never a link; its length bounded before it is read
            size = os.fstat(fh.fileno()).st_size
            if size > limit:
                raise UsageError(f"{path} is {size} bytes, more than the {limit} expected")
            blob = fh.read(size + 1)
    except OSError as err:
        raise UsageError(f"{path} cannot be read ({err.strerror or type(err).__name__})") from None
    if len(blob) != size:
        raise UsageError(f"{path} changed while it was read")
    digest = hashlib.sha256(blob).hexdigest()
    if sha256 is not None and digest != sha256:
        raise UsageError(f"{path} does not match the sha256 its model.json records")
    from safetensors.torch import load

    try:
        return load(blob), digest
    except Exception as err:  # safetensors' own parse errors
        raise UsageError(f"{path} is not a safetensors file ({str(err).splitlines()[0][:120] if str(err) else type(err).__name__})") from None


def load_artifact(directory: Path) -> tuple[Transformer, dict[str, Any], Tokenizer]:
    """An artifact directory's model (fp32, CPU), its record and its tokenizer."""
    record = read_record(directory)
    spec = spec_of(record, directory)
    weights = record["weights"]
    state, _ = read_weights(directory / artifact_out.WEIGHTS, weights["sha256"], weights["bytes"])
    check_fits(spec, {name: tuple(t.shape) for name, t in state.items()}, directory / artifact_out.WEIGHTS)
    model = build_empty(spec)
    model.load_state_dict({k: v.to(torch.float32) for k, v in state.items()}, strict=True)
    try:
        tokenizer = read_tokenizer(str(directory), record["tokenizer"])
    except (KeyError, TypeError, ValueError) as err:
        raise UsageError(f"{directory / artifact_out.SPEC}: 'tokenizer' is not a tokenizer reference ({err})") from None
    return model, record, tokenizer


# -- either -----------------------------------------------------------------------------------------


def load_run(run_dir: str | Path, step: Optional[int] = None, *, dtype: torch.dtype = torch.float32,
             device: str | torch.device = "cpu", data_path: Optional[str] = None) -> LoadedRun:
    """Load a run's model at `step` (None: the newest), with its config and tokenizer: from the artifact of that
    step when there is one, else consolidated from its checkpoint. `data_path` stands in for the recorded
    `data.path` when the dataset has moved (a checkpoint's tokenizer comes from the dataset's manifest; an
    artifact carries its own). Every problem with the input is a one-line UsageError."""
    run_dir = require_run_dir(run_dir)
    cfg = read_run_config(run_dir)
    artifacts, checkpoints = artifact_steps(run_dir), checkpoint_steps(run_dir)
    if step is None and artifacts and (not checkpoints or artifacts[-1] >= checkpoints[-1]):
        step = artifacts[-1]
    if step is not None and step in artifacts:
        directory = run_dir / layout.ARTIFACT / artifact_out.step_name(step)
        model, record, tokenizer = load_artifact(directory)
        if data_path is not None:  # a dataset named as well: its tokenizer must be the artifact's
            named = read_tokenizer(data_path, read_manifest(data_path))
            check_vocab(model.spec.shape, cfg, named, data_path)
            if named.vocab_hash() != tokenizer.vocab_hash():
                raise UsageError(f"the tokenizer of {data_path} ({named.spec}) is not the one the model at step "
                                 f"{step} was trained with ({tokenizer.spec})")
        model.to(device=device, dtype=dtype).eval()
        return LoadedRun(model=model, config=cfg, step=record["step"], tokenizer=tokenizer, checkpoint=directory,
                         shape=model.spec.shape, manifest=record["tokenizer"], record=record,
                         tokens=_number(record.get("tokens"), int), val_loss=_number(record.get("val_loss"), float))
    if step is not None and step not in checkpoints:
        raise UsageError(f"{run_dir} has no model at step {step} (steps: {', '.join(map(str, model_steps(run_dir)))})")
    return load_checkpoint(run_dir, cfg, step, dtype=dtype, device=device, data_path=data_path)


def load_checkpoint(run_dir: Path, cfg: Config, step: Optional[int], *, dtype: torch.dtype,
                    device: str | torch.device, data_path: Optional[str]) -> LoadedRun:
    """The model of the checkpoint of `step` (None: the newest usable one), through the engines' reader."""
    path = choose_checkpoint(run_dir, cfg, step)
    try:
        state = CheckpointManager.read_train_state(path)
    except (OSError, ValueError) as err:
        raise UsageError(f"checkpoint {path}: {err}") from None
    data = data_path or cfg.data.path
    if data is None:
        raise UsageError(f"{run_dir}: the run records no data.path, so its tokenizer is unknown (pass the dataset)")
    manifest = read_manifest(data)
    tokenizer = read_tokenizer(data, manifest)
    shape = recorded_shape(state) or resolve(cfg, manifest).shape
    check_vocab(shape, cfg, tokenizer, data)
    spec = model_spec(cfg.model, shape=shape)
    check_fits(spec, stored_model_elements(path / "state"), path)
    model = build_empty(spec)
    load_checkpoint_weights(model, path / "state")
    model.to(device=device, dtype=dtype).eval()
    return LoadedRun(model=model, config=cfg, step=int(state["step"]), tokenizer=tokenizer, checkpoint=path,
                     shape=shape, manifest=manifest, tokens=_number(state.get("tokens"), int),
                     val_loss=_number(state.get("last_val_loss"), float))


def _number(value: Any, kind: type) -> Optional[Any]:
    """A recorded count or loss, or None when it is not a finite number (records are untrusted)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = kind(value)
    return value if value == value and abs(value) != float("inf") else None
