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
import stat
from typing import Any, Callable, Iterable, Optional

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


def _check_file(path: str, label: str, entry: dict[str, Any]) -> None:
    """Presence, length and recorded hash of one file of a shard (raw or compressed)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UsageError(f"shard {label} is missing ({path} does not exist)") from None
    except OSError as err:  # a loop of links, a component that is a file
        raise UsageError(f"shard {label} cannot be read ({err.strerror or type(err).__name__})") from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"shard {label} is not a regular file ({path})")
    size = st.st_size
    if entry.get("bytes") is not None and size != entry["bytes"]:
        kind = "truncated" if size < entry["bytes"] else "longer than recorded"
        raise UsageError(f"shard {label} is {kind}: {size} bytes, its index records {entry['bytes']}")
    picked = _pick_hash(entry.get("hashes") or {})
    if picked is None:
        raise UsageError(f"shard {label}: its index records no hash to check it against")
    algo, want = picked
    got = file_digest(path, algo)
    if got != want:
        raise UsageError(f"shard {label} is corrupted: {algo} {got} does not match its index ({want})")


def check_tokens(raw: np.ndarray, label: str, *, samples: int, dtype: np.dtype, row_len: int, vocab: int) -> int:
    """Check an MDS shard's bytes ([uint32 n][uint32 offsets x (n+1)][rows]) hold `samples` rows of
    `row_len` ids below `vocab`; returns the largest id."""
    if len(raw) < 4:
        raise UsageError(f"shard {label} is too short to be an MDS shard ({len(raw)} bytes)")
    n = int(raw[:4].view(np.uint32)[0])
    if n != samples or len(raw) < 4 * (n + 2):
        raise UsageError(f"shard {label} holds {n} samples but its index records {samples}")
    offsets = raw[4 : 4 * (n + 2)].view(np.uint32).astype(np.int64)
    row_bytes = row_len * dtype.itemsize
    if not np.all(np.diff(offsets) == row_bytes) or offsets[-1] > len(raw):
        raise UsageError(f"shard {label} is not laid out as rows of {row_len} {dtype.name} ids")
    if n == 0:
        return -1
    ids = raw[offsets[0] : offsets[-1]].view(dtype)
    top = int(ids.max())
    if top >= vocab:
        bad = int(np.argmax(ids >= vocab))
        raise UsageError(f"shard {label} holds token id {top} (first at sample {bad // row_len}) "
                         f"outside the manifest's vocabulary of {vocab}")
    return top


def read_index(split_dir: str, split: str) -> list[dict[str, Any]]:
    """The shard entries of a split's index.json, each checked by `shard_problem`; a one-line UsageError for a
    missing, oversized or non-regular file (a FIFO, /dev/zero), one that is not JSON, or an entry that is not
    usable."""
    path = os.path.join(split_dir, INDEX)
    try:
        index = json.loads(files.read_bytes(path, MAX_INDEX_BYTES))
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
    return shards


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


def verify_shard(split_dir: str, split: str, shard: dict[str, Any], manifest: dict[str, Any]) -> int:
    """One shard: its files' lengths and hashes, then its rows and token ids (decompressing if zipped);
    returns the largest token id."""
    raw_entry = shard["raw_data"]  # typed by read_index: plain file names, a count of samples
    zip_entry = shard.get("zip_data")
    name = raw_entry["basename"]
    label = f"{split}/{name}"
    raw_path = os.path.join(split_dir, name)
    if zip_entry and not os.path.exists(raw_path):
        zpath = os.path.join(split_dir, zip_entry["basename"])
        _check_file(zpath, f"{split}/{zip_entry['basename']}", zip_entry)
        from rrtrain.core.lazy_import import streaming_module  # not `import streaming`: that pulls in transformers

        with files.open_regular(zpath) as f:
            packed = f.read()
        try:
            data = streaming_module("streaming.base.compression").decompress(shard["compression"], packed)
        except Exception as err:  # an unknown algorithm, damaged bytes: the library's own exception types
            raise UsageError(f"shard {split}/{zip_entry['basename']} cannot be decompressed with "
                             f"{_short(shard['compression'])} ({type(err).__name__})") from None
        picked = _pick_hash(raw_entry.get("hashes") or {})
        if picked and _digest_bytes(data, picked[0]) != picked[1]:
            raise UsageError(f"shard {label} is corrupted: decompressed bytes do not match its index's {picked[0]}")
        raw = np.frombuffer(data, dtype=np.uint8)
    else:
        _check_file(raw_path, label, raw_entry)
        raw = np.memmap(raw_path, dtype=np.uint8, mode="r") if os.path.getsize(raw_path) else np.zeros(0, np.uint8)
    return check_tokens(raw, label, samples=shard["samples"], dtype=np.dtype(manifest["dtype"]),
                        row_len=int(manifest["seq_len"]) + 1, vocab=int(manifest["vocab_size"]))


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
