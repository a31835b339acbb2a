"""TensorBoard event files, written by rrtrain: the trainer's `tb/` and the dashboard's derived runs.

An event file is a sequence of records, each a serialized `Event` framed by TensorBoard's own `RecordWriter`
(the length, its masked CRC-32C, the payload, its masked CRC-32C). The events are TensorBoard's protocol
buffers, built as its writers build them (same tags, same plugin data), so files written before and after
this module read alike; nothing here imports torch.

rrtrain opens the file itself rather than using `EventFileWriter`. That writer names and creates its own
file through TensorBoard's gfile (which follows links and truncates, so it could not append to the
dashboard's existing derived file), and it hands records to a background thread that writes them when its
queue fills or its 120 s timer fires. What a reader sees, and what reaches the disk before the process
exits or dies, would then depend on that thread's timing, not on the run. Here each `EventFile.append`
frames its records with `RecordWriter` into memory (given a file, it writes each record in a write of its own) and
writes them all to the file in one `os.write`, at once, so nothing is pending at exit. A reader following
the file as it grows (TensorBoard, the live dashboard) never meets half an event that a later write
completes differently.

Cost: TensorBoard's writer package is imported when the first file is written, not when this module is
imported. After `import torch` it costs ~0.15 s of CPU and ~25 MB of RSS (about 410 modules). About 0.10 s
of that is boto3, which TensorBoard's stub file system imports whenever it is installed, and
mosaicml-streaming requires it; without boto3 the writer costs ~0.05 s and ~7 MB. The hand-written framing
this replaced needed only the protocol buffers (~0.015 s for the import and the first write).
"""

from __future__ import annotations

import errno
import io
import itertools
import os
import socket
import stat
import time
from pathlib import Path
from typing import Any, Iterable, Optional

from rrtrain.core import files

FILE_VERSION = "brain.Event:2"
_names = itertools.count()  # tells apart two files opened by one process within one second


def frame(payloads: Iterable[bytes]) -> bytes:
    """`payloads` as consecutive records, framed by TensorBoard's `RecordWriter` into memory (so the caller
    can write them in one go)."""
    from tensorboard.summary.writer.record_writer import RecordWriter

    buffer = io.BytesIO()
    writer = RecordWriter(buffer)
    for payload in payloads:
        writer.write(payload)
    return buffer.getvalue()


def event(summary: Any, step: int, wall_time: Optional[float] = None) -> Any:
    """An `Event` holding `summary` at `step`."""
    from tensorboard.compat.proto.event_pb2 import Event

    return Event(wall_time=time.time() if wall_time is None else wall_time, step=int(step), summary=summary)


def restart(step: int) -> Any:
    """A restart marker: TensorBoard drops what earlier files said at `step` and after (a resume's purge)."""
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog

    return Event(wall_time=time.time(), step=int(step), session_log=SessionLog(status=SessionLog.START))


def scalars(values: dict[str, float]) -> Any:
    """One summary of several scalars (`simple_value`, as TensorBoard's scalar charts read them)."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    return Summary(value=[Summary.Value(tag=tag, simple_value=float(v)) for tag, v in values.items()])


def text(tag: str, body: str) -> Any:
    """A text entry, shown by TensorBoard's Text tab (markdown); the tag gets `/text_summary`, as TensorBoard's
    writers name it."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.compat.proto.tensor_pb2 import TensorProto
    from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
    tensor = TensorProto(dtype="DT_STRING", string_val=[body.encode("utf-8")],
                         tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
    return Summary(value=[Summary.Value(tag=f"{tag}/text_summary", metadata=meta, tensor=tensor)])


def new_name(suffix: str = "") -> str:
    """A fresh event file name: TensorBoard reads a directory's files in name order, the oldest first."""
    return f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_names)}{suffix}"


class EventFile:
    """One event file, only ever appended to. A new file starts with the file-version event; `append` writes
    whole records in one write. The file is opened for each write, never through a symbolic link, and only when
    it is a regular file (OSError otherwise)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.events = 0  # appended over this object's life (a test counts them)
        if not self.path.exists():
            from tensorboard.compat.proto.event_pb2 import Event

            self._write([Event(wall_time=time.time(), file_version=FILE_VERSION)])

    def append(self, events: list[Any]) -> None:
        if events:
            self._write(events)
            self.events += len(events)

    def _write(self, events: list[Any]) -> None:
        data = frame(e.SerializeToString() for e in events)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(self.path, flags, files.file_mode())
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO put at the name would block every write
                raise OSError(errno.EINVAL, "not a regular file", str(self.path))
            os.set_blocking(fd, True)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
