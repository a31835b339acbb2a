"""The training and evaluation data loader: datasets written by `rrtrain prep`, read through mosaicml-streaming.

Storage and reading are streaming's (`StreamingDataset`: local directories or s3://, gs://, ...
remotes with a per-run local cache, shard hashes, zstd). The *order* is computed here, because
streaming's own partition gives the same samples per optimizer step for different world sizes and
micro-batches only in the middle of an epoch: at the end of an epoch it pads, repeats or drops
samples depending on the number of ranks and on the micro-batch size, and every later step differs
(measured; see docs/data.md). So:

* epoch e is permuted by streaming's own `py1e` shuffle (seeded by the run seed and e, with
  `num_canonical_nodes` pinned), arranged in streaming's canonical-node order;
* the epochs are concatenated into one endless stream, and global sample position p is
  `order[p // N][p % N]` (no sample dropped or padded; a batch may straddle two epochs);
* optimizer step s takes positions [s*G, (s+1)*G); its micro-step a is the chunk of W*m positions
  starting at s*G + a*W*m, of which rank r takes the m starting at offset r*m.

The set of samples of step s therefore depends only on (data, seed, NCN, G), never on the world
size, micro-batch or accumulation, and the loader's whole state is one integer, the global
position, which makes resume exact at any micro-step and any epoch boundary.
"""

from __future__ import annotations

import atexit
import os
import re
import threading
import weakref
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator, Optional

import numpy as np
import torch

from rrtrain.core import files
from rrtrain.core.errors import UsageError
from rrtrain.core.lazy_import import streaming_module
from rrtrain.core.signals import ignore_stop_signals
from rrtrain.data.manifest import is_remote, read_manifest
from rrtrain.data.shm import open_streaming_dataset
from rrtrain.data.sources import Mixture
from rrtrain.data.verify import INDEX, read_index_bytes, shard_layout, shard_name_problem, unzip_shard

STATE_VERSION = 1
COLUMN = "tokens"
SHUFFLE_ALGO = "py1e"
# Compared on resume: a mismatch is always refused (the data or the randomness differ) ...
_NEVER_CHANGE = ("fingerprint", "seed", "shuffle", "split")
# ... or refused unless the caller allows it (the run continues on a different schedule). The world size and
# micro-batch may change freely: a step's samples depend on neither.
_CHANGE_IF_ALLOWED = ("global_batch", "num_canonical_nodes", "shuffle_block_size")

# Live iterators, closed at exit before multiprocessing's own atexit hook runs: that hook terminates
# daemonic DataLoader workers with SIGTERM, which the workers ignore, and would then wait forever.
_LIVE_ITERATORS: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _close_live_iterators() -> None:
    for it in list(_LIVE_ITERATORS):
        it.close()


atexit.register(_close_live_iterators)


def check_vocab(manifest: dict[str, Any], model_vocab: int) -> None:
    """Refuse a dataset whose token ids would index past the model's embedding."""
    if manifest["vocab_size"] > model_vocab:
        raise UsageError(f"dataset vocabulary {manifest['vocab_size']} does not fit the model's vocab_size {model_vocab}")


# One StreamingDataset per (dataset, split, local dir) per process. Streaming's constructor opens every
# shared-memory segment already registered on the machine to look for a free prefix and keeps each one
# open until exit (an atexit hook holds it): constructing datasets repeatedly exhausts file descriptors.
# Random access needs nothing from the constructor's seed or batch size, so loaders share one instance.
_SPLITS: dict[tuple[str | None, str, str, str], "_Split"] = {}
_splits_lock = threading.Lock()


class _Split:
    """A split opened for random access: the StreamingDataset, its shard sizes and the row reader."""

    def __init__(self, ds, dtype: str, row_len: int, vocab: int,  # noqa: ANN001 - a StreamingDataset
                 sources: list[Optional[str]]) -> None:
        self.ds = ds
        self.num_samples = int(ds.num_samples)
        self.samples_per_shard = np.asarray(ds.samples_per_shard, dtype=np.int64)
        self.rows = _Rows(ds, dtype, row_len, vocab, sources)


