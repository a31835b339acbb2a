"""`rrtrain prep ... --executor local|slurm --tasks N`: the tokenizing spread over N array tasks, one dataset out.

The source's documents are split across the tasks:

- a directory (and no `--num-docs`): its files, in the sorted order prep reads them, cut into N contiguous runs
  of about equal bytes; each task reads only its own files;
- anything else (one file, `synthetic:`, `hf:`, or a `--num-docs` limit): the document stream in chunks of
  256 documents, chunk c to task c mod N; each task reads the stream and tokenizes only its own chunks.

Each task writes its documents' token ids, in order, into a private staging directory of its own (made under a
hidden name and renamed into place once complete). The final step, in the `rrtrain prep` process that waited
for the tasks, is one-process prep (`data_prep.prep._prepare`) with the tasks' tokens in place of its own
tokenizing: it reads the documents once more (no tokenizing: the source's fingerprint, and a check that each
task's output is that of these documents, document by document), splits, packs and writes the shards and the
manifest. So the dataset is byte-identical to one-process prep's for any N: same shards, same indexes, same
`fingerprint` and `source_fingerprint`. (Merging the tasks' own MDS indexes, as streaming's `merge_index`
does, cannot give that: a row packs the end of one task's documents with the start of the next one's, the
split's first rows depend on the documents before, and the fingerprint hashes the index, which names every
shard; it would also take the tasks' index files as they are.)

Everything is written inside prep's own staging directory beside OUT (0700, on the file system OUT is on: for
Slurm, one that every node sees), which replaces OUT only when complete, as for one process; the tasks'
outputs are removed before it does. A failed task (a damaged file: one line naming it) fails the prep with
that line, exit 2, and OUT is left as it was.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np

from data_prep import tokenizer as tk
from data_prep.atomic import staged_output
from data_prep.encode import encode_chunks
from data_prep.options import PrepOptions
from data_prep.prep import _build_tokenizer, _chunks, _empty, _prepare, local_inputs, sigterm_as_interrupt
from data_prep.sources import Directory, file_source, open_source, source_compressions
from rrtrain.core import files
from rrtrain.core.child_python import module_argv
from rrtrain.core.errors import UsageError

EXECUTORS = ("local", "slurm")
#: the tasks' directory inside prep's staging directory (removed before the dataset is published)
WORK = ".tasks"
PLAN = "plan.json"
TOKENS, DOCS, DONE = "tokens.bin", "docs.bin", "done.json"
#: a spooled document: (token count, character count) as two little-endian int64
DOC_DTYPE = np.dtype("<i8")


@dataclass
class ClusterOptions:
    """`--executor`, `--tasks` and, for Slurm, what each task asks for (CPU only; `--workers` processes each)."""

    executor: str = "local"
    tasks: int = 1
    partition: Optional[str] = None
    time_min: int = 60
    mem_gb: float = 4.0
    extra: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        if self.executor not in EXECUTORS:
            raise UsageError(f"--executor must be local or slurm, got '{self.executor}'")
        if self.tasks < 1:
            raise UsageError(f"--tasks must be at least 1, got {self.tasks}")
        if self.time_min < 1 or self.mem_gb <= 0:
            raise UsageError("--time-min and --mem-gb must be positive")


# -- the split of the documents --------------------------------------------------------------------------


def split_files(paths: list[str], sizes: list[int], n: int) -> list[list[str]]:
    """`paths` (in order) cut into at most `n` contiguous, non-empty runs of about equal total size."""
    n = max(1, min(n, len(paths)))
    total = sum(sizes) or 1
    groups: list[list[str]] = [[] for _ in range(n)]
    done = 0
    for i, (path, size) in enumerate(zip(paths, sizes)):
        k = min(n - 1, done * n // total)
        k = max(k, n - (len(paths) - i))  # leave no later group empty
        k = min(k, max((j for j, g in enumerate(groups) if g), default=-1) + 1)  # and no gap before this one
        groups[k].append(path)
        done += size
    return [g for g in groups if g]


def make_plan(opts: PrepOptions, cluster: ClusterOptions, source: object) -> dict[str, Any]:
    """How the documents are split: `files` (each task's files) or `stride` (chunk c to task c mod tasks)."""
    if isinstance(source, Directory) and opts.num_docs is None:
        paths = source.files()
        sizes = [os.stat(p).st_size for p in paths]
        groups = split_files(paths, sizes, cluster.tasks)
        return {"mode": "files", "tasks": len(groups), "files": groups}
    return {"mode": "stride", "tasks": cluster.tasks, "files": None}


def _documents(opts: PrepOptions) -> Iterator[str]:
    source = open_source(opts.source, doc_sep=opts.doc_sep, text_field=opts.text_field, num_docs=opts.num_docs,
                         seed=opts.seed)
    it = iter(source)
    return itertools.islice(it, opts.num_docs) if opts.num_docs is not None else it


def owned(opts: PrepOptions, plan: dict[str, Any], chunk: int) -> Iterator[tuple[int, str]]:
    """(task, document) for every document of the source, in prep's order."""
    if plan["mode"] == "files":
        for k, group in enumerate(plan["files"]):
            for path in group:
                for doc in file_source(path, opts.doc_sep, opts.text_field, root=opts.source):
                    yield k, doc
        return
    n = plan["tasks"]
    for i, doc in enumerate(_documents(opts)):
        yield (i // chunk) % n, doc


# -- one task -------------------------------------------------------------------------------------------


def _options(plan: dict[str, Any]) -> PrepOptions:
    return PrepOptions(**plan["options"])


class PrepTask:
    """One array task of a prep (`launchers.executors.base.ArrayTask`): tokenizes its documents into
    WORK/task-I/ (tokens.bin, docs.bin, done.json), made under a hidden name and renamed once complete."""

    def __init__(self, work: str) -> None:
        self.work = str(work)

    def argv(self, python: str, index: int) -> list[str]:
        return module_argv("data_prep.cluster", self.work, str(index), python=python)

    def __call__(self, index: int) -> dict[str, Any]:
        return run_task(self.work, index)


def read_plan(work: str) -> dict[str, Any]:
    files.check_private_path(work, f"prep's task directory '{work}'")
    try:
        plan = json.loads(files.read_beneath(work, PLAN, "json"))
    except (OSError, ValueError) as err:
        raise UsageError(f"{work}/{PLAN}: not a prep plan ({getattr(err, 'strerror', None) or err})") from None
    if not isinstance(plan, dict) or not {"options", "mode", "tasks", "tokenizer", "eos_id", "chunk"} <= set(plan):
        raise UsageError(f"{work}/{PLAN}: not a prep plan")
    return plan


def run_task(work: str, index: int) -> dict[str, Any]:
    """Task `index` of the plan in `work`: its documents' ids, in order, and a summary (done.json)."""
    plan = read_plan(work)
    if not isinstance(index, int) or not 0 <= index < plan["tasks"]:
        raise UsageError(f"prep task {index}: the plan has tasks 0..{plan['tasks'] - 1}")
    opts = _options(plan)
    saved = os.path.join(work, plan["tokenizer_file"]) if plan.get("tokenizer_file") else None
    tok = tk.reload(plan["tokenizer"], saved, plan["eos_id"])
    dtype = np.dtype(plan["dtype"])
    if plan["mode"] == "files":  # only its own files are read
        mine = (doc for path in plan["files"][index]
                for doc in file_source(path, opts.doc_sep, opts.text_field, root=opts.source) if doc.strip())
    else:
        mine = (doc for k, doc in owned(opts, plan, plan["chunk"]) if k == index and doc.strip())
    stage = files.make_temp_dir(f".task-{index}.tmp-", work)
    try:
        dfd = files.open_dir(stage)
        try:
            docs = tokens = 0
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
            with os.fdopen(files.open_beneath(dfd, TOKENS, flags, files.file_mode()), "wb") as tout, \
                    os.fdopen(files.open_beneath(dfd, DOCS, flags, files.file_mode()), "wb") as dout:
                for texts, arrays in encode_chunks(_chunks(mine, opts.chunk_docs), tok, saved, opts.workers):
                    lengths = np.array([[len(a), len(t)] for a, t in zip(arrays, texts)], dtype=DOC_DTYPE)
                    dout.write(lengths.tobytes())
                    if arrays:
                        tout.write(np.concatenate(arrays).astype(dtype, copy=False).tobytes())
                    docs += len(arrays)
                    tokens += int(lengths[:, 0].sum()) if len(lengths) else 0
                for f in (tout, dout):
                    f.flush()
                    os.fsync(f.fileno())
            summary = {"task": index, "documents": docs, "tokens": tokens}
            files.atomic_write_beneath(dfd, DONE, json.dumps(summary).encode())
        finally:
            os.close(dfd)
        os.rename(stage, os.path.join(work, f"task-{index}"))  # complete, or not there at all (never over one)
    except BaseException:
        files.discard_made_dir(stage)
        raise
    return summary


# -- the final step: the tasks' tokens, in the source's order ---------------------------------------------


class Spool:
    """A task's output read back, document by document, each checked against the document the final step reads
    (its length in characters) and the vocabulary: what a task wrote is not taken on trust."""

    def __init__(self, work: str, index: int, dtype: np.dtype, vocab: int) -> None:
        self.where = f"prep task {index}"
        self.index, self.dtype, self.vocab = index, dtype, vocab
        here = os.path.join(work, f"task-{index}")
        try:
            self.summary = json.loads(files.read_beneath(here, DONE, "json"))
            self.tokens = os.fdopen(files.open_beneath(here, TOKENS), "rb")
            self.docs = os.fdopen(files.open_beneath(here, DOCS), "rb")
        except (OSError, ValueError) as err:
            raise UsageError(f"{self.where} left no complete output ({getattr(err, 'strerror', None) or err})") from None
        ndocs = os.fstat(self.docs.fileno()).st_size // (2 * DOC_DTYPE.itemsize)
        ntok = os.fstat(self.tokens.fileno()).st_size // dtype.itemsize
        if not isinstance(self.summary, dict) or self.summary.get("documents") != ndocs or \
                self.summary.get("tokens") != ntok:
            raise UsageError(f"{self.where}: its output does not match its own summary (damaged)")
        self.left, self.tokens_left = ndocs, ntok

    def take(self, text: str) -> np.ndarray:
        raw = self.docs.read(2 * DOC_DTYPE.itemsize)
        if len(raw) < 2 * DOC_DTYPE.itemsize:
            raise UsageError(f"{self.where} holds fewer documents than the source gives it (the source changed "
                             "while prep ran?)")
        ntok, nchars = (int(x) for x in np.frombuffer(raw, DOC_DTYPE))
        if nchars != len(text) or not 0 <= ntok <= self.tokens_left:
            raise UsageError(f"{self.where}: a document does not match the source's (the source changed while "
                             "prep ran?)")
        ids = np.frombuffer(self.tokens.read(ntok * self.dtype.itemsize), self.dtype)
        if len(ids) != ntok or (ntok and int(ids.max()) >= self.vocab):
            raise UsageError(f"{self.where}: its token ids are damaged")
        self.left -= 1
        self.tokens_left -= ntok
        return ids.astype(np.uint32)

    def close(self) -> None:
        self.tokens.close()
        self.docs.close()


#: runs tasks 0..count-1 of a `PrepTask` and waits for them all (`rrtrain.cli.prep.array_runner`: the sweep side's
#: executors, which this layer does not import); raises UsageError for a failed task, KeyboardInterrupt on Ctrl-C
RunArray = Callable[[PrepTask, int, Path, str], object]


def run_prep_tasks(opts: PrepOptions, cluster: ClusterOptions, run_array: RunArray) -> dict[str, Any]:
    """Prepare OUT with the tokenizing spread over `cluster.tasks` array tasks run by `run_array`; returns the
    manifest (the one one-process prep writes)."""
    opts.validate()
    cluster.validate()
    source = open_source(opts.source, doc_sep=opts.doc_sep, text_field=opts.text_field, num_docs=opts.num_docs,
                         seed=opts.seed)
    plan = make_plan(opts, cluster, source)
    with sigterm_as_interrupt(), staged_output(opts.out, opts.overwrite, local_inputs(opts)) as stage:
        work = files.make_dir(os.path.join(stage, WORK))
        try:
            manifest = _run(opts, plan, source, run_array, stage, work)
        except BaseException:
            files.discard_made_dir(work)  # what it cannot remove goes with the staging directory
            raise
        why = files.discard_made_dir(work)
        if why is not None:  # the dataset is never published with the tasks' files inside
            raise UsageError(f"cannot remove the tasks' files: {why}")
        return manifest


def _run(opts: PrepOptions, plan: dict[str, Any], source: object, run_array: RunArray, stage: str,
         work: str) -> dict[str, Any]:
    def documents() -> Iterator[str]:
        return _documents(opts)

    if next((d for d in documents() if d.strip()), None) is None:  # before anything is submitted
        raise _empty(opts)
    tok = _build_tokenizer(opts, documents)  # a BPE is trained once, here, and handed to the tasks
    saved = tok.save(work)
    from data_prep.writer import token_dtype

    dtype = token_dtype(tok.vocab_size)
    options = {k: v for k, v in asdict(opts).items()}
    options.update(progress=False, overwrite=False)
    body = {**plan, "options": options, "tokenizer": tok.spec, "tokenizer_file": saved, "eos_id": tok.eos_id,
            "dtype": dtype.name, "chunk": opts.chunk_docs}
    files.atomic_write_beneath(work, PLAN, json.dumps(body).encode())
    name = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in os.path.basename(os.path.abspath(opts.out)))
    label = f"prep-{name[:64]}"  # the Slurm job's name: nothing of OUT's name that a script could misread
    run_array(PrepTask(work), plan["tasks"], Path(work) / "logs", label)
    spools = [Spool(work, k, dtype, tok.vocab_size) for k in range(plan["tasks"])]
    owners: collections.deque[int] = collections.deque()

    def merged() -> Iterator[str]:
        for k, doc in owned(opts, plan, opts.chunk_docs):
            if doc.strip():
                owners.append(k)
            yield doc

    def encode(chunks: Iterator[list[str]]) -> Iterator[tuple[list[str], list[np.ndarray]]]:
        for texts in chunks:  # `merged` has named the owner of each of these documents, in order
            yield texts, [spools[owners.popleft()].take(t) for t in texts]

    try:
        manifest = _prepare(opts, merged, stage, source_compressions(source), tok=tok, encode=encode)
        extra = [s.index for s in spools if s.left]
        if extra:
            raise UsageError(f"prep task {extra[0]} holds more documents than the source gives it (the source "
                             "changed while prep ran?)")
    finally:
        for s in spools:
            s.close()
    return manifest


def main(argv: list[str]) -> int:
    """`python -m data_prep.cluster WORK INDEX`: one task (what the local executor runs); exit 2 with one line for
    bad input."""
    from rrtrain.core.errors import fail

    try:
        if len(argv) != 2 or not argv[1].isdigit():
            raise UsageError("usage: python -m data_prep.cluster WORK_DIR TASK_INDEX")
        run_task(argv[0], int(argv[1]))
    except UsageError as err:
        return fail("rrtrain prep", str(err))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
