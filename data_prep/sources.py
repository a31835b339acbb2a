"""Corpus readers: each source is a re-iterable stream of document strings, never held whole.

Sources are iterated twice when a BPE tokenizer is trained (a sample pass, then the full pass), so
every reader re-opens its input on each `iter()`. Bad input raises `UsageError` naming the file and,
for jsonl, the line.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from typing import Iterator

from rrtrain.core import files
from rrtrain.core.errors import UsageError

FILE_SUFFIXES = (".txt", ".jsonl", ".parquet")


def _open_text(path: str):  # noqa: ANN202 - a text file object
    """A source file as text, only when it is a regular file (a FIFO would hang prep): the file the user named,
    or one found in the directory they named, links followed as they chose."""
    try:
        return io.TextIOWrapper(files.open_named(path), encoding="utf-8", errors="strict", newline="")
    except FileNotFoundError as err:
        raise UsageError(f"source '{path}' does not exist") from err
    except OSError as err:
        raise UsageError(f"cannot read '{path}': {err.strerror or err}") from err


def _check_readable(path: str) -> None:
    if not os.path.exists(path):
        raise UsageError(f"source '{path}' does not exist")
    if not os.access(path, os.R_OK):
        raise UsageError(f"cannot read '{path}': permission denied")


@dataclass(frozen=True)
class TextFile:
    """Plain text: documents separated by blank lines, or one document per line (`--doc-sep line`)."""

    path: str
    doc_sep: str = "blank"

    def __iter__(self) -> Iterator[str]:
        try:
            with _open_text(self.path) as f:
                if self.doc_sep == "line":
                    for line in f:
                        text = line.rstrip("\r\n")
                        if text.strip():
                            yield text
                    return
                para: list[str] = []
                for line in f:
                    if line.strip():
                        para.append(line)
                    elif para:
                        yield "".join(para).rstrip("\r\n")
                        para = []
                if para:
                    yield "".join(para).rstrip("\r\n")
        except UnicodeDecodeError as err:
            raise UsageError(f"'{self.path}' is not valid UTF-8 (byte {err.start})") from err


@dataclass(frozen=True)
class JsonlFile:
    """One JSON object per line, the document in `text_field`."""

    path: str
    text_field: str = "text"

    def __iter__(self) -> Iterator[str]:
        try:
            with _open_text(self.path) as f:
                for lineno, line in enumerate(f, start=1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as err:
                        raise UsageError(f"{self.path}:{lineno}: not valid JSON ({err.msg})") from err
                    if not isinstance(obj, dict) or self.text_field not in obj:
                        raise UsageError(f"{self.path}:{lineno}: no field '{self.text_field}' (set --text-field)")
                    text = obj[self.text_field]
                    if not isinstance(text, str):
                        raise UsageError(f"{self.path}:{lineno}: field '{self.text_field}' is not a string")
                    yield text
        except UnicodeDecodeError as err:
            raise UsageError(f"'{self.path}' is not valid UTF-8 (byte {err.start})") from err


@dataclass(frozen=True)
class ParquetFile:
    """A parquet file, read one record batch at a time."""

    path: str
    text_field: str = "text"

    def __iter__(self) -> Iterator[str]:
        import pyarrow.parquet as pq

        _check_readable(self.path)
        try:
            pf = pq.ParquetFile(self.path)
        except Exception as err:
            raise UsageError(f"cannot read parquet '{self.path}': {str(err).splitlines()[0]}") from err
        if self.text_field not in pf.schema_arrow.names:
            raise UsageError(f"{self.path}: no column '{self.text_field}' (set --text-field)")
        for batch in pf.iter_batches(columns=[self.text_field], batch_size=1024):
            for text in batch.column(0).to_pylist():
                if text is not None and not isinstance(text, str):
                    raise UsageError(f"{self.path}: column '{self.text_field}' is not a string column")
                yield text or ""


@dataclass(frozen=True)
class HFDataset:
    """A `datasets` dataset: saved with `save_to_disk` (a directory) or by name from the Hub."""

    name_or_path: str
    split: str | None = None
    text_field: str = "text"
    from_disk: bool = False

    def _load(self):  # noqa: ANN202 - a datasets.Dataset
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

    def __iter__(self) -> Iterator[str]:
        ds = self._load()
        for batch in ds.select_columns([self.text_field]).iter(batch_size=1024):
            for text in batch[self.text_field]:
                yield text or ""


@dataclass(frozen=True)
class Directory:
    """Every .txt/.jsonl/.parquet file below a directory, in sorted path order."""

    path: str
    doc_sep: str = "blank"
    text_field: str = "text"

    def files(self) -> list[str]:
        found = []
        for root, dirs, names in os.walk(self.path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            found += [os.path.join(root, n) for n in names if n.endswith(FILE_SUFFIXES) and not n.startswith(".")]
        if not found:
            raise UsageError(f"directory '{self.path}' holds no .txt, .jsonl or .parquet files")
        return sorted(found)

    def __iter__(self) -> Iterator[str]:
        for f in self.files():
            yield from file_source(f, self.doc_sep, self.text_field)


def file_source(path: str, doc_sep: str, text_field: str):  # noqa: ANN201 - one of the readers above
    if path.endswith(".txt"):
        return TextFile(path, doc_sep)
    if path.endswith(".jsonl"):
        return JsonlFile(path, text_field)
    if path.endswith(".parquet"):
        return ParquetFile(path, text_field)
    raise UsageError(f"unsupported source file '{path}' (expected .txt, .jsonl or .parquet)")


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