def private_cache(cache_dir: str) -> str:
    """`cache_dir` as an absolute path, made (the user's alone) and checked to be writable by no one else, on
    its way included: streaming reads the index and shards it finds there as the dataset, so a cache a
    co-tenant can write is training data they choose. One line (UsageError) otherwise."""
    local = os.path.abspath(cache_dir)
    why = files.prepare_private_dir(local)
    if why is not None:
        raise UsageError(f"data cache '{local}' (data.cache_dir): {files.explained(why)}")
    return local


def _copy_index(source: str, split: str, local: str) -> None:
    """The split's index.json of the local dataset `source`, read and checked by rrtrain (bounded, typed, plain
    shard names), written into the private cache `local`, where streaming reads it instead of copying the
    dataset's own by path (a FIFO put there after the check would hang it in open(); `_Rows` reads the shards).
    Written each time: a copy an earlier run left may be of other data."""
    data, _ = read_index_bytes(os.path.join(source, split), split)
    try:
        files.atomic_write_beneath(local, os.path.join(split, INDEX), data)
    except OSError as err:
        raise UsageError(f"data cache '{local}': cannot write {split}/{INDEX} ({files.said(err)})") from None


def _streaming_remote(path: str, manifest: dict[str, Any]) -> Optional[str]:
    """Streaming's `remote` for a dataset: its URL; a local compressed dataset's directory, in name only (streaming
    then refuses a cache another live dataset of it uses, as when it decompressed them; it reads nothing there);
    None for a local uncompressed one (its cache holds nothing but the index's copy)."""
    if is_remote(path):
        return path
    return os.path.abspath(path) if manifest.get("compression") else None


def _open_split(path: str, manifest: dict[str, Any], split: str, cache_dir: str, *, batch_size: int,
                num_canonical_nodes: int, seed: int, local_rank: int = 0) -> _Split:
    """A StreamingDataset used for random access only (its own iteration is never used), opened through
    `open_streaming_dataset` (the machine's lock, stale names cleaned, a prefix registered safely).

    Streaming's local directory is always a private cache under `cache_dir`, unique to the run (streaming
    refuses a cache dir another live dataset of a remote uses) and the same for the ranks of one node. A local
    dataset is read by rrtrain alone: streaming finds the index already in the cache (`_copy_index`) and is never
    asked for a shard (`_Rows` opens each itself). A remote one is downloaded by streaming into the cache (each
    shard's xxh64 checked). All ranks must open splits in the same order (streaming synchronises).
    """
    source = None if is_remote(path) else os.path.abspath(path)
    remote, local = _streaming_remote(path, manifest), private_cache(cache_dir)
    key = (remote, source, local, split, str(manifest["fingerprint"]))
    with _splits_lock:
        if key in _SPLITS:
            return _SPLITS[key]
        if source is not None:
            _copy_index(source, split, local)
        try:
            ds = open_streaming_dataset(
                local_rank, remote=remote, local=local, split=split, shuffle=False, shuffle_seed=seed,
                num_canonical_nodes=num_canonical_nodes, batch_size=batch_size,
                validate_hash="xxh64" if remote is not None else None,
            )
        except ValueError as err:
            raise UsageError(f"cannot open '{path}' split '{split}': {str(err).splitlines()[0]}") from err
        except FileNotFoundError as err:
            raise UsageError(f"'{path}' has no '{split}' split ({err.filename})") from err
        _check_shard_names(ds, path, split)
        opened = _SPLITS[key] = _Split(ds, manifest["dtype"], int(manifest["seq_len"]) + 1,
                                       int(manifest["vocab_size"]), [source])
        return opened


