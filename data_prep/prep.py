"""The data-prep pipeline: source -> tokenizer -> split by document -> pack -> MDS shards + manifest.

One streaming pass over the corpus (two when a BPE is trained on a sample first); memory is bounded
by the chunk size, the in-flight chunks and the vocabulary-sized token counter, never the corpus.
Everything is written into a staging directory that replaces OUT only when complete.
"""

from __future__ import annotations

import hashlib
import contextlib
import itertools
import os
import signal
import sys
import time
from typing import Any, Callable, Iterator

from data_prep import tokenizer as tk
from data_prep.atomic import staged_output
from data_prep.options import PrepOptions
from data_prep.encode import encode_chunks
from data_prep.manifest import build_manifest, dataset_fingerprint, write_manifest
from data_prep.pack import Packer
from data_prep.sources import open_source, source_compressions
from data_prep.writer import SplitWriter, token_dtype, unigram_entropy
from rrtrain.core.errors import UsageError


def _unit(seed: int, index: int) -> float:
    """A uniform number in [0, 1) fixed by (seed, document index): the split's coin."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


def _chunks(docs: Iterator[str], size: int) -> Iterator[list[str]]:
    while True:
        chunk = list(itertools.islice(docs, size))
        if not chunk:
            return
        yield chunk


class _Progress:
    """Documents/s and tokens/s on stderr (tqdm), throttled; silent when disabled."""

    def __init__(self, enabled: bool, total: int | None) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="doc", desc="prep", file=sys.stderr, mininterval=1.0, dynamic_ncols=True)
        self.tokens = 0
        self.t0 = time.monotonic()

    def update(self, docs: int, tokens: int) -> None:
        self.tokens += tokens
        if self.bar is not None:
            self.bar.update(docs)
            rate = self.tokens / max(time.monotonic() - self.t0, 1e-9)
            self.bar.set_postfix_str(f"{rate:,.0f} tok/s", refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt inside (in the main thread; elsewhere signals are not ours to set), so a
    terminated prep unwinds through its staging clean-up as Ctrl-C does; the old handler is back after."""
    if not _in_main_thread():
        yield
        return
    old_term = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old_term)


def run_prep(opts: PrepOptions) -> dict[str, Any]:
    """Prepare OUT from the source; returns the manifest. Raises UsageError for bad input."""
    opts.validate()
    source = open_source(opts.source, doc_sep=opts.doc_sep, text_field=opts.text_field,
                         num_docs=opts.num_docs, seed=opts.seed)

    def documents() -> Iterator[str]:
        it = iter(source)
        return itertools.islice(it, opts.num_docs) if opts.num_docs is not None else it

    with sigterm_as_interrupt(), staged_output(opts.out, opts.overwrite, local_inputs(opts)) as stage:
        return _prepare(opts, documents, stage, source_compressions(source))


def local_inputs(opts: PrepOptions) -> list[str]:
    """The local paths prep reads: a source file or directory, and an `hf:` source or tokenizer that names one."""
    paths = [] if opts.source.startswith(("synthetic:", "hf:")) else [opts.source]
    if opts.source.startswith("hf:"):
        paths.append(opts.source[3:].partition(":")[0])  # hf:NAME[:SPLIT]
    if opts.tokenizer.startswith("hf:"):
        paths.append(opts.tokenizer[3:])
    return [p for p in paths if p and os.path.exists(p)]


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _build_tokenizer(opts: PrepOptions, documents) -> tk.Tokenizer:  # noqa: ANN001 - a callable
    kind, _ = tk.parse_spec(opts.tokenizer)
    if kind != "bpe":
        return tk.build(opts.tokenizer, eos_token=opts.eos_token, bos=opts.bos)
    sample = [d for d in itertools.islice((d for d in documents() if d.strip()), opts.bpe_sample_docs)]
    if not sample:
        raise _empty(opts)
    return tk.build(opts.tokenizer, eos_token=opts.eos_token, texts=iter(sample), bos=opts.bos)


def _empty(opts: PrepOptions) -> UsageError:
    return UsageError(f"source '{opts.source}' is empty or every document in it is empty")


