"""A finished (or running) run's model, loaded on one process from one of its published checkpoints.

`rrtrain eval` and `rrtrain export` start here: a run directory is turned back into rrtrain's own single-device
`Transformer` (any residual rule), its recorded config, the step and the tokenizer it was trained with. No
process group is needed: DCP checkpoints (the `none` and `fsdp` backends, sharded over any number of ranks) are
read by DCP's single-process loading through rrtrain's restricted readers (rrtrain/parallel/safe_load.py);
DeepSpeed ZeRO checkpoints by DeepSpeed's own `zero_to_fp32` with every file it reads made weights-only.

Everything read is untrusted: the config through the bounded reader, the checkpoint only after its files matched
the manifest in `train_state.json` (the checks resume makes, `CheckpointManager.problem`), the tokenizer file
through the bounded reader. Bad input is one UsageError line and nothing is written.

This module sits above `training/` (it uses the checkpoint manager), although it lives beside the model it
loads: tests/unit/repository/test_import_layers.py gives it a layer of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import types
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from data_prep.tokenizer import HFTokenizer, Tokenizer, reload
from rrtrain import config as config_mod
from rrtrain.config import Config
from rrtrain.core import files
from rrtrain.core.dist import DistInfo
from rrtrain.core.errors import RunError, UsageError
from rrtrain.data.manifest import read_manifest
from rrtrain.sizing import ModelShape
from rrtrain.model.transformer import Transformer
from rrtrain.knobs import drop_other_rules_knobs
from rrtrain.resolve import check_model, model_spec, resolve, rules_in_play, with_knobs
from rrtrain.rundir import layout, readers
from rrtrain.training.checkpoint import CheckpointManager

STEP_DIR = re.compile(r"^step_(\d{1,18})$")
#: a tokenizer.json larger than this is not one a dataset of rrtrain's holds (GPT-2's is 1.4 MB)
MAX_TOKENIZER_BYTES = files.LIMITS["tokenizer"]
#: DeepSpeed's tag under a checkpoint's state/ (rrtrain/parallel/deepspeed.py)
DEEPSPEED_TAG = "zero"


@dataclass
class LoadedRun:
    """What a consumer of a trained model needs: the model (eval mode), how it was configured, and its tokenizer."""

    model: nn.Module  # rrtrain's own single-device Transformer, eval mode
    config: Config  # RUN_DIR/config.yaml, validated
    step: int  # the checkpoint's step
    tokenizer: Tokenizer  # the run's tokenizer (data_prep.tokenizer)
    checkpoint: Path
    shape: Optional[ModelShape] = None  # the model's resolved shape (matched d_ff included)
    manifest: Optional[dict] = None  # the dataset's manifest the tokenizer came from


def checkpoint_steps(run_dir: str | Path) -> list[int]:
    """The steps of the run's published checkpoints (renamed into place: complete when written), ascending.
    Links and files named like a checkpoint are not checkpoints."""
    root = Path(run_dir) / layout.CHECKPOINTS
    if root.is_symlink() or not root.is_dir():
        return []
    steps = []
    for p in root.iterdir():
        step = _step_of(p)
        if step is not None and not p.is_symlink() and p.is_dir():
            steps.append(step)
    return sorted(steps)


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
    newest usable one (newer unusable ones are passed over with a warning, as resume does)."""
    steps = checkpoint_steps(run_dir)
    if not steps:
        raise UsageError(f"{run_dir} has no checkpoint (nothing under {run_dir / layout.CHECKPOINTS})")
    manager = CheckpointManager(run_dir, keep=len(steps), info=DistInfo(0, 1, 0, torch.device("cpu")),
                                allow_unverified=cfg.train.allow_unverified_checkpoint)
    if step is None:
        path = manager.latest()
        assert path is not None  # checkpoints exist: latest() raises when none is usable
        return path
    if step not in steps:
        raise UsageError(f"{run_dir} has no checkpoint at step {step} (checkpoints: {', '.join(map(str, steps))})")
    path = next(p for p in manager.complete() if _step_of(p) == step)
    problem = manager.problem(path)
    if problem is not None:
        raise UsageError(f"checkpoint {path} is unusable: {problem}")
    return path


def recorded_shape(state: dict[str, Any]) -> Optional[ModelShape]:
    """The shape train_state.json recorded (None: an older checkpoint without it); a malformed one is refused."""
    raw = state.get("shape")
    if raw is None:
        return None
    names = {f.name for f in dataclasses.fields(ModelShape)}
    ok = isinstance(raw, dict) and set(raw) == names and raw.get("pos") in ("learned", "rope") and all(
        type(raw[k]) is int and 1 <= raw[k] < 2**31 for k in names - {"pos"})
    if not ok:
        raise UsageError(f"train_state.json: field 'shape' is not a model shape (got {str(raw)[:80]})")
    return ModelShape(**raw)


def read_tokenizer(data_path: str, manifest: dict[str, Any]) -> Tokenizer:
    """The tokenizer a dataset was prepared with, rebuilt from its manifest (a trained or hf one from its saved
    tokenizer.json, read bounded) and checked against the manifest's vocabulary size and hash."""
    spec = manifest.get("tokenizer") or "byte"
    saved = manifest.get("tokenizer_file")
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


def build_empty(shape: ModelShape, cfg: Config) -> Transformer:
    """The run's model on the CPU in fp32, not initialised from the seed (the checkpoint overwrites every
    tensor). Torch's global RNG, which nn's default initialisers draw from, is left as it was."""
    m = cfg.model
    with torch.random.fork_rng(devices=[]), torch.device("cpu"):
        return Transformer(model_spec(m, shape=shape), seed=None)


