"""Compressed corpus files (.gz, .zst, .bz2, .xz), decompressed as they are read, never held whole.

Each decompressor reads a file the layer already opened (`files.open_named`), never the path, and hands out
bounded pieces: gzip, bzip2 and xz through the standard library's readers (which decompress only as much as is
asked for), zstd through `ZstdFrames` below. The line bound of `sources` then applies to the decompressed text,
so a decompression bomb costs at most one bounded line, not the memory of its whole output.
"""

from __future__ import annotations

import io
import os
from typing import BinaryIO

#: a file name's last suffix -> the compression it names
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".bz2": "bzip2", ".xz": "xz"}

#: compressed input handed to zstd at a time: a zstd block of at most 128 KiB can be coded in 4 bytes (an RLE
#: block), so one piece decompresses to at most (1024 / 4 + 1) x 128 KiB, about 32 MiB, whatever the file says;
#: at 1 KiB the per-call cost is still far below tokenizing's
ZSTD_PIECE = 1024


def compression_of(path: str) -> str | None:
    """The compression a source file's name says (`fw.jsonl.zst` -> zstd), or None for a plain file."""
    return COMPRESSIONS.get(os.path.splitext(path)[1])


def without_compression(path: str) -> str:
    """The name of the file inside (`fw.jsonl.zst` -> `fw.jsonl`), which says its format."""
    return os.path.splitext(path)[0] if compression_of(path) else path


def read_errors() -> tuple[type[BaseException], ...]:
    """What a decompressor (or the disk below it) raises for a damaged, truncated or unreadable file."""
    import lzma
    import zlib

    import zstandard

    return (OSError, EOFError, zlib.error, lzma.LZMAError, zstandard.ZstdError)


def open_decompressed(fh: BinaryIO, compression: str) -> BinaryIO:
    """`fh`'s decompressed bytes as a readable binary stream; closing it leaves `fh` open (its opener closes it)."""
    if compression == "gzip":
        import gzip

        return gzip.GzipFile(fileobj=fh, mode="rb")  # members one after another, as gzip concatenates them
    if compression == "bzip2":
        import bz2

        return bz2.BZ2File(fh, "rb")  # multi-stream files too (pbzip2)
    if compression == "xz":
        import lzma

        return lzma.LZMAFile(fh, "rb")  # concatenated streams too
    if compression == "zstd":
        return io.BufferedReader(ZstdFrames(fh))
    raise ValueError(f"unknown compression {compression!r}")


class ZstdFrames(io.RawIOBase):
    """The frames of a zstd file, one after another (shards are often concatenated frames; each frame with or
    without its content size), decompressed `ZSTD_PIECE` bytes of input at a time.

    zstandard's own `stream_reader` ends silently where a truncated file ends; here a file that ends inside a
    frame raises EOFError, as gzip, bz2 and lzma do. The decompressor's window is zstandard's default limit
    (128 MiB): a frame that asks for more is its one-line error, not an allocation."""

    def __init__(self, fh: BinaryIO) -> None:
        import zstandard

        super().__init__()
        self._fh = fh
        self._dctx = zstandard.ZstdDecompressor()
        self._frame = self._dctx.decompressobj()
        self._in_frame = False  # input fed to the current frame that has not yet ended it
        self._unused = b""  # input after the end of the last frame: the start of the next one
        self._out = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # noqa: ANN001 - a writable buffer
        while not self._out:
            if not self._decompress_piece():
                return 0
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    def _decompress_piece(self) -> bool:
        """Decompress the next piece of input into `_out`; False at the end of the file after a whole frame."""
        data, self._unused = (self._unused, b"") if self._unused else (self._fh.read(ZSTD_PIECE), b"")
        if not data:
            if self._in_frame:
                raise EOFError("zstd: the file ends inside a frame (truncated)")
            return False
        self._in_frame = True
        self._out = memoryview(self._frame.decompress(data))
        if self._frame.eof:
            self._unused = self._frame.unused_data  # at most one piece: feeding it on stays bounded
            self._frame = self._dctx.decompressobj()
            self._in_frame = False
        return True
