"""The files lm-eval will open for tasks of the user's own (`--include`, `eval.downstream.include`), checked
before it opens any: lm-eval and `datasets` open them by path themselves, where a FIFO hangs them and a device
feeds them forever, so rrtrain looks first, through its file layer.

What is checked, and why each:
- The include directory, whole (`files.regular_tree`): lm-eval reads every `*.yaml` below it to build its
  index, so every entry must be a regular file or a directory and none a symbolic link.
- Every task YAML (those below the directory, or the one file named, and each file their `include:` keys name,
  wherever it lies): read by the layer (a regular file of at most a config's bound) and parsed with aliases and
  nesting bounded, `!function` read as a tag, never acted on. A file that is not YAML is one line here, where
  lm-eval would pass over it in silence and call the task unknown.
- The `!function` modules a YAML names (`utils.f` -> `utils.py` beside it) that exist: lm-eval imports them,
  so each must be a regular file of a config's bound.
- The local data a task names (`dataset_path` when it is a local path, `dataset_kwargs.data_files`, globs
  expanded as `datasets` expands them): regular files, or directories of regular files with no link.

- Who can change them: lm-eval imports the `!function` modules, so the include directory, every directory on
  its way and everything below it, each task YAML it reads (an `include:` target too: its `!function` names a
  module beside it) and each module (and its `__pycache__` entry) must be writable by no one but the user or
  root (`files.check_private_path`): a directory a co-tenant can write is code they run as the user. A task's
  data is read as data and need not be private.

Every refusal is one line, `WHERE: PATH: why`, before lm-eval imports or opens anything. A private task
directory is the user's own to trust: the modules its `!function` tags name run as lm-eval runs them.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from pathlib import Path
from typing import Any, Iterator, Optional

from rrtrain.core import files
from rrtrain.core.errors import UsageError

#: directories lm-eval's index does not look into (lm_eval.tasks._yaml_loader._IGNORE_DIRS)
IGNORED_DIRS = frozenset({"__pycache__", ".ipynb_checkpoints"})
#: the tag lm-eval's loader gives a function of a module beside the YAML
FUNCTION_TAG = "!function"
#: how many `include:` steps a chain may take (lm-eval's own task templates take one or two)
MAX_INCLUDE_DEPTH = 16
#: `dataset_path` values that name a builder of `datasets`, not a path (datasets.packaged_modules)
PACKAGED_BUILDERS = frozenset({"arrow", "audiofolder", "conll", "csv", "eval", "hdf5", "iceberg", "imagefolder",
                               "json", "lance", "meshfolder", "niftifolder", "pandas", "parquet", "pdffolder", "text",
                               "tsfile", "videofolder", "webdataset", "xml"})


def check(include: Path, where: str) -> None:
    """Refuse, in one line, an include (a directory or one YAML file) someone else can write, or holding
    anything lm-eval would open that is not a regular file of its bound, a link, or a YAML file that does not
    parse."""
    private(include, where)
    if include.is_dir():
        try:
            listing = files.regular_tree(include)
        except OSError as err:
            raise UsageError(f"{where}: {files.said(err)} (lm-eval opens the files of a task directory itself: "
                             "each must be a regular file, none a link)") from None
        for dirpath, dirnames, filenames in os.walk(include):  # no link below it (regular_tree): each entry once
            for name in sorted(dirnames + filenames):
                private(Path(dirpath) / name, where)
        checker = _Checker(where, include, set(listing))
        for rel in sorted(listing):
            if rel.endswith(".yaml") and not IGNORED_DIRS & set(Path(rel).parts[:-1]):
                checker.task_yaml(include / rel, 0)
    else:
        _Checker(where, None, set()).task_yaml(include, 0)


def private(path: Path, where: str) -> None:
    """One line when someone other than the user (or root) can change `path` or a directory on its way:
    lm-eval imports the code a task directory holds or names."""
    refusal = files.private_path_refusal(path)
    if refusal is not None:
        raise UsageError(f"{where}: {refusal} (lm-eval imports the `!function` code of a task directory)")


class _Checker:
    """One include's check: the directory's listing (regular files, checked whole) and the YAML files seen."""

    def __init__(self, where: str, root: Optional[Path], listing: set[str]) -> None:
        self.where, self.root, self.listing = where, root, listing
        self.seen: set[str] = set()

    def refuse(self, path: Path | str, why: str) -> UsageError:
        return UsageError(f"{self.where}: {path}: {why}")

    def _inside(self, path: Path) -> Optional[str]:
        """`path` relative to the include directory when it lies inside it (lexically), else None."""
        if self.root is None:
            return None
        rel = os.path.relpath(os.path.abspath(path), os.path.abspath(self.root))
        return None if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel

    def read(self, path: Path) -> bytes:
        """A task file's bytes through the layer: beneath the include directory when inside it (no link on the
        way), else as a file the task named (links followed, as lm-eval follows them); regular and bounded."""
        rel = self._inside(path)
        inside = rel is not None and rel in self.listing
        if not inside:  # below the include directory: checked with it
            private(path, self.where)
        try:
            if inside:
                return files.read_beneath(self.root, rel, "config")  # type: ignore[arg-type]
            return files.read_named(path, "config")
        except OSError as err:
            raise self.refuse(path, f"{err.strerror or type(err).__name__} (lm-eval would open it)") from None

    def task_yaml(self, path: Path, depth: int) -> None:
        key = os.path.abspath(path)
        if key in self.seen:
            return
        if depth > MAX_INCLUDE_DEPTH:
            raise self.refuse(path, f"more than {MAX_INCLUDE_DEPTH} steps of include:")
        self.seen.add(key)
        raw = self.read(path)
        try:
            cfg = files.load_yaml_tagged(raw.decode("utf-8"), [FUNCTION_TAG])
        except UnicodeDecodeError as err:
            raise self.refuse(path, f"not UTF-8 text (byte {err.start})") from None
        except Exception as err:  # noqa: BLE001 - yaml.YAMLError, the bounds' ValueError, RecursionError: the file's
            text = str(err).strip()
            why = getattr(err, "problem", None) or (text.splitlines()[0] if text else type(err).__name__)
            mark = getattr(err, "problem_mark", None)
            at = f" line {mark.line + 1}" if mark is not None else ""
            raise self.refuse(path, f"not a task YAML{at} ({str(why)[:160]})") from None
        if not isinstance(cfg, dict):
            return  # lm-eval passes over it too
        base = Path(os.path.realpath(path)).parent  # lm-eval resolves a YAML first: what it names is beside the target
        for inc in _strings(cfg.get("include")):
            target = Path(inc) if os.path.isabs(inc) else base / inc
            self.task_yaml(target, depth + 1)
        for qual in _functions(cfg):
            module = base / (qual.rpartition(".")[0].replace(".", "/") + ".py")
            private(module, self.where)  # lm-eval imports it (and would one made there later)
            private(Path(importlib.util.cache_from_source(str(module))), self.where)  # or its compiled form
            if os.path.lexists(module):
                self.read(module)
        self.data(cfg)

    def data(self, cfg: dict) -> None:
        """The task's local data, as `datasets` will open it (relative paths from the working directory)."""
        named = []
        dataset_path = cfg.get("dataset_path")
        if isinstance(dataset_path, str) and dataset_path not in PACKAGED_BUILDERS:
            named.append(dataset_path)
        kwargs = cfg.get("dataset_kwargs")
        if isinstance(kwargs, dict):
            data_files = kwargs.get("data_files")
            values = data_files.values() if isinstance(data_files, dict) else [data_files]
            named += [s for v in values for s in _strings(v)]
        for name in named:
            matches = glob.glob(name, recursive=True) if glob.has_magic(name) else [name]
            for found in matches:
                if os.path.lexists(found):  # a name on the Hub or a URL is not a local path: datasets' own
                    self.local_data(found)

    def local_data(self, path: str) -> None:
        try:
            if os.path.isdir(path):
                files.regular_tree(path)
            else:
                files.open_named(path).close()
        except OSError as err:
            raise self.refuse(path, f"{err.strerror or type(err).__name__} (a task's data, which datasets "
                                    "would open)") from None


def _strings(value: Any) -> list[str]:
    """A YAML value that names one file or several: a string, or a list of them (anything else: none)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def _functions(value: Any) -> Iterator[str]:
    """Every `!function` value anywhere in a parsed task YAML."""
    if isinstance(value, files.Tagged):
        if value.tag == FUNCTION_TAG:
            yield value.value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _functions(v)
    elif isinstance(value, list):
        for v in value:
            yield from _functions(v)
