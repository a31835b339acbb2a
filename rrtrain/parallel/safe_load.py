"""Loading a checkpoint's pickled state without letting the file run code.

A checkpoint is a file anyone with write access to the run directory could have replaced, and unpickling runs
whatever callables a pickle names. Every pickled byte rrtrain reads back goes through one of three doors here:

- DCP's `.metadata` (torch's `FileSystemReader` reads it with `pickle.load`): read by `MetadataUnpickler`,
  whose `find_class` admits only the classes DCP's metadata is made of (`METADATA_CLASSES`, and torch's
  dtypes); anything else is refused before it is constructed.
- DCP's non-tensor items (the optimizer's `param_groups`: torch's `DefaultLoadPlanner.load_bytes` reads them
  with `weights_only=False`): read with `torch.load(weights_only=True)` by `WeightsOnlyLoadPlanner`.
- DeepSpeed's `*_model_states.pt` / `*_optim_states.pt` (its `TorchCheckpointEngine.load` uses
  `weights_only=False`): read with `torch.load(weights_only=True)` and torch's safe-globals allow-list extended
  by exactly the three DeepSpeed classes those files hold (`DEEPSPEED_GLOBALS`).

A refused file ends the run with one line (UsageError) naming the file and the class it asked for.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from rrtrain.core import files
from rrtrain.core.errors import UsageError

METADATA_FILE = ".metadata"

#: (module, name) of every class or function DCP's `.metadata` pickle names (torch 2.x), dtypes aside
METADATA_CLASSES = frozenset({
    *(("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout by its name: torch.strided, ...
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),  # StorageMeta.checkpoint_id
    ("collections", "OrderedDict"),
})


class MetadataUnpickler(pickle.Unpickler):
    """An unpickler for DCP metadata: only `METADATA_CLASSES` and torch dtypes can be named."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in METADATA_CLASSES or (module == "torch" and isinstance(getattr(torch, name, None),
                                                                                    torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")


def refused(path: Path | str, err: BaseException) -> UsageError:
    """The one-line error for a checkpoint file that asked for more than it may."""
    why = str(err).splitlines()[0] if str(err) else type(err).__name__
    return UsageError(f"checkpoint file {path} was refused: {why}; it was not loaded (nothing in it ran)")


def read_metadata(path: Path | str) -> Any:
    """DCP's `.metadata` of a checkpoint directory, unpickled by `MetadataUnpickler`; UsageError when the file
    names anything else or is not DCP metadata."""
    from torch.distributed.checkpoint.metadata import Metadata

    file = Path(path) / METADATA_FILE
    try:
        with files.open_regular(file) as f:  # not a link, not a FIFO
            metadata = MetadataUnpickler(f).load()
    except OSError as err:
        raise UsageError(f"checkpoint file {file} cannot be read ({err.strerror or err})") from None
    except Exception as err:  # UnpicklingError, and whatever a truncated or crafted pickle makes the admitted classes raise
        raise refused(file, err) from None
    if not isinstance(metadata, Metadata):
        raise refused(file, TypeError(f"it holds a {type(metadata).__name__}, not DCP metadata"))
    return metadata


class RestrictedFileSystemReader(FileSystemReader):
    """torch's FileSystemReader with its metadata read by `read_metadata` instead of `pickle.load`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.metadata import StorageMeta

        rank = kwargs.get("rank")
        metadata = read_metadata(self.path) if rank is None else _read_rank_metadata(Path(self._get_metadata_path(rank)))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _read_rank_metadata(file: Path) -> Any:
    try:
        with files.open_regular(file) as f:  # not a link, not a FIFO
            return MetadataUnpickler(f).load()
    except OSError:
        raise
    except Exception as err:
        raise refused(file, err) from None


def weights_only(value: io.BytesIO | str | Path, what: str, safe_globals: list[Any] | tuple = ()) -> Any:
    """`torch.load(weights_only=True)` (with `safe_globals` admitted); UsageError naming `what` when refused."""
    try:
        with torch.serialization.safe_globals(list(safe_globals)):
            return torch.load(value, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise refused(what, err) from None


class WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner with its non-tensor items read by `torch.load(weights_only=True)`."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        fqn = read_item.dest_index.fqn
        loaded = weights_only(value, f"item {fqn}")
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded


def deepspeed_globals() -> list[Any]:
    """The DeepSpeed classes its ZeRO checkpoints hold (stages 1-3, fp32 and bf16), for weights-only loading:
    the fp16 loss scaler, the ZeRO stage enum and a fragment address. Nothing else is admitted."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, ZeroStageEnum, fragment_address]


def weights_only_deepspeed_engine(base: Any) -> Any:
    """An instance of DeepSpeed's checkpoint engine `base`'s class whose `load` is weights-only: every other
    method (saving) is DeepSpeed's own."""
    allowed = deepspeed_globals()

    class WeightsOnlyCheckpointEngine(type(base)):  # type: ignore[misc]
        def load(self, path: str, map_location: Any = None) -> Any:
            try:
                with torch.serialization.safe_globals(allowed):
                    return torch.load(path, map_location=map_location, weights_only=True)
            except pickle.UnpicklingError as err:
                raise refused(path, err) from None

    engine = WeightsOnlyCheckpointEngine.__new__(WeightsOnlyCheckpointEngine)
    engine.__dict__.update(base.__dict__)
    return engine