def _open_mixture(mixture: Mixture, split: str, cache_dir: str, *, batch_size: int, num_canonical_nodes: int,
                  seed: int, shuffle: bool, block_size: int, local_rank: int = 0) -> _Split:
    """A mixture's split as one StreamingDataset of one `Stream(proportion=weight)` per source, used for random
    access and for streaming's per-epoch resampling (`resample_streams`, which reads the dataset's seed and
    whether it shuffles). Each source has a private cache of its own and is read as `_open_split` reads one."""
    Stream = streaming_module("streaming.base.stream").Stream
    places = []
    for i, (source, manifest) in enumerate(zip(mixture.sources, mixture.manifests)):
        local_source = None if is_remote(source.path) else os.path.abspath(source.path)
        places.append((_streaming_remote(source.path, manifest), local_source,
                       private_cache(os.path.join(cache_dir, f"{i}-{source.name}"))))
    key = ("mixture", tuple(places), split, mixture.manifest["fingerprint"], seed, shuffle, num_canonical_nodes)
    with _splits_lock:
        if key in _SPLITS:
            return _SPLITS[key]
        streams = []
        for source, (remote, local_source, local) in zip(mixture.sources, places):
            if local_source is not None:
                _copy_index(local_source, split, local)
            streams.append(Stream(remote=remote, local=local, split=split, proportion=source.weight,
                                  validate_hash="xxh64" if remote is not None else None))
        names = ", ".join(s.name for s in mixture.sources)
        try:
            ds = open_streaming_dataset(
                local_rank, streams=streams, shuffle=shuffle, shuffle_seed=seed, shuffle_algo=SHUFFLE_ALGO,
                shuffle_block_size=block_size, num_canonical_nodes=num_canonical_nodes, batch_size=batch_size,
                sampling_method="balanced", sampling_granularity=1,
            )
        except ValueError as err:
            raise UsageError(f"cannot open the mixture ({names}) split '{split}': {str(err).splitlines()[0]}") from err
        except FileNotFoundError as err:
            raise UsageError(f"a source of the mixture ({names}) has no '{split}' split ({err.filename})") from err
        _check_shard_names(ds, f"the mixture ({names})", split)
        for source, manifest, got in zip(mixture.sources, mixture.manifests, ds.samples_per_stream):
            expected = manifest["splits"].get(split, {}).get("samples")
            if expected is not None and expected != int(got):
                raise UsageError(f"'{source.path}' split '{split}' holds {int(got)} samples but its manifest says "
                                 f"{expected}")
            if int(got) < 1:
                raise UsageError(f"'{source.path}' split '{split}' is empty")
        opened = _SPLITS[key] = _Split(ds, mixture.manifest["dtype"], int(mixture.manifest["seq_len"]) + 1,
                                       int(mixture.manifest["vocab_size"]), [p[1] for p in places])
        return opened


def _check_shard_names(ds, path: str, split: str) -> None:  # noqa: ANN001 - a StreamingDataset
    """Refuse a split whose index (as streaming read it, a remote one included) names a shard file that is not a
    plain file name: streaming would download or decompress that shard to the path the name makes."""
    for reader in ds.shards:
        for pair in reader.file_pairs:
            for info in pair:
                why = None if info is None else shard_name_problem(info.basename)
                if why is not None:
                    raise UsageError(f"cannot open '{path}' split '{split}': a shard's {why}")


#: where in a local compressed dataset's cache its shards are decompressed (streaming's own places are its split
#: directories, which it tidies as it likes)
UNZIPPED = "rrtrain-unzipped"
_HEX = re.compile(r"[0-9a-f]{8,128}")


@dataclass(frozen=True)
class _ShardFile:
    """One shard, open for the rest of the run: its rows are read from this descriptor, never by path again."""

    file: BinaryIO
    first: int  # the byte offset of its first row
    where: str  # the file it was opened as, for messages


def _entry(info: Any) -> dict[str, Any]:  # noqa: ANN401 - streaming's FileInfo
    return {"basename": info.basename, "bytes": info.bytes, "hashes": dict(info.hashes or {})}


