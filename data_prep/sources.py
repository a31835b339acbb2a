"""Corpus readers: each source is a re-iterable stream of document strings, never held whole.

Sources are iterated twice when a BPE tokenizer is trained (a sample pass, then the full pass), so
every reader re-opens its input on each `iter()`. Bad input raises `UsageError` naming the file and,
for jsonl, the line. A .txt or .jsonl may be compressed (`decompress.COMPRESSIONS`); it is decompressed as
it is read, and every line (and .txt document) is bounded by `MAX_LINE_CHARS`, so neither a line that never
ends nor a decompression bomb is ever held whole.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TextIO

from data_prep.decompress import COMPRESSIONS, compression_of, open_decompressed, read_errors, without_compression
from rrtrain.core import files
from rrtrain.core.errors import UsageError

TEXT_SUFFIXES = (".txt", ".jsonl")
#: what a directory source reads: plain files, and text/jsonl under any compression
FILE_SUFFIXES = (*TEXT_SUFFIXES, ".parquet", *(s + c for s in TEXT_SUFFIXES for c in COMPRESSIONS))
#: the longest line of a .txt or .jsonl (after decompression), and the longest .txt document, in characters:
#: longer is not a corpus document (or is a file that is not text) and is refused before it is held whole
MAX_LINE_CHARS = files.MAX_LINE_BYTES


@contextlib.contextmanager
def _open_text(path: str, root: str | None = None) -> Iterator[TextIO]:
    """A source file as text (`_open_binary`: the file the user named, or one found in the directory they named),
    decompressed as it is read when its name says so."""
    with _open_binary(path, root) as fh:
        compression = compression_of(path)
        stream = fh if compression is None else open_decompressed(fh, compression)
        with io.TextIOWrapper(stream, encoding="utf-8", errors="strict", newline="") as text:
            yield text


def _text_lines(path: str, root: str | None = None) -> Iterator[tuple[int, str]]:
    """(line number, line) of a .txt or .jsonl, newline kept; a line over `MAX_LINE_CHARS` is refused once that
    many are read, and a damaged compressed file or a read error is one line naming the file."""
    limit = MAX_LINE_CHARS
    compression = compression_of(path)
    errors = read_errors()
    try:
        with _open_text(path, root) as f:
            lineno = 0
            while line := f.readline(limit + 2):  # room for "\r\n" after a line of exactly `limit`
                lineno += 1
                if len(line) > limit and len(line.rstrip("\r\n")) > limit:
                    raise UsageError(f"{path}:{lineno}: a line longer than {limit:,} characters (not a text corpus?)")
                yield lineno, line
    except UnicodeDecodeError as err:
        raise UsageError(f"'{path}' is not valid UTF-8 (byte {err.start})") from err
    except errors as err:
        if compression is None:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else _first_line(err)
            raise UsageError(f"cannot read '{path}': {reason}") from None
        raise UsageError(f"cannot decompress '{path}' ({compression}): {_first_line(err)}") from None


def _check_readable(path: str) -> None:
    if not os.path.exists(path):
        raise UsageError(f"source '{path}' does not exist")
    if not os.access(path, os.R_OK):
        raise UsageError(f"cannot read '{path}': permission denied")


def _open_binary(path: str, root: str | None = None):  # noqa: ANN202 - a binary file object
    """A source file opened by the layer, only when it is a regular file (a FIFO would hang prep): the file the
    user named with links followed as they chose, or, found in the directory `root` they named, beneath it with
    no link followed (`files.open_beneath`: a link there is refused, whoever planted it and wherever it leads);
    pyarrow or a decompressor then reads this open file, never the path."""
    try:
        if root is not None:
            return os.fdopen(files.open_beneath(root, os.path.relpath(path, root)), "rb")
        return files.open_named(path)
    except files.LinkRefused as err:
        raise UsageError(f"source '{path}': {err.strerror} (a directory source is read only through its own "
                         "regular files; no link in it is followed)") from err
    except FileNotFoundError as err:
        raise UsageError(f"source '{path}' does not exist") from err
    except OSError as err:
        raise UsageError(f"cannot read '{path}': {err.strerror or err}") from err


def _first_line(err: BaseException) -> str:
    """A library's error in one line: the first line of its message, or its type when it has none."""
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__


