"""TensorBoard event files, written by rrtrain itself: the trainer's `tb/` and the dashboard's derived runs.

An event file is a sequence of records (TFRecord framing: the length, its masked CRC-32C, the serialized
`Event`, its masked CRC-32C). `torch.utils.tensorboard` would write the same, but importing it pulls in most
of TensorBoard (~0.2 s of CPU in every trainer's start, after torch); the protocol buffers alone cost ~0.02 s,
and the framing is a few lines. Each `EventFile.append` is one write of whole records, so a reader following
the file as it grows (TensorBoard, the live dashboard) never meets half an event that a later write completes
differently. The summaries are built as TensorBoard's own writers build them (same tags, same plugin data),
so files written before and after this module read alike.
"""

from __future__ import annotations

import errno
import itertools
import os
import socket
import stat
import struct
import time
from pathlib import Path
from typing import Any, Optional

FILE_VERSION = "brain.Event:2"
_names = itertools.count()  # tells apart two files opened by one process within one second


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        crc = n
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # the Castagnoli polynomial, reflected
        table.append(crc)
    return table


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _CRC32C
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """The checksum as TFRecord stores it (rotated and offset, so that a CRC of CRCs stays useful)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(payload: bytes) -> bytes:
    """One TFRecord: the framing around `payload`."""
    header = struct.pack("<Q", len(payload))
    return header + struct.pack("<I", masked_crc32c(header)) + payload + struct.pack("<I", masked_crc32c(payload))


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
        data = b"".join(record(e.SerializeToString()) for e in events)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(self.path, flags, 0o666)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO put at the name would block every write
                raise OSError(errno.EINVAL, "not a regular file", str(self.path))
            os.set_blocking(fd, True)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
