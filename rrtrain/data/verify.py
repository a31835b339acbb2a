"""Verification of a prepared dataset: every shard against the hash its index records, every token id
against the manifest's vocabulary, every index against the manifest's fingerprint.

A damaged shard otherwise surfaces as an embedding `IndexError` (a device-side assert on a GPU) or, worse,
as a run that trains on garbage without a word. Checks raise `UsageError` with one line that names the
shard and what is wrong. Import-light (no torch): `rrtrain prep --verify` uses it too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any, BinaryIO, Callable, Iterable, Optional

import numpy as np

from rrtrain.core import files
from rrtrain.core.errors import UsageError
from rrtrain.data.manifest import _short  # a value shown in a message, cut to 40 characters

SPLITS = ("train", "val")
INDEX = "index.json"
#: the hash checked when the index records several: the fastest first
HASH_PREFERENCE = ("xxh64", "xxh3_64", "sha1", "sha256", "md5")
_CHUNK = 8 << 20
#: an index.json of 100,000 shards is about 60 MB; a larger file is not one
MAX_INDEX_BYTES = files.LIMITS["index"]
#: what a shard's file name may be: a plain name in its split directory, never a path, "." or ".."
SHARD_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")
#: the most samples one shard may claim (a count, not a size: 2**40 rows would not fit any disk)
MAX_SHARD_SAMPLES = 2**40


def dataset_fingerprint(out_dir: str, tokenizer_hash: str, seq_len: int, bos_id: Optional[int] = None) -> str:
    """sha256 over each split's index.json bytes, the tokenizer hash and seq_len (the manifest's fingerprint),
    and the beginning-of-document token where `--bos` put one before each document (`bos_id`).

    The indexes carry every shard's hashes, so the fingerprint pins the shards' contents too."""
    h = hashlib.sha256()
    for split in SPLITS:
        data = files.read_bytes(os.path.join(out_dir, split, INDEX), MAX_INDEX_BYTES)
        h.update(f"{split}:{len(data)}:".encode())
        h.update(data)
    h.update(f"tokenizer:{tokenizer_hash}:seq_len:{seq_len}".encode())
    if bos_id is not None:
        h.update(f":bos:{bos_id}".encode())
    return h.hexdigest()


def hasher(algo: str) -> Any:
    """A fresh hash object: xxh64 / xxh3_64 through xxhash, the rest through hashlib."""
    if algo.startswith("xxh"):
        import xxhash

        return getattr(xxhash, algo)()
    return hashlib.new(algo)


def file_digest(path: str, algo: str) -> str:
    """Hex digest of a file, read in chunks."""
    h = hasher(algo)
    with files.open_regular(path) as f:  # a FIFO would block the reader
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _pick_hash(hashes: dict[str, str]) -> tuple[str, str] | None:
    for algo in HASH_PREFERENCE:
        if algo in hashes:
            return algo, hashes[algo]
    return None


def _open_shard(path: str, label: str) -> BinaryIO:
    """One shard file opened by the file layer (a regular file, no link, never blocking on a FIFO): everything
    checked of the shard is read from this one descriptor, so no later open by path can be handed another file."""
    try:
        return files.open_regular(path)
    except FileNotFoundError:
        raise UsageError(f"shard {label} is missing ({path} does not exist)") from None
    except (files.NotRegular, files.LinkRefused):
        raise UsageError(f"shard {label} is not a regular file ({path})") from None
    except OSError as err:  # a loop of links, a component that is a file, no permission
        raise UsageError(f"shard {label} cannot be read ({err.strerror or type(err).__name__})") from None


def _checked_size(f: BinaryIO, label: str, entry: dict[str, Any]) -> int:
    """The open shard file's length, which must be the one its index records."""
    size = os.fstat(f.fileno()).st_size
    if entry.get("bytes") is not None and size != entry["bytes"]:
        kind = "truncated" if size < entry["bytes"] else "longer than recorded"
        raise UsageError(f"shard {label} is {kind}: {size} bytes, its index records {entry['bytes']}")
    return size


