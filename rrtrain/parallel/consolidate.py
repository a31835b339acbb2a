"""One process's reader of a checkpoint the engines wrote: the model's weights consolidated from its shards,
for a run that ended before it wrote a model artifact (rrtrain/training/artifact.py). It is the engines' own
knowledge of their layouts, kept beside them: DCP's `model.` prefix (rrtrain/parallel/native.py, the `none` and
`fsdp` backends, any number of shards) read through rrtrain's restricted readers (rrtrain/parallel/safe_load.py),
and DeepSpeed's tag (rrtrain/parallel/deepspeed.py, ZeRO stages 1-3, any world size) read by DeepSpeed's own
`zero_to_fp32` with every file it reads made weights-only. No process group is needed.

Its caller has checked the checkpoint's files against their manifest first (rrtrain/training/checkpoint.py).
Bad input is one UsageError line.
"""

from __future__ import annotations

import contextlib
import io
import math
import types
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rrtrain.core import files
from rrtrain.core.errors import RunError, UsageError
from rrtrain.parallel.deepspeed import TAG as DEEPSPEED_TAG


def load_checkpoint_weights(model: nn.Module, state_dir: Path) -> None:
    """The weights of the engine checkpoint under `state_dir` (a checkpoint's `state/`) into `model`, whichever
    backend wrote it."""
    if (state_dir / DEEPSPEED_TAG).is_dir():
        load_deepspeed(model, state_dir)
    else:
        load_dcp(model, state_dir)


def stored_model_elements(state_dir: Path) -> int:
    """How many of the model's numbers the engine checkpoint under `state_dir` holds, read before a model is built
    for it: the sizes DCP's metadata lists for the model's tensors; for a DeepSpeed checkpoint, whose files only
    DeepSpeed reads, at most its files' bytes over two (no weight is stored in fewer than 16 bits)."""
    from rrtrain.parallel.safe_load import read_metadata

    if (state_dir / DEEPSPEED_TAG).is_dir():
        try:
            return sum(files.regular_tree(state_dir).values()) // 2
        except OSError as err:
            raise UsageError(f"checkpoint {state_dir.parent} cannot be read ({files.said(err)})") from None
    sizes = [getattr(v, "size", None) for k, v in read_metadata(state_dir).state_dict_metadata.items()
             if k.startswith("model.")]
    # metadata is untrusted: a size that is not a sequence of counts is left for load_dcp's shape check to name
    return sum(math.prod(size) for size in sizes
               if isinstance(size, (tuple, list)) and all(type(d) is int and d >= 0 for d in size))


def load_dcp(model: nn.Module, state_dir: Path) -> None:
    """The model's part of a DCP checkpoint (any number of shards) into `model`, on this one process."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

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


def load_deepspeed(model: nn.Module, state_dir: Path) -> None:
    """The fp32 weights of a DeepSpeed ZeRO checkpoint (stages 1-3, any world size), gathered from its shards by
    DeepSpeed's own `zero_to_fp32`, into `model`. (A live engine consolidates in memory instead:
    `DeepSpeedEngine.full_model_state`.)"""
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
    zero_to_fp32.torch = _WeightsOnlyTorch()  # offline reader only: zero_to_fp32 has no weights-only switch
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