@dataclass(frozen=True)
class TextFile:
    """Plain text: documents separated by blank lines, or one document per line (`--doc-sep line`)."""

    path: str
    doc_sep: str = "blank"
    root: str | None = None  # the directory source it was found in (read beneath it, no link followed)

    def __iter__(self) -> Iterator[str]:
        if self.doc_sep == "line":
            for _, line in _text_lines(self.path, self.root):
                text = line.rstrip("\r\n")
                if text.strip():
                    yield text
            return
        para: list[str] = []
        size = start = 0
        for lineno, line in _text_lines(self.path, self.root):
            if line.strip():
                para.append(line)
                size += len(line)
                start = start or lineno
                if size > MAX_LINE_CHARS:
                    raise UsageError(f"{self.path}:{start}: a document longer than {MAX_LINE_CHARS:,} characters "
                                     "(separate documents by blank lines, or use --doc-sep line)")
            elif para:
                yield "".join(para).rstrip("\r\n")
                para, size, start = [], 0, 0
        if para:
            yield "".join(para).rstrip("\r\n")


@dataclass(frozen=True)
class JsonlFile:
    """One JSON object per line, the document in `text_field`."""

    path: str
    text_field: str = "text"
    root: str | None = None  # the directory source it was found in (read beneath it, no link followed)

    def __iter__(self) -> Iterator[str]:
        for lineno, line in _text_lines(self.path, self.root):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise UsageError(f"{self.path}:{lineno}: not valid JSON ({err.msg})") from err
            except ValueError as err:  # an integer of more digits than Python converts
                raise UsageError(f"{self.path}:{lineno}: not a document ({str(err).splitlines()[0][:120]})") from None
            except RecursionError:
                raise UsageError(f"{self.path}:{lineno}: nested too deeply to be a document") from None
            if not isinstance(obj, dict) or self.text_field not in obj:
                raise UsageError(f"{self.path}:{lineno}: no field '{self.text_field}' (set --text-field)")
            text = obj[self.text_field]
            if not isinstance(text, str):
                raise UsageError(f"{self.path}:{lineno}: field '{self.text_field}' is not a string")
            yield text


@dataclass(frozen=True)
class ParquetFile:
    """A parquet file, read one record batch at a time from a file the layer opened (pyarrow never opens the
    path itself: a FIFO or a device there is one line, not a hang); pyarrow's errors are one line naming it."""

    path: str
    text_field: str = "text"
    root: str | None = None  # the directory source it was found in (read beneath it, no link followed)

    def __iter__(self) -> Iterator[str]:
        import pyarrow.parquet as pq

        with _open_binary(self.path, self.root) as fh:
            pf = self._library(lambda: pq.ParquetFile(fh))  # the open file, never the path
            if self.text_field not in pf.schema_arrow.names:
                raise UsageError(f"{self.path}: no column '{self.text_field}' (set --text-field)")
            batches = pf.iter_batches(columns=[self.text_field], batch_size=1024)
            while (batch := self._library(lambda: next(batches, None))) is not None:
                for text in batch.column(0).to_pylist():
                    if text is not None and not isinstance(text, str):
                        raise UsageError(f"{self.path}: column '{self.text_field}' is not a string column")
                    yield text or ""

    def _library(self, call: Callable[[], Any]) -> Any:
        """`call()` into pyarrow, its errors (a file that is not parquet, a damaged page) one line."""
        import pyarrow

        try:
            return call()
        except (pyarrow.ArrowException, OSError) as err:
            raise UsageError(f"cannot read parquet '{self.path}': {_first_line(err)}") from None


def _check_data_files(root: str) -> None:
    """Each `state.json` of a saved dataset names the files `load_from_disk` opens, joined to its directory: an
    absolute or `..` name would open a file outside it (a FIFO there hung prep). Each must be a plain name."""
    for dirpath, _, names in os.walk(root):  # os.walk descends into no link (regular_tree refused any anyway)
        if "state.json" not in names:
            continue
        where = os.path.join(dirpath, "state.json")
        try:
            state = json.loads(files.read_named(where))
            named = [entry["filename"] for entry in state.get("_data_files", [])]
        except (ValueError, RecursionError, TypeError, KeyError, AttributeError):
            raise UsageError(f"cannot load dataset '{root}': {where} is not a saved dataset's state") from None
        for name in named:
            if not isinstance(name, str) or not name or name != os.path.basename(name) or name in (".", ".."):
                raise UsageError(f"cannot load dataset '{root}': {where} names a data file outside its "
                                 f"directory ({str(name)[:120]!r})")