def _recorded_hash(entry: dict[str, Any], label: str) -> tuple[str, str]:
    picked = _pick_hash(entry.get("hashes") or {})
    if picked is None:
        raise UsageError(f"shard {label}: its index records no hash to check it against")
    return picked


def _corrupted(label: str, algo: str, got: str, want: str) -> UsageError:
    return UsageError(f"shard {label} is corrupted: {algo} {got} does not match its index ({want})")


def _changed(label: str, got: int, size: int) -> UsageError:
    return UsageError(f"shard {label} changed while it was read (it ended after {got} of its {size} bytes): whoever "
                      "writes the dataset is rewriting it; use it once it is complete")


def read_checked(path: str, label: str, entry: dict[str, Any]) -> bytes:
    """A whole shard file (a compressed one: it is decompressed in memory) read from one descriptor: its length
    and recorded hash checked on the bytes in hand."""
    with _open_shard(path, label) as f:
        size = _checked_size(f, label, entry)
        algo, want = _recorded_hash(entry, label)
        data = f.read(size)
    if len(data) != size:
        raise _changed(label, len(data), size)
    got = _digest_bytes(data, algo)
    if got != want:
        raise _corrupted(label, algo, got, want)
    return data


def shard_layout(head: np.ndarray, size: int, label: str, *, samples: int, dtype: np.dtype,
                 row_len: int) -> tuple[int, int]:
    """The byte range [start, end) of the rows of an MDS shard of `size` bytes ([uint32 n][uint32 offsets x
    (n+1)][rows]) from its first bytes `head` (at least 4 * (samples + 2) of them where the file has them),
    checked to be `samples` rows of `row_len` ids of `dtype`."""
    if size < 4 or len(head) < 4:
        raise UsageError(f"shard {label} is too short to be an MDS shard ({size} bytes)")
    n = int(head[:4].view(np.uint32)[0])
    if n != samples or len(head) < 4 * (n + 2):
        raise UsageError(f"shard {label} holds {n} samples but its index records {samples}")
    offsets = head[4 : 4 * (n + 2)].view(np.uint32).astype(np.int64)
    row_bytes = row_len * dtype.itemsize
    if not np.all(np.diff(offsets) == row_bytes) or offsets[-1] > size:
        raise UsageError(f"shard {label} is not laid out as rows of {row_len} {dtype.name} ids")
    return int(offsets[0]), int(offsets[-1])