def load_dcp(model: Transformer, state_dir: Path) -> None:
    """The model's part of a DCP checkpoint (any number of shards) into `model`, on this one process."""
    import torch.distributed.checkpoint as dcp

    from rrtrain.parallel.safe_load import RestrictedFileSystemReader, WeightsOnlyLoadPlanner, read_metadata

    metadata = read_metadata(state_dir)
    own = model.state_dict()
    stored = {k[len("model."):]: v for k, v in metadata.state_dict_metadata.items() if k.startswith("model.")}
    missing = sorted(set(own) - set(stored))
    if missing:
        raise UsageError(f"checkpoint {state_dir.parent} holds no {missing[0]} (not this config's model: "
                         f"{len(missing)} tensors missing)")
    for name, tensor in own.items():
        size = getattr(stored[name], "size", None)
        if size is not None and tuple(size) != tuple(tensor.shape):
            raise UsageError(f"checkpoint {state_dir.parent}: {name} is {tuple(size)}, this config's model has "
                             f"{tuple(tensor.shape)}")
    state = {"model": own}
    from torch.distributed.checkpoint.api import CheckpointException

    with warnings.catch_warnings():  # DCP says it assumes one process: it is one process
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        try:
            dcp.load(state, storage_reader=RestrictedFileSystemReader(state_dir), planner=WeightsOnlyLoadPlanner())
        except CheckpointException as err:  # the reader's one-line refusal, or DCP's own, wrapped by DCP
            raise _checkpoint_failure(err, state_dir) from None
    model.load_state_dict(state["model"], strict=True)


def _checkpoint_failure(err: BaseException, state_dir: Path) -> Exception:
    """What failed inside DCP's CheckpointException on this one process, as one line: the reader's own
    UsageError or RunError (a file refused or damaged; an I/O error), else DCP's first error naming the checkpoint."""
    failures = [f[0] if isinstance(f, tuple) and f else f for f in (getattr(err, "failures", None) or {}).values()]
    refusal = next((f for f in failures if isinstance(f, (UsageError, RunError))), None)
    if refusal is not None:
        return refusal
    first = next((f for f in failures if isinstance(f, BaseException)), err)
    why = (str(first).strip().splitlines() or [type(first).__name__])[0][:200]
    return UsageError(f"checkpoint {state_dir.parent} cannot be loaded ({why})")


class _WeightsOnlyTorch(types.ModuleType):
    """`torch` as DeepSpeed's zero_to_fp32 sees it: the same module, except that `load` is weights-only with
    exactly DeepSpeed's checkpoint classes admitted (rrtrain.parallel.safe_load.deepspeed_globals)."""

    def __init__(self) -> None:
        super().__init__("torch")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def load(f: Any, map_location: Any = None, **kwargs: Any) -> Any:
        from rrtrain.parallel.safe_load import deepspeed_globals, weights_only

        return weights_only(f, str(f), deepspeed_globals())


def load_deepspeed(model: Transformer, state_dir: Path) -> None:
    """The fp32 weights of a DeepSpeed ZeRO checkpoint (stages 1-3, any world size), gathered from its shards by
    DeepSpeed's own `zero_to_fp32`, into `model`."""
    chatter = io.StringIO()  # its accelerator notice, progress lines and bars: not this command's output
    try:
        with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
            from deepspeed.utils import zero_to_fp32
    except ImportError:
        raise UsageError(f"checkpoint {state_dir.parent} was written by DeepSpeed: reading it needs the deepspeed "
                         "package") from None
    from rrtrain.parallel.safe_load import check_tree

    check_tree(state_dir)  # zero_to_fp32 opens its files by path itself: every one regular, no link
    saved = zero_to_fp32.torch
    zero_to_fp32.torch = _WeightsOnlyTorch()
    try:
        with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
            state = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(state_dir), tag=DEEPSPEED_TAG)
    except (OSError, ValueError, KeyError, IndexError, TypeError) as err:  # its own checks of what it read
        why = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise UsageError(f"checkpoint {state_dir.parent} cannot be loaded ({why})") from None
    finally:
        zero_to_fp32.torch = saved
    missing, unexpected = model.load_state_dict(dict(state), strict=False)
    persistent_missing = [k for k in missing if k in model.state_dict()]
    if persistent_missing or unexpected:
        raise UsageError(f"checkpoint {state_dir.parent} does not hold this config's model "
                         f"({(persistent_missing or unexpected)[0]})")


def load_run(run_dir: str | Path, step: Optional[int] = None, *, dtype: torch.dtype = torch.float32,
             device: str | torch.device = "cpu", data_path: Optional[str] = None) -> LoadedRun:
    """Load a run's model from the checkpoint of `step` (None: the newest usable one), with its config and
    tokenizer. `data_path` stands in for the recorded `data.path` when the dataset has moved (its manifest gives
    the tokenizer). Every problem with the input is a one-line UsageError."""
    run_dir = require_run_dir(run_dir)
    cfg = read_run_config(run_dir)
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
    model = build_empty(shape, cfg)
    state_dir = path / "state"
    if (state_dir / DEEPSPEED_TAG).is_dir():
        load_deepspeed(model, state_dir)
    else:
        load_dcp(model, state_dir)
    model.to(device=device, dtype=dtype).eval()
    return LoadedRun(model=model, config=cfg, step=int(state["step"]), tokenizer=tokenizer, checkpoint=path,
                     shape=shape, manifest=manifest)


__all__ = ["LoadedRun", "checkpoint_steps", "load_run", "read_run_config"]