#: what the Hugging Face Hub could take for a repository id: `NAME` or `OWNER/NAME` (a path that starts with
#: `/`, `./` or `../`, or has more than one `/`, is no Hub name and is only ever read as a path)
_HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?")


def hub_name_refusal(name: str, what: str) -> str | None:
    """Why `name` cannot be read (None: it can): `datasets`, lm-eval and a tokenizer look a Hub name up first
    as a path relative to the working directory, so a co-tenant who can write that directory would choose what
    is read in its place. A Hub name that is also a path there is refused; a local path is named as one
    (./NAME or absolute) and then passes the checks every local source does."""
    if not _HUB_NAME.fullmatch(name) or not os.path.lexists(name):
        return None
    return (f"{what} '{name}' is a Hugging Face Hub name, and '{os.path.abspath(name)}' is there too: a Hub name "
            f"is read only from the Hub (whoever can write the directory you run from would choose the data); "
            f"name the local one as ./{name} or by its absolute path, or run from another directory")


def check_hub_name(name: str, what: str) -> None:
    """UsageError, one line, when `name` is a Hub name that is also a path in the working directory
    (`hub_name_refusal`): checked before anything is loaded or downloaded."""
    refusal = hub_name_refusal(name, what)
    if refusal is not None:
        raise UsageError(refusal)


@dataclass(frozen=True)
class HFDataset:
    """A `datasets` dataset: saved with `save_to_disk` (a directory) or by name from the Hub."""

    name_or_path: str
    split: str | None = None
    text_field: str = "text"
    from_disk: bool = False

    def __post_init__(self) -> None:
        if not self.from_disk:  # `hf:NAME`: a Hub name is never read from the working directory
            check_hub_name(self.name_or_path, "source hf:")

    def _load(self):  # noqa: ANN202 - a datasets.Dataset
        self._check_local()
        import datasets

        try:
            if self.from_disk:
                ds = datasets.load_from_disk(self.name_or_path)
            else:
                ds = datasets.load_dataset(self.name_or_path, split=self.split or "train")
        except Exception as err:
            msg = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise UsageError(f"cannot load dataset '{self.name_or_path}': {msg}") from err
        if isinstance(ds, datasets.DatasetDict):
            split = self.split or "train"
            if split not in ds:
                raise UsageError(f"dataset '{self.name_or_path}' has no split '{split}' (has {', '.join(ds)})")
            ds = ds[split]
        if self.text_field not in ds.column_names:
            raise UsageError(f"dataset '{self.name_or_path}' has no column '{self.text_field}' (set --text-field)")
        return ds

    def _check_local(self) -> None:
        """A saved dataset's directory (or a local path `hf:` names) is opened by `datasets` itself, file by file:
        every file below it must be a regular file and none a link (a FIFO would hang it). A Hub name is not
        a path here (one that is was refused when the source was named) and is left to `datasets`."""
        if not os.path.lexists(self.name_or_path):
            return
        try:
            if os.path.isdir(self.name_or_path):
                files.regular_tree(self.name_or_path)
                if self.from_disk:
                    _check_data_files(self.name_or_path)
            else:
                files.open_named(self.name_or_path).close()
        except OSError as err:
            raise UsageError(f"cannot load dataset '{self.name_or_path}': {files.said(err)}") from None

    def __iter__(self) -> Iterator[str]:
        ds = self._load()
        for batch in ds.select_columns([self.text_field]).iter(batch_size=1024):
            for text in batch[self.text_field]:
                yield text or ""