class _Rows:
    """Random access to rows, read by rrtrain from one descriptor per shard.

    Every shard file is opened once, by the file layer (a regular file, no link, never blocking on a FIFO), and
    its rows are read from that descriptor for the rest of the run with pread: a shard its owner truncates or
    swaps meanwhile is a short read or a file no longer looked at, said in one line naming the shard, where a
    path opened again could be a FIFO (a hang) and a memory map of a truncated file is SIGBUS.

    A local dataset's shards are read where they are (uncompressed: opened when the split is; compressed: read
    once, hash-checked and decompressed into the private cache when first needed); streaming never reads them.
    A remote dataset's shard is made local by streaming (download, decompress, hash check into the private
    cache) and then opened the same way. Every sample is one fixed-size token row ([uint32 n][uint32 offsets x
    (n+1)][rows]), so a micro-batch is a few reads; a remote shard of another layout falls back to streaming's
    per-sample decode (a local one is refused: the verifier refuses it too). Every batch's ids are checked to
    be inside the vocabulary: a shard that changed after the run checked it is one line, not an embedding error.
    """

    def __init__(self, ds, dtype: str, row_len: int, vocab: int,  # noqa: ANN001 - a StreamingDataset
                 sources: list[Optional[str]]) -> None:
        self.ds = ds
        self.dtype = np.dtype(dtype)
        self.row_len = row_len
        self.row_bytes = row_len * self.dtype.itemsize
        self.vocab = vocab
        self.sources = sources  # per stream: the local dataset's directory, None for a remote one
        self.starts = np.asarray(ds.sample_offset_per_shard, dtype=np.int64)
        self._shards: dict[int, Optional[_ShardFile]] = {}
        for shard_id, reader in enumerate(ds.shards):  # before any batch: what the verifier checked, at once
            source = self._source(shard_id)
            if source is not None and reader.zip_data is None:
                self._shards[shard_id] = self._open_file(self._raw_path(source, reader), reader, strict=True)

    def __getstate__(self) -> dict[str, Any]:  # a spawned worker opens the shards again (forked ones inherit them)
        return {**self.__dict__, "_shards": {}}

    def _source(self, shard_id: int) -> Optional[str]:
        return self.sources[int(self.ds.stream_per_shard[shard_id])]

    @staticmethod
    def _raw_path(source: str, reader: Any) -> str:  # noqa: ANN401 - streaming's reader
        return os.path.join(source, reader.split, reader.raw_data.basename)

    def _open_file(self, path: str, reader: Any, strict: bool) -> Optional[_ShardFile]:  # noqa: ANN401
        """`path` opened by the file layer and checked: its recorded length, its layout. None for a layout
        `strict` refuses not (a remote shard that streaming decodes sample by sample)."""
        try:
            f = files.open_regular(path)
        except OSError as err:
            raise UsageError(f"cannot read shard {files.said(err) if err.filename else path} (a shard must be a "
                             "regular file, and stay one while a run reads it)") from None
        try:
            size = os.fstat(f.fileno()).st_size
            want = reader.raw_data.bytes
            if want is not None and size != want:
                raise UsageError(f"shard {path} is {size} bytes, its index records {want}: it changed after the "
                                 "run checked it")
            head = np.frombuffer(self._pread(f, path, min(4 * (reader.samples + 2), size), 0), np.uint8)
            try:
                first, _ = shard_layout(head, size, path, samples=reader.samples, dtype=self.dtype,
                                        row_len=self.row_len)
            except UsageError:
                if strict:
                    raise
                f.close()
                return None
            return _ShardFile(f, first, path)
        except BaseException:
            f.close()
            raise

    def _unzipped(self, shard_id: int, source: str, reader: Any) -> str:  # noqa: ANN401 - streaming's reader
        """A local compressed shard's raw file in the private cache: decompressed from the dataset's file (read
        once by the layer, its hashes checked) unless this cache holds it already under its recorded hash."""
        raw = _entry(reader.raw_data)
        picked = next(((a, h) for a, h in raw["hashes"].items() if _HEX.fullmatch(h)), None)
        local = self.ds.streams[int(self.ds.stream_per_shard[shard_id])].local
        place = os.path.join(local, UNZIPPED, reader.split)
        name = f"{raw['basename']}.{picked[0]}-{picked[1]}" if picked else None
        if name is not None and os.path.lexists(os.path.join(place, name)):
            return os.path.join(place, name)
        shard = {"raw_data": raw, "zip_data": _entry(reader.zip_data), "compression": reader.compression}
        data = unzip_shard(os.path.join(source, reader.split), reader.split, shard)
        name = name or f"{raw['basename']}.{os.getpid()}"
        try:
            files.atomic_write_file(os.path.join(place, name), data)
        except OSError as err:
            raise UsageError(f"data cache '{local}': cannot write a decompressed shard ({files.said(err)})") from None
        return os.path.join(place, name)

    def _open(self, shard_id: int, some_id: int) -> Optional[_ShardFile]:
        if shard_id not in self._shards:
            reader = self.ds.shards[shard_id]
            source = self._source(shard_id)
            if source is None:  # remote: streaming downloads (and decompresses, hash-checks) into the cache
                self.ds[some_id]
                path, strict = os.path.join(reader.dirname, reader.split, reader.raw_data.basename), False
            else:
                path, strict = self._raw_path(source, reader), True
                if not os.path.lexists(path):
                    path = self._unzipped(shard_id, source, reader)
            self._shards[shard_id] = self._open_file(path, reader, strict)
        return self._shards[shard_id]

    @staticmethod
    def _pread(f: BinaryIO, where: str, count: int, offset: int, into: Optional[memoryview] = None) -> bytes:
        """`count` bytes at `offset` of an open shard (into `into` when given); a short read or an I/O error is
        one line naming the shard."""
        buf = into if into is not None else memoryview(bytearray(count))
        done = 0
        while done < count:
            try:
                got = os.preadv(f.fileno(), [buf[done:count]], offset + done)
            except OSError as err:
                raise UsageError(f"shard {where} cannot be read ({err.strerror or type(err).__name__})") from None
            if not got:
                raise UsageError(f"shard {where} ends at byte {offset + done}, before the rows the run reads: it "
                                 "was truncated after the run opened it")
            done += got
        return bytes(buf) if into is None else b""

    def _read(self, shard: _ShardFile, local: np.ndarray) -> np.ndarray:
        """Rows `local` of an open shard: one read per run of consecutive rows."""
        want, back = np.unique(local, return_inverse=True)
        rows = np.empty((len(want), self.row_len), dtype=self.dtype)
        cuts = (np.flatnonzero(np.diff(want) != 1) + 1).tolist()
        for a, b in zip([0, *cuts], [*cuts, len(want)]):
            self._pread(shard.file, shard.where, (b - a) * self.row_bytes, shard.first + int(want[a]) * self.row_bytes,
                        memoryview(rows[a:b]).cast("B"))
        return rows[back]

    def __call__(self, ids: np.ndarray) -> torch.Tensor:
        """Rows for global sample ids, as an int64 [len(ids), seq_len+1] tensor."""
        shards = np.searchsorted(self.starts, ids, side="right") - 1
        out = np.empty((len(ids), self.row_len), dtype=np.int64)
        for shard in np.unique(shards):
            mask = shards == shard
            opened = self._open(int(shard), int(ids[mask][0]))
            if opened is not None:
                rows = self._read(opened, ids[mask] - self.starts[shard])
            else:
                rows = np.stack([self.ds[int(i)][COLUMN] for i in ids[mask]])
            if rows.size and (int(rows.max()) >= self.vocab or int(rows.min()) < 0):
                where = opened.where if opened is not None else self.ds.shards[int(shard)].raw_data.basename
                bad = int(rows.max()) if int(rows.max()) >= self.vocab else int(rows.min())
                raise UsageError(f"shard {where} holds token id {bad}, outside the dataset's vocabulary of "
                                 f"{self.vocab}: it is damaged or changed after the run checked it")
            out[mask] = rows
        return torch.from_numpy(out)