class _TokenScan:
    """The largest token id of a shard's rows, fed in pieces of any length (a chunk of the file at a time), and
    where the first id outside the vocabulary is."""

    def __init__(self, dtype: np.dtype, row_len: int, vocab: int) -> None:
        self.dtype, self.row_len, self.vocab = dtype, row_len, vocab
        self.top, self.seen, self.first_bad = -1, 0, -1
        self.pending = b""

    def feed(self, piece: bytes | memoryview) -> None:
        data = self.pending + bytes(piece) if self.pending else piece
        usable = len(data) - len(data) % self.dtype.itemsize
        ids = np.frombuffer(data, self.dtype, count=usable // self.dtype.itemsize)
        if ids.size:
            top = int(ids.max())
            if top >= self.vocab and self.first_bad < 0:
                self.first_bad = self.seen + int(np.argmax(ids >= self.vocab))
            self.top = max(self.top, top)
        self.seen += ids.size
        self.pending = bytes(data[usable:])

    def result(self, label: str) -> int:
        if self.first_bad >= 0:
            raise UsageError(f"shard {label} holds token id {self.top} (first at sample "
                             f"{self.first_bad // self.row_len}) outside the manifest's vocabulary of {self.vocab}")
        return self.top


def check_tokens(raw: np.ndarray, label: str, *, samples: int, dtype: np.dtype, row_len: int, vocab: int) -> int:
    """Check an MDS shard's bytes ([uint32 n][uint32 offsets x (n+1)][rows]) hold `samples` rows of
    `row_len` ids below `vocab`; returns the largest id."""
    start, end = shard_layout(raw, len(raw), label, samples=samples, dtype=dtype, row_len=row_len)
    scan = _TokenScan(dtype, row_len, vocab)
    scan.feed(memoryview(np.ascontiguousarray(raw[start:end])))
    return scan.result(label)


def _scan_raw(f: BinaryIO, label: str, entry: dict[str, Any], *, samples: int, dtype: np.dtype, row_len: int,
              vocab: int) -> int:
    """An open raw shard checked in one pass over its bytes, read from its descriptor (never memory-mapped: a
    shard its owner truncates meanwhile is then a short read, said in one line, not SIGBUS): length, recorded
    hash, then layout and token ids (said after the hash, which names a damaged file best)."""
    size = _checked_size(f, label, entry)
    algo, want = _recorded_hash(entry, label)
    head = np.frombuffer(os.pread(f.fileno(), min(4 * (samples + 2), size), 0), np.uint8)
    try:
        rows: tuple[int, int] | UsageError = shard_layout(head, size, label, samples=samples, dtype=dtype,
                                                          row_len=row_len)
    except UsageError as err:
        rows = err
    h, scan, pos = hasher(algo), _TokenScan(dtype, row_len, vocab), 0
    while pos < size and (chunk := f.read(min(_CHUNK, size - pos))):  # a file grown since is read no further
        h.update(chunk)
        if isinstance(rows, tuple):
            a, b = min(max(rows[0] - pos, 0), len(chunk)), min(max(rows[1] - pos, 0), len(chunk))
            if b > a:
                scan.feed(memoryview(chunk)[a:b])
        pos += len(chunk)
    if pos != size:
        raise _changed(label, pos, size)
    got = h.hexdigest()
    if got != want:
        raise _corrupted(label, algo, got, want)
    if isinstance(rows, UsageError):
        raise rows
    return scan.result(label)


def read_index(split_dir: str, split: str) -> list[dict[str, Any]]:
    """The shard entries of a split's index.json, each checked by `shard_problem`; a one-line UsageError for a
    missing, oversized or non-regular file (a FIFO, /dev/zero), one that is not JSON, or an entry that is not
    usable."""
    return read_index_bytes(split_dir, split)[1]


def read_index_bytes(split_dir: str, split: str) -> tuple[bytes, list[dict[str, Any]]]:
    """`read_index`, with the bytes it parsed: what the loader hands streaming (a copy in a private cache), so
    that streaming never opens the dataset's own index.json, which may have changed since."""
    path = os.path.join(split_dir, INDEX)
    try:
        data = files.read_bytes(path, MAX_INDEX_BYTES)
        index = json.loads(data)
    except FileNotFoundError as err:
        raise UsageError(f"split '{split}' has no {INDEX} ({path})") from err
    except OSError as err:
        raise UsageError(f"{split}/{INDEX} cannot be read ({err.strerror or type(err).__name__})") from None
    except (ValueError, RecursionError) as err:  # not UTF-8, not JSON, nested too deeply, a 5,000-digit number
        raise UsageError(f"{split}/{INDEX} is not a valid MDS index ({str(err).splitlines()[0][:120] if str(err) else type(err).__name__})") from None
    shards = index.get("shards") if isinstance(index, dict) else None
    if not isinstance(shards, list):
        raise UsageError(f"{split}/{INDEX} is not a valid MDS index (no list of 'shards')")
    for i, shard in enumerate(shards):
        why = shard_problem(shard)
        if why is not None:
            raise UsageError(f"{split}/{INDEX} is not a valid MDS index (shard {i}: {why})")
    return data, shards


def shard_name_problem(name: Any) -> Optional[str]:
    """Why `name` cannot be a shard's file name (None: a plain file name). A name with a separator or `..` would
    make the verifier read, and the loader decompress a shard to, a path outside the split directory."""
    if isinstance(name, str) and SHARD_NAME.fullmatch(name) and name not in (".", ".."):
        return None
    return f"file name {_short(name)} is not a plain file name"


def _file_entry_problem(entry: Any, key: str) -> Optional[str]:
    if not isinstance(entry, dict):
        return f"'{key}' is not an object"
    why = shard_name_problem(entry.get("basename"))
    if why is not None:
        return f"'{key}': {why}"
    size = entry.get("bytes")
    if size is not None and not (isinstance(size, int) and not isinstance(size, bool) and 0 <= size < 2**63):
        return f"'{key}.bytes' is not a size (got {_short(size)})"
    hashes = entry.get("hashes")
    if hashes is not None and not (isinstance(hashes, dict)
                                   and all(isinstance(k, str) and isinstance(v, str) for k, v in hashes.items())):
        return f"'{key}.hashes' is not a map of hash names to hex digests"
    return None


def shard_problem(shard: Any) -> Optional[str]:
    """What makes one entry of an index.json unusable, naming the field; None when every field the verifier and
    the loader use has its type and range (and its file names are plain names)."""
    if not isinstance(shard, dict):
        return f"not an object (got {_short(shard)})"
    samples = shard.get("samples")
    if not (isinstance(samples, int) and not isinstance(samples, bool) and 0 <= samples <= MAX_SHARD_SAMPLES):
        return f"'samples' is not a count (got {_short(samples)})"
    why = _file_entry_problem(shard.get("raw_data"), "raw_data")
    if why is None and shard.get("zip_data") is not None:
        why = _file_entry_problem(shard["zip_data"], "zip_data")
    compression = shard.get("compression")
    if why is None and (compression is not None or shard.get("zip_data") is not None) and not isinstance(compression, str):
        why = f"'compression' is not text (got {_short(compression)})"
    return why


def unzip_shard(split_dir: str, split: str, shard: dict[str, Any]) -> bytes:
    """A compressed shard's raw bytes: the compressed file read once (length and recorded hash checked),
    decompressed in memory, and the result checked against the raw file's recorded hash where there is one."""
    raw_entry, zip_entry = shard["raw_data"], shard["zip_data"]
    zlabel = f"{split}/{zip_entry['basename']}"
    packed = read_checked(os.path.join(split_dir, zip_entry["basename"]), zlabel, zip_entry)
    from rrtrain.core.lazy_import import streaming_module  # not `import streaming`: that pulls in transformers

    try:
        data = streaming_module("streaming.base.compression").decompress(shard["compression"], packed)
    except Exception as err:  # an unknown algorithm, damaged bytes: the library's own exception types
        raise UsageError(f"shard {zlabel} cannot be decompressed with "
                         f"{_short(shard['compression'])} ({type(err).__name__})") from None
    picked = _pick_hash(raw_entry.get("hashes") or {})
    if picked and _digest_bytes(data, picked[0]) != picked[1]:
        raise UsageError(f"shard {split}/{raw_entry['basename']} is corrupted: decompressed bytes do not match "
                         f"its index's {picked[0]}")
    return data


def verify_shard(split_dir: str, split: str, shard: dict[str, Any], manifest: dict[str, Any]) -> int:
    """One shard: its files' lengths and hashes, then its rows and token ids (decompressing if zipped);
    returns the largest token id. Each file is opened once and read from that descriptor."""
    raw_entry = shard["raw_data"]  # typed by read_index: plain file names, a count of samples
    name = raw_entry["basename"]
    label = f"{split}/{name}"
    raw_path = os.path.join(split_dir, name)
    kw = dict(samples=shard["samples"], dtype=np.dtype(manifest["dtype"]), row_len=int(manifest["seq_len"]) + 1,
              vocab=int(manifest["vocab_size"]))
    if shard.get("zip_data") and not os.path.lexists(raw_path):
        return check_tokens(np.frombuffer(unzip_shard(split_dir, split, shard), dtype=np.uint8), label, **kw)
    with _open_shard(raw_path, label) as f:
        return _scan_raw(f, label, raw_entry, **kw)


def _digest_bytes(data: bytes, algo: str) -> str:
    h = hasher(algo)
    h.update(data)
    return h.hexdigest()


def unlisted_shards(split_dir: str, split: str, shards: list[dict[str, Any]]) -> list[str]:
    """Shard files in a split directory that its index does not list."""
    listed = set()
    for shard in shards:
        for key in ("raw_data", "zip_data"):
            if shard.get(key):
                listed.add(shard[key].get("basename"))
    present = (n for n in os.listdir(split_dir) if n.endswith((".mds", ".mds.zstd", ".mds.gz", ".mds.bz2")))
    return sorted(f"{split}/{n}" for n in present if n not in listed)


def split_checks(path: str, split: str, manifest: dict[str, Any]) -> Iterable[Callable[[], Any]]:
    """The checks of one split, in order, as thunks (each raises UsageError naming what is wrong)."""
    split_dir = os.path.join(path, split)
    shards = read_index(split_dir, split)

    def listed() -> None:
        extra = unlisted_shards(split_dir, split, shards)
        if extra:
            raise UsageError(f"shard {extra[0]} is not in {split}/{INDEX}" + (f" (nor {len(extra) - 1} more)" if len(extra) > 1 else ""))

    def counted() -> None:
        want = manifest["splits"].get(split, {}).get("samples")
        got = sum(int(s.get("samples", 0)) for s in shards)
        if want is not None and got != want:
            raise UsageError(f"{split}/{INDEX} lists {got} samples in {len(shards)} shard(s) but the manifest records {want}")

    yield listed
    for shard in shards:
        yield lambda shard=shard: verify_shard(split_dir, split, shard, manifest)
    yield counted


def check_fingerprint(path: str, manifest: dict[str, Any]) -> None:
    """The index files against the manifest's fingerprint (catches any edit of an index after prep)."""
    try:
        fingerprint = dataset_fingerprint(path, manifest.get("tokenizer_hash", ""), int(manifest["seq_len"]),
                                          manifest.get("bos_id"))
    except OSError as err:  # missing, not a regular file, too large: said by the split's own check too
        raise UsageError(f"the shard indexes cannot be read to check the manifest's fingerprint "
                         f"({err.strerror or type(err).__name__}: {err.filename})") from None
    if fingerprint != manifest["fingerprint"]:
        raise UsageError(f"the shard indexes ({', '.join(f'{s}/{INDEX}' for s in SPLITS)}) do not match the "
                         "manifest's fingerprint: an index was changed after prep")


def dataset_problems(path: str, manifest: dict[str, Any]) -> Iterable[str]:
    """Every problem of a local dataset directory, one line each (none: the dataset is intact)."""
    for split in SPLITS:
        try:
            checks = list(split_checks(path, split, manifest))
        except UsageError as err:
            yield str(err)
            continue
        for check in checks:
            try:
                check()
            except UsageError as err:
                yield str(err)
    try:
        check_fingerprint(path, manifest)
    except UsageError as err:
        yield str(err)


def verify_dataset(path: str, manifest: dict[str, Any]) -> None:
    """Every check on a local dataset directory; raises UsageError at the first problem."""
    for problem in dataset_problems(path, manifest):
        raise UsageError(problem)


def verify_run_data(path: str, manifest: dict[str, Any], local_rank: int) -> None:
    """What a run checks before it reads a dataset; collective (every rank calls it, all raise together).

    Local datasets: one process per node (local rank 0) verifies every shard, once per run, before any is
    read. Remote datasets are not read here: streaming checks each shard's xxh64 as it downloads it into
    the run's cache (`validate_hash`); their token ids are not checked (see docs/data.md)."""
    from rrtrain.core import dist
    from rrtrain.data.manifest import is_remote

    problem = None
    if local_rank == 0 and not is_remote(path):
        try:
            verify_dataset(path, manifest)
        except UsageError as err:
            problem = f"dataset '{path}': {err}"
    dist.raise_together(problem)