@dataclass(frozen=True)
class Directory:
    """Every .txt/.jsonl/.parquet file below a directory (.txt and .jsonl compressed or not), in sorted path
    order: the same files give the same documents in the same order, whatever mix of compressions they use.
    Only the directory's own files are read: a symbolic link among them (to a file, or to a directory that would
    otherwise be searched) is refused in one line naming it, and each file is opened beneath the directory with
    no link followed, so a link planted in a shared source directory never reads a file from elsewhere."""

    path: str
    doc_sep: str = "blank"
    text_field: str = "text"

    def files(self) -> list[str]:
        found = []
        for root, dirs, names in os.walk(self.path):  # os.walk lists a link among the names, never descends it
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for d in dirs:
                _not_a_link(os.path.join(root, d))
            read = [os.path.join(root, n) for n in names if n.endswith(FILE_SUFFIXES) and not n.startswith(".")]
            for f in read:
                _not_a_link(f)
            found += read
        if not found:
            raise UsageError(f"directory '{self.path}' holds no .txt, .jsonl or .parquet files "
                             f"(nor .txt or .jsonl compressed as {_COMPRESSED})")
        return sorted(found)

    def __iter__(self) -> Iterator[str]:
        for f in self.files():
            yield from file_source(f, self.doc_sep, self.text_field, root=self.path)


def _not_a_link(path: str) -> None:
    """One line naming `path` when it is a symbolic link in a directory source (never followed out of it)."""
    if os.path.islink(path):
        raise UsageError(f"source '{path}' is a symbolic link: a directory source is read only through its own "
                         "regular files, no link followed; remove the link or copy the file in")


_COMPRESSED = ", ".join(COMPRESSIONS)


def file_source(path: str, doc_sep: str, text_field: str, root: str | None = None):  # noqa: ANN201 - a reader
    """The reader of one file, chosen by its name: `.txt`/`.jsonl`, either maybe compressed, or `.parquet`.
    `root`: the directory source `path` lies in, which it is then opened beneath, no link followed."""
    inner = without_compression(path)
    if inner.endswith(".txt"):
        return TextFile(path, doc_sep, root)
    if inner.endswith(".jsonl"):
        return JsonlFile(path, text_field, root)
    if path.endswith(".parquet"):
        return ParquetFile(path, text_field, root)
    raise UsageError(f"unsupported source file '{path}' (expected .txt, .jsonl or .parquet; "
                     f".txt and .jsonl may be compressed: {_COMPRESSED})")


def source_compressions(source: object) -> list[str]:
    """The compressions of a source's files, sorted (empty for plain files and for non-file sources): what the
    manifest records beside the source, which its fingerprint (over the decompressed text) does not show."""
    if isinstance(source, Directory):
        paths = source.files()
    elif isinstance(source, (TextFile, JsonlFile)):
        paths = [source.path]
    else:
        return []
    return sorted({c for p in paths if (c := compression_of(p)) is not None})


def _is_saved_dataset(path: str) -> bool:
    return any(os.path.exists(os.path.join(path, n)) for n in ("dataset_info.json", "dataset_dict.json", "state.json"))


def open_source(spec: str, *, doc_sep: str = "blank", text_field: str = "text", num_docs: int | None = None,
                seed: int = 0):  # noqa: ANN201 - an iterable of documents
    """Turn `--source` into an iterable of documents (not yet limited to --num-docs)."""
    if spec.startswith("synthetic:"):
        from data_prep.synthetic import StoryCorpus

        kind = spec.partition(":")[2]
        if kind != "stories":
            raise UsageError(f"unknown synthetic corpus '{kind}' (available: stories)")
        return StoryCorpus(num_docs=num_docs if num_docs is not None else 20000, seed=seed)
    if spec.startswith("hf:"):
        name, _, split = spec[3:].partition(":")
        if not name:
            raise UsageError("source 'hf:' needs a dataset name")
        return HFDataset(name, split or None, text_field)
    path = spec
    if not os.path.exists(path):
        raise UsageError(f"source '{path}' does not exist")
    if os.path.isdir(path):
        if not os.access(path, os.R_OK | os.X_OK):
            raise UsageError(f"cannot read '{path}': permission denied")
        if _is_saved_dataset(path):
            return HFDataset(path, None, text_field, from_disk=True)
        return Directory(path, doc_sep, text_field)
    _check_readable(path)
    return file_source(path, doc_sep, text_field)
