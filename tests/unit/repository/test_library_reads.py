"""Files handed to libraries: a static pass over every module of ROOTS finds each call of a library that reads
files by itself (torch's and DCP's loaders, tokenizers, pyarrow, datasets, lm-eval's TaskManager, numpy's
memmap, safetensors, HF's from_pretrained) and fails on one that is not in ALLOWLIST, which says for each how
what it reads went through the file layer first (docs/reliability.md, "Files handed to libraries"). A new
call of such a reader is reviewed here rather than found later as a hang on a FIFO. Runtime: about 1 s."""

from __future__ import annotations

import ast
from typing import Iterator

from trainutil import REPO

ROOTS = ("rrtrain", "data_prep", "launchers")

#: (receiver, attribute) of the readers; receiver "" matches any (a name imported under another name)
READERS = {("torch", "load"), ("dcp", "load"), ("", "from_file"), ("", "from_pretrained"), ("pq", "ParquetFile"),
           ("pq", "read_table"), ("datasets", "load_from_disk"), ("datasets", "load_dataset"),
           ("np", "memmap"), ("np", "load"), ("", "safe_open"), ("", "load_file")}
#: bare names that are readers when called (`TaskManager(include_path=...)`)
READER_NAMES = {"TaskManager"}

#: (module path, function, call) -> how what it reads was checked. An entry that matches no call fails the pass.
ALLOWLIST: dict[tuple[str, str, str], str] = {
    ("rrtrain/parallel/safe_load.py", "weights_only", "torch.load"):
        "bytes in hand, or a file opened by files.open_regular (regular, never a link)",
    ("rrtrain/parallel/deepspeed.py", "saved_groups", "torch.load"):
        "memory-mapped by path after files.open_regular checked it, inside a tree safe_load.check_tree walked",
    ("rrtrain/training/checkpoint.py", "CheckpointManager.load", "torch.load"):
        "the RNG file opened by files.open_regular",
    ("rrtrain/parallel/native.py", "NativeEngine.load", "dcp.load"):
        "RestrictedFileSystemReader: every file opened beneath the checkpoint by the layer (BeneathFileSystem)",
    ("rrtrain/parallel/consolidate.py", "load_dcp", "dcp.load"):
        "RestrictedFileSystemReader, as for resume",
    ("rrtrain/export/tokenizer.py", "hf_tokenizer", "from_file"):
        "a tokenizer.json this very call wrote into a fresh TemporaryDirectory",
    ("data_prep/tokenizer.py", "load_hf", "from_pretrained"):
        "a name on the Hub: reached only when no file of that name exists",
    ("data_prep/sources.py", "ParquetFile.__iter__", "pq.ParquetFile"):
        "handed the file files.open_named opened (a regular file), never the path",
    ("data_prep/sources.py", "HFDataset._load", "datasets.load_from_disk"):
        "the directory checked whole first (HFDataset._check_local: files.regular_tree)",
    ("data_prep/sources.py", "HFDataset._load", "datasets.load_dataset"):
        "a Hub name, or a local path checked first (HFDataset._check_local)",
    ("rrtrain/eval/tasks.py", "task_manager", "TaskManager"):
        "the include path checked first (check_include -> rrtrain.eval.task_files.check); no include: lm-eval's own",
}


def reader_calls(source: str, path: str) -> Iterator[tuple[str, str, str, int]]:
    """(path, function, call, line) for every call of a file-reading library in `source`."""
    found: list[tuple[str, str, str, int]] = []
    stack: list[str] = []

    class Visitor(ast.NodeVisitor):
        def scoped(self, node: ast.AST) -> None:
            stack.append(node.name)  # type: ignore[attr-defined]
            self.generic_visit(node)
            stack.pop()

        visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = scoped

        def visit_Call(self, node: ast.Call) -> None:
            func, call = node.func, None
            if isinstance(func, ast.Attribute):
                receiver = func.value.id if isinstance(func.value, ast.Name) else ""
                if (receiver, func.attr) in READERS:
                    call = f"{receiver}.{func.attr}"
                elif ("", func.attr) in READERS:
                    call = func.attr
            elif isinstance(func, ast.Name) and func.id in READER_NAMES:
                call = func.id
            if call is not None:
                found.append((path, ".".join(stack) or "<module>", call, node.lineno))
            self.generic_visit(node)

    Visitor().visit(ast.parse(source))
    yield from found


def test_every_library_read_is_one_the_layer_checked_first():
    found = [c for root in ROOTS for file in sorted((REPO / root).rglob("*.py"))
             for c in reader_calls(file.read_text(), file.relative_to(REPO).as_posix())]
    bad = [f"{p}:{line} {func}: {call}" for p, func, call, line in found if (p, func, call) not in ALLOWLIST]
    assert not bad, ("a library reads a file by itself here: open or check it through rrtrain.core.files first "
                     "and add a commented ALLOWLIST entry saying how:\n" + "\n".join(bad))
    stale = set(ALLOWLIST) - {(p, func, call) for p, func, call, _ in found}
    assert not stale, f"ALLOWLIST entries that match no call any more (remove them): {sorted(stale)}"


def test_the_pass_finds_planted_reads():
    planted = '''
import torch, numpy as np
from tokenizers import Tokenizer
from lm_eval.tasks import TaskManager

def load(p):
    torch.load(p)
    Tokenizer.from_file(p)
    np.memmap(p)
    "x".load  # not a call
    return TaskManager(include_path=p)
'''
    got = {(func, call) for _, func, call, _ in reader_calls(planted, "x.py")}
    assert got == {("load", "torch.load"), ("load", "from_file"), ("load", "np.memmap"), ("load", "TaskManager")}
