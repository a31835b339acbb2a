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

Every checkpoint file is opened by rrtrain's file layer, never by the library from a path: DCP's reader opens
each file its metadata names beneath the checkpoint directory (`BeneathFileSystem`: no '..', no absolute name,
no link, only a regular file, so a FIFO is one line rather than a hang), and `torch.load` is handed the open
file. A file that is there but damaged (truncated, overwritten) is one line too (`damaged`), exit 2.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import pickle
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from rrtrain.core import files
from rrtrain.core.errors import RunError, UsageError

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


#: what torch raises reading a checkpoint file that is there but damaged (a truncated zip, a slice past its end,
#: a tensor of another size than the metadata says): the file's fault, said in one line
DAMAGE = (RuntimeError, ValueError, EOFError, AssertionError, KeyError, IndexError, pickle.UnpicklingError)


#: errnos of a file that is the input's fault (missing, a link, not a regular file, not readable, too large);
#: any other (EIO, ENOMEM, ESTALE...) is the machine's, a run failure
INPUT_ERRNOS = frozenset({0, errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.ELOOP, errno.EACCES, errno.EPERM,
                          errno.EFBIG, errno.EINVAL, errno.ENXIO, errno.E2BIG, errno.ENAMETOOLONG})


def damaged(path: Path | str, err: BaseException) -> Exception:
    """The one-line error for a checkpoint file that cannot be read: UsageError (exit 2) when the file is at
    fault (not a regular file, a link, damaged), RunError (exit 1, the run `failed`) when the machine is (an
    I/O error)."""
    if isinstance(err, OSError) and err.strerror:
        why = err.strerror  # the layer's refusal ("not a regular file", ...): the path is named already
    else:
        why = (str(err).strip().splitlines() or [type(err).__name__])[0]
    message = f"checkpoint file {path} cannot be read ({why[:200]}); nothing was loaded from it"
    if isinstance(err, OSError) and (err.errno or 0) not in INPUT_ERRNOS:
        return RunError(message)
    return UsageError(message)


def check_tree(path: Path | str) -> None:
    """For a library that opens a checkpoint's files by path itself (DeepSpeed): every file below `path` a
    regular file and no link anywhere (`files.regular_tree`); UsageError, one line, naming the first that is not."""
    try:
        files.regular_tree(path)
    except OSError as err:
        raise damaged(err.filename or path, err) from None


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


class BeneathFileSystem(FileSystem):
    """DCP's file access for reading, every file opened by the file layer beneath the checkpoint directory: a
    name the (untrusted) metadata gives that leads out of it, or is a link, a FIFO or a device, is refused."""

    def __init__(self, root: Path | str) -> None:
        super().__init__()
        self.root = Path(root)

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[io.IOBase]:
        if mode != "rb":
            raise ValueError(f"the checkpoint reader opens files for reading only, not {mode!r}")
        try:
            rel = Path(path).relative_to(self.root)
            fd = files.open_beneath(self.root, rel)
        except ValueError:
            raise damaged(path, files.BadPath(0, "not inside the checkpoint directory")) from None
        except OSError as err:
            raise damaged(path, err) from None
        with os.fdopen(fd, "rb") as stream:
            try:
                yield stream  # DCP reads its items from it (torch.load of each slice) inside this block
            except (OSError, *DAMAGE) as err:
                raise damaged(path, err) from None


class RestrictedFileSystemReader(FileSystemReader):
    """torch's FileSystemReader with its metadata read by `read_metadata` instead of `pickle.load` and every
    data file opened by the file layer (`BeneathFileSystem`); a damaged file is one line (`damaged`)."""

    def __init__(self, path: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        super().__init__(path, *args, **kwargs)
        self.fs = BeneathFileSystem(self.path)

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        super().reset(checkpoint_id)
        self.fs = BeneathFileSystem(self.path)

    def read_data(self, plan: Any, planner: Any) -> Any:
        try:
            return super().read_data(plan, planner)
        except (UsageError, RunError):
            raise
        except DAMAGE as err:
            raise damaged(self.path, err) from None

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
    except OSError as err:
        raise damaged(file, err) from None
    except Exception as err:
        raise refused(file, err) from None


def weights_only(value: io.BytesIO | str | Path, what: str, safe_globals: list[Any] | tuple = (),
                 map_location: Any = "cpu") -> Any:
    """`torch.load(weights_only=True)` (with `safe_globals` admitted) of bytes in hand or of a file the layer
    opens (`files.open_regular`: a regular file, never a link, so torch never opens a FIFO); UsageError naming
    `what` when refused, unreadable or damaged."""
    try:
        with contextlib.ExitStack() as stack:
            source = value if isinstance(value, io.BytesIO) else stack.enter_context(files.open_regular(value))
            with torch.serialization.safe_globals(list(safe_globals)):
                return torch.load(source, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        raise refused(what, err) from None
    except OSError as err:
        raise damaged(what, err) from None
    except DAMAGE as err:
        raise damaged(what, err) from None


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
            return weights_only(path, path, allowed, map_location)  # opened by the layer, weights only

    engine = WeightsOnlyCheckpointEngine.__new__(WeightsOnlyCheckpointEngine)
    engine.__dict__.update(base.__dict__)
    return engine