def default_block_size(num_canonical_nodes: int) -> int:
    """streaming's default shuffle block (samples), pinned so the order never depends on its version."""
    return max(4_000_000 // num_canonical_nodes, 1 << 18)


def canonical_interleave(n: int, num_canonical_nodes: int) -> np.ndarray:
    """Positions 0..n-1 in streaming's single-rank reading order: canonical node spans, interleaved.

    Streaming gives canonical node c the span [c*n//NCN, (c+1)*n//NCN) and reads the nodes
    round-robin; where spans differ in length streaming repeats a sample, here the hole is skipped.
    """
    c = num_canonical_nodes
    starts = np.arange(c, dtype=np.int64) * n // c
    stops = np.arange(1, c + 1, dtype=np.int64) * n // c
    width = int((stops - starts).max()) if n else 0
    grid = np.full((width, c), -1, dtype=np.int64)
    for node in range(c):
        grid[: stops[node] - starts[node], node] = np.arange(starts[node], stops[node])
    flat = grid.reshape(-1)
    return flat[flat >= 0]


def epoch_order(samples_per_shard: np.ndarray, *, num_canonical_nodes: int, seed: int, epoch: int,
                block_size: int, shuffle: bool) -> np.ndarray:
    """Sample ids of epoch `epoch`, in reading order: streaming's py1e shuffle, canonical order."""
    n = int(samples_per_shard.sum())
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    get_shuffle = streaming_module("streaming.base.shuffle").get_shuffle

    perm = get_shuffle(SHUFFLE_ALGO, samples_per_shard.astype(np.int64), num_canonical_nodes, seed, epoch, block_size)
    return perm[canonical_interleave(n, num_canonical_nodes)]


class _Positions:
    """Global position -> sample id over the endless concatenation of epoch orders (2 epochs cached)."""

    def __init__(self, samples_per_shard: np.ndarray, *, num_canonical_nodes: int, seed: int, block_size: int,
                 shuffle: bool) -> None:
        self.samples_per_shard = samples_per_shard
        self.n = int(samples_per_shard.sum())
        self.kw = dict(num_canonical_nodes=num_canonical_nodes, seed=seed, block_size=block_size, shuffle=shuffle)
        self._cache: dict[int, np.ndarray] = {}

    def order(self, epoch: int) -> np.ndarray:
        if epoch not in self._cache:
            if len(self._cache) >= 2:
                self._cache.pop(min(self._cache))
            self._cache[epoch] = epoch_order(self.samples_per_shard, epoch=epoch, **self.kw)
        return self._cache[epoch]

    def ids(self, start: int, count: int) -> np.ndarray:
        pos = np.arange(start, start + count, dtype=np.int64)
        epochs, within = pos // self.n, pos % self.n
        out = np.empty(count, dtype=np.int64)
        for e in np.unique(epochs):
            mask = epochs == e
            out[mask] = self.order(int(e))[within[mask]]
        return out


class _MixturePositions(_Positions):
    """`_Positions` over a mixture: epoch e is what streaming draws from the sources for epoch e
    (`resample_streams`: each source's share of the epoch, seeded by the run seed and e), ordered by the same
    py1e shuffle and canonical-node order as one dataset's epoch."""

    def __init__(self, ds, *, num_canonical_nodes: int, seed: int, block_size: int,  # noqa: ANN001
                 shuffle: bool) -> None:
        self.ds = ds
        self.n = int(ds.epoch_size)
        self.kw = dict(num_canonical_nodes=num_canonical_nodes, seed=seed, block_size=block_size, shuffle=shuffle)
        self._cache = {}

    def order(self, epoch: int) -> np.ndarray:
        if epoch not in self._cache:
            if len(self._cache) >= 2:
                self._cache.pop(min(self._cache))
            self._cache[epoch] = mixture_epoch_order(self.ds, epoch=epoch, **self.kw)
        return self._cache[epoch]


def mixture_epoch_order(ds, *, num_canonical_nodes: int, seed: int, epoch: int, block_size: int,  # noqa: ANN001
                        shuffle: bool) -> np.ndarray:
    """Sample ids (over all the mixture's sources) of epoch `epoch`, in reading order: streaming's draw of the
    epoch (`resample_streams`: shuffle units over each source's shards, and the sample behind each drawn one),
    permuted by streaming's py1e shuffle of those units, in canonical-node order, as streaming's random batching
    arranges them."""
    units, small_per_big = ds.resample_streams(epoch)
    if not shuffle:
        return small_per_big.astype(np.int64)
    get_shuffle = streaming_module("streaming.base.shuffle").get_shuffle
    perm = get_shuffle(SHUFFLE_ALGO, units.astype(np.int64), num_canonical_nodes, seed, epoch, block_size)
    return small_per_big[perm[canonical_interleave(len(small_per_big), num_canonical_nodes)]].astype(np.int64)


class _RowsDataset(torch.utils.data.Dataset):
    """Map-style view for DataLoader workers: an index array in, an int64 batch out."""

    def __init__(self, rows: _Rows) -> None:
        self.rows = rows

    def __getitem__(self, indices: np.ndarray) -> torch.Tensor:  # type: ignore[override]
        return self.rows(indices)


def _one_line_errors(batches: Iterator[torch.Tensor]) -> Iterator[torch.Tensor]:
    """`batches`, a UsageError a DataLoader worker raised (re-raised here with the worker's whole traceback in its
    text) made the worker's one line again."""
    try:
        yield from batches
    except UsageError as err:
        lines = str(err).strip().splitlines()
        if len(lines) < 2:
            raise
        last = lines[-1]
        raise UsageError(last.split("UsageError: ", 1)[-1]) from None


def _worker_init(_: int) -> None:
    """DataLoader workers ignore the signals the trainer handles in the main process."""
    ignore_stop_signals()


class TrainLoader:
    """Endless, seeded, resumable micro-batches of [micro_batch, seq_len+1] int64 token ids for one rank.

    Call `next()` accum = global_batch // (micro_batch * world_size) times per optimizer step.
    `state_dict()` is one global position plus what must match on resume.
    """

    def __init__(self, path: str, *, micro_batch: int, global_batch: int, rank: int, world_size: int,
                 local_rank: int, seed: int, num_canonical_nodes: int = 1, num_workers: int = 0,
                 cache_dir: str, split: str = "train", shuffle: bool = True,
                 manifest: Optional[dict[str, Any]] = None, mixture: Optional[Mixture] = None) -> None:
        if micro_batch < 1 or world_size < 1 or global_batch < 1:
            raise UsageError("micro_batch, global_batch and world_size must be positive")
        if not 0 <= rank < world_size:
            raise UsageError(f"rank {rank} is outside world size {world_size}")
        if global_batch % (micro_batch * world_size):
            raise UsageError(f"global_batch {global_batch} is not a multiple of micro_batch {micro_batch} x world size {world_size}")
        if num_canonical_nodes < 1:
            raise UsageError(f"num_canonical_nodes must be positive, got {num_canonical_nodes}")
        if seed < 0:
            raise UsageError(f"the data seed must be non-negative, got {seed}")
        self.path, self.split = path, split
        self.micro_batch, self.global_batch = micro_batch, global_batch
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.seed, self.num_canonical_nodes, self.num_workers = seed, num_canonical_nodes, num_workers
        self.shuffle = shuffle
        self.block_size = default_block_size(num_canonical_nodes)
        if mixture is not None:  # a weighted mixture of sources (`path` only names it)
            self.manifest = mixture.manifest
            opened = _open_mixture(mixture, split, os.path.join(cache_dir, "loader"), batch_size=micro_batch,
                                   num_canonical_nodes=num_canonical_nodes, seed=seed, shuffle=shuffle,
                                   block_size=self.block_size, local_rank=local_rank)
            self._rows = opened.rows
            self._positions = _MixturePositions(opened.ds, num_canonical_nodes=num_canonical_nodes, seed=seed,
                                                block_size=self.block_size, shuffle=shuffle)
            self._position = 0
            self._generation = 0
            return
        self.manifest = manifest if manifest is not None else read_manifest(path)  # the resolved run holds it
        opened = _open_split(path, self.manifest, split, os.path.join(cache_dir, "loader"), batch_size=micro_batch,
                             num_canonical_nodes=num_canonical_nodes, seed=seed, local_rank=local_rank)
        expected = self.manifest["splits"].get(split, {}).get("samples")
        if expected is not None and expected != opened.num_samples:
            raise UsageError(f"'{path}' split '{split}' holds {opened.num_samples} samples but its manifest says {expected}")
        if opened.num_samples < 1:
            raise UsageError(f"'{path}' split '{split}' is empty")
        self._rows = opened.rows
        self._positions = _Positions(opened.samples_per_shard,
                                     num_canonical_nodes=num_canonical_nodes, seed=seed,
                                     block_size=self.block_size, shuffle=shuffle)
        self._position = 0
        self._generation = 0

    @property
    def seq_len(self) -> int:
        return int(self.manifest["seq_len"])

    @property
    def samples_per_epoch(self) -> int:
        return self._positions.n

    @property
    def accum(self) -> int:
        return self.global_batch // (self.micro_batch * self.world_size)

    def _micro_indices(self, start: int) -> Iterator[np.ndarray]:
        """Sample ids of this rank's micro-batches from global position `start` on, forever."""
        chunk, m = self.micro_batch * self.world_size, self.micro_batch
        pos = start
        while True:
            yield self._positions.ids(pos + self.rank * m, m)
            pos += chunk

    def __iter__(self) -> Iterator[torch.Tensor]:
        self.close()
        self._generation += 1
        it = self._iterate(self._generation, self._position)
        _LIVE_ITERATORS.add(it)
        self._live = it
        return it

    def _iterate(self, generation: int, start: int) -> Iterator[torch.Tensor]:
        chunk = self.micro_batch * self.world_size
        if self.num_workers > 0:
            loader = torch.utils.data.DataLoader(
                _RowsDataset(self._rows), sampler=self._micro_indices(start), batch_size=None,
                num_workers=self.num_workers, worker_init_fn=_worker_init, prefetch_factor=4,
            )
            batches: Iterator[torch.Tensor] = iter(loader)
        else:
            batches = (self._rows(ids) for ids in self._micro_indices(start))
        pos = start
        try:
            for batch in _one_line_errors(batches):
                if generation != self._generation:
                    raise RuntimeError("TrainLoader was re-iterated or its state reloaded; this iterator is stale")
                pos += chunk
                self._position = pos
                yield batch
        finally:
            shutdown = getattr(batches, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()  # stop workers politely: they ignore SIGTERM

    def close(self) -> None:
        """Stop the live iterator and its worker processes (also done at interpreter exit)."""
        live = getattr(self, "_live", None)
        if live is not None:
            live.close()
            self._live = None

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable: the global position and everything that must match to continue exactly."""
        n, p = self._positions.n, self._position
        return {
            "version": STATE_VERSION,
            "fingerprint": self.manifest["fingerprint"],
            "split": self.split,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_canonical_nodes": self.num_canonical_nodes,
            "shuffle_block_size": self.block_size,
            "world_size": self.world_size,
            "global_batch": self.global_batch,
            "micro_batch": self.micro_batch,
            "samples_per_epoch": n,
            "samples_consumed": p,
            "epoch": p // n,
            "sample_in_epoch": p % n,
            "step": p // self.global_batch,
        }

    def load_state_dict(self, state: dict[str, Any], allow_change: bool = False) -> None:
        """Continue from `state`; refuses other data or seed, and (unless allowed) a changed schedule."""
        if state.get("version") != STATE_VERSION:
            raise UsageError(f"data loader state has version {state.get('version')}; expected {STATE_VERSION}")
        mine = self.state_dict()
        never = [f"{k} {state.get(k)!r} -> {mine[k]!r}" for k in _NEVER_CHANGE if state.get(k) != mine[k]]
        if never:
            raise UsageError("cannot resume the data loader: " + "; ".join(never) + " (these can never change)")
        changed = [f"{k} {state.get(k)} -> {mine[k]}" for k in _CHANGE_IF_ALLOWED if state.get(k) != mine[k]]
        if changed and not allow_change:
            raise UsageError("cannot resume the data loader: " + "; ".join(changed)
                             + " (allow the change to continue from the same sample position)")
        consumed = int(state["samples_consumed"])
        if consumed < 0:
            raise UsageError(f"data loader state has a negative position {consumed}")
        self.close()
        self._position = consumed
        self._generation += 1


def eval_batches(path: str, *, micro_batch: int, n_batches: int, rank: int, world_size: int,
                 cache_dir: str, manifest: Optional[dict[str, Any]] = None) -> list[torch.Tensor]:
    """A fixed list of validation micro-batches for this rank, the same on every call.

    Eval batch b is val positions [b*E, (b+1)*E) with E = micro_batch * world_size (wrapping
    around a short val split), rank r taking the m starting at r*m: the union over ranks depends
    only on E, so any world size with the same E evaluates exactly the same samples.
    """
    if micro_batch < 1 or n_batches < 0 or world_size < 1 or not 0 <= rank < world_size:
        raise UsageError("eval_batches needs micro_batch >= 1, n_batches >= 0 and 0 <= rank < world_size")
    manifest = manifest if manifest is not None else read_manifest(path)
    opened = _open_split(path, manifest, "val", os.path.join(cache_dir, "eval"), batch_size=micro_batch,
                         num_canonical_nodes=1, seed=0)
    n, e = opened.num_samples, micro_batch * world_size
    return [opened.rows((b * e + rank * micro_batch + np.arange(micro_batch, dtype=np.int64)) % n)
            for b in range(n_batches)]