def _prepare(opts: PrepOptions, documents, stage: str,  # noqa: ANN001 - documents: a callable
             source_compression: list[str], tok: tk.Tokenizer | None = None,
             encode: Callable[[Iterator[list[str]]], Iterator[tuple[list[str], list[Any]]]] | None = None,
             ) -> dict[str, Any]:
    """Write the dataset into `stage`. `tok`: the tokenizer already built (else built here); `encode`: what turns
    chunks of documents into (texts, token arrays) in order (else `encode_chunks` with `--workers`): prep spread
    over array tasks (data_prep.cluster) passes the tasks' tokens, so the packing, split and shards are these."""
    source_hash = hashlib.sha256()
    skipped = 0

    def nonempty() -> Iterator[str]:
        nonlocal skipped
        for doc in documents():
            source_hash.update(len(doc).to_bytes(8, "little"))
            source_hash.update(doc.encode("utf-8", errors="surrogatepass"))
            if doc.strip():
                yield doc
            else:
                skipped += 1

    # Read the first chunk before anything heavy, so an empty or malformed corpus fails fast.
    docs_iter = nonempty()
    first = list(itertools.islice(docs_iter, opts.chunk_docs))
    if not first:
        raise _empty(opts)
    tok = tok if tok is not None else _build_tokenizer(opts, documents)
    bos_id = tk.find_bos(tok, opts.bos_token) if opts.bos else None
    saved = tok.save(stage)
    saved_path = os.path.join(stage, saved) if saved else None
    dtype = token_dtype(tok.vocab_size)
    row_len = opts.seq_len + 1
    writers = {
        split: SplitWriter(os.path.join(stage, split), row_len, dtype, compression=opts.compression,
                           size_limit=opts.shard_size, vocab_size=tok.vocab_size, count_tokens=(split == "train"))
        for split in ("train", "val")
    }
    packers = {split: Packer(row_len, tok.eos_id, dtype, bos_id) for split in writers}
    index = 0
    total = opts.num_docs if opts.source.startswith("synthetic:") or opts.num_docs else None
    progress = _Progress(opts.progress, total)

    try:
        chunks = itertools.chain([first], _chunks(docs_iter, opts.chunk_docs))
        encoded = encode(chunks) if encode is not None else encode_chunks(chunks, tok, saved_path, opts.workers)
        for texts, arrays in encoded:
            ntok = 0
            for ids in arrays:
                val = writers["val"].samples < opts.min_val_samples or _unit(opts.seed, index) < opts.val_fraction
                split = "val" if val else "train"
                rows = packers[split].add(ids)
                if rows is not None:
                    writers[split].write_rows(rows)
                writers[split].documents += 1
                ntok += len(ids) + (1 if bos_id is None else 2)
                index += 1
            progress.update(len(texts), ntok)
    finally:
        progress.close()
        for w in writers.values():
            w.close()
    for split, w in writers.items():
        if w.samples == 0:
            raise UsageError(f"corpus too small: {index} documents give no {split} sample of seq_len+1 = {row_len} tokens")
    if writers["val"].samples < opts.min_val_samples:
        raise UsageError(f"corpus too small: only {writers['val'].samples} validation samples (need --min-val-samples {opts.min_val_samples})")

    splits = {
        split: {"samples": w.samples, "tokens": w.tokens, "documents": w.documents, "dropped_tokens": packers[split].leftover}
        for split, w in writers.items()
    }
    assert writers["train"].counts is not None
    entropy = unigram_entropy(writers["train"].counts)
    fingerprint = dataset_fingerprint(stage, tok.vocab_hash(), opts.seq_len, bos_id)
    manifest = build_manifest(
        source=opts.source, source_fingerprint=source_hash.hexdigest(), tokenizer=tok.spec,
        tokenizer_hash=tok.vocab_hash(), tokenizer_file=saved, vocab_size=tok.vocab_size, eos_id=tok.eos_id,
        seq_len=opts.seq_len, dtype=dtype.name, compression=opts.compression, splits=splits,
        unigram_entropy=round(entropy, 6), seed=opts.seed, val_fraction=opts.val_fraction,
        min_val_samples=opts.min_val_samples, fingerprint=fingerprint, documents_skipped_empty=skipped,
        source_compression=source_compression, bos_id=bos_id,
    )
    write_manifest(stage, manifest)
    return manifest
