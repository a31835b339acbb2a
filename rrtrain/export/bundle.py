"""rrtrain's own model and residual-rule source, copied into an export so that it loads without rrtrain.

An exported directory must compute exactly what rrtrain computes, for any rule, where rrtrain is not installed.
It therefore carries the source itself rather than a re-implementation: `rrtrain/model/transformer.py`, the
module of the run's rule and every rrtrain module they import (found by following their imports), each as a
plain module of the directory. transformers' remote-code loader follows relative imports (`from .x import y`),
so each absolute `from rrtrain... import` is rewritten, statement by statement from the syntax tree:

- a module that is copied:       `from rrtrain.residuals.norm import RMSNorm` -> `from .norm import RMSNorm`
- a package's re-exported names: `from rrtrain.residuals import Site`         -> `from .base import Site`
- the parts left behind (`SHIMMED`): the schema, the errors, the registry -> `from .rrtrain_shim import ...`
  (rrtrain/export/remote/rrtrain_shim.py: the recorded `model.residual` values, UsageError, the one rule)

Any other form (`import rrtrain.x`, a submodule imported by name) is refused with the statement named: the
bundle is checked by tests for every built-in rule, so a new import in the model's source that the rewrite
cannot follow fails there, not in a user's export.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from types import ModuleType

from rrtrain.core import files as rrfiles
from rrtrain.residuals import RuleSpec

SHIM = "rrtrain_shim"
RULE_MODULE = "exported_rule"
#: rrtrain modules an export does not carry: the names the copied source takes from them come from the shim
SHIMMED: dict[str, frozenset[str]] = {
    "rrtrain.config": frozenset({"ResidualConfig", "ModelConfig"}),
    "rrtrain.core.errors": frozenset({"UsageError"}),
    "rrtrain": frozenset({"residuals"}),  # `from rrtrain import residuals`: the registry
}
#: where the copying starts besides the rule's module
ROOTS = ("rrtrain.model.transformer",)
TEMPLATES = Path(__file__).resolve().parent / "remote"


class BundleError(RuntimeError):
    """The model's source imports something the rewrite cannot carry (a bug in rrtrain, caught by its tests)."""


def rule_module(rule: RuleSpec) -> ModuleType:
    """The module that defines `rule` (its `SPEC`, or one of its `SPECS`)."""
    for candidate in (rule.site, rule.stream):
        module = inspect.getmodule(candidate)
        if module is not None and (getattr(module, "SPEC", None) is rule or rule in getattr(module, "SPECS", ())):
            return module
    raise BundleError(f"residual rule '{rule.name}': no module of its site or stream defines it as SPEC or in SPECS")


def _is_rrtrain(name: str) -> bool:
    return name == "rrtrain" or name.startswith("rrtrain.")


def _rewrite(node: ast.ImportFrom, where: str) -> tuple[str, list[str]]:
    """The relative statement replacing one `from rrtrain... import ...`, and the modules it needs copied."""
    module, names = node.module or "", [a.name for a in node.names]
    aliases = ", ".join(a.name if a.asname is None else f"{a.name} as {a.asname}" for a in node.names)
    if module in SHIMMED:
        unknown = sorted(set(names) - SHIMMED[module])
        if unknown:
            raise BundleError(f"{where}: 'from {module} import {unknown[0]}' has no stand-in in {SHIM}.py")
        return f"from .{SHIM} import {aliases}", []
    imported = importlib.import_module(module)
    if not hasattr(imported, "__path__"):  # a module: copied as itself
        return f"from .{module.rpartition('.')[2]} import {aliases}", [module]
    # a package: each name from the module that defines it
    sources = set()
    for name in names:
        obj = getattr(imported, name, None)
        owner = getattr(obj, "__module__", None)
        if obj is None or isinstance(obj, ModuleType) or owner is None or not _is_rrtrain(owner):
            raise BundleError(f"{where}: 'from {module} import {name}' is not a class or function of an rrtrain module")
        sources.add(owner)
    if len(sources) != 1:
        raise BundleError(f"{where}: 'from {module} import {', '.join(names)}' takes names from several modules")
    (owner,) = sources
    return f"from .{owner.rpartition('.')[2]} import {aliases}", [owner]


def rewrite_source(text: str, where: str) -> tuple[str, list[str]]:
    """`text` with every rrtrain import made relative, and the rrtrain modules it needs copied."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    needed: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(_is_rrtrain(a.name) for a in node.names):
            raise BundleError(f"{where} line {node.lineno}: 'import rrtrain...' cannot be made relative; "
                              "use 'from rrtrain.x import y'")
        if isinstance(node, ast.ImportFrom) and node.level == 0 and _is_rrtrain(node.module or ""):
            statement, modules = _rewrite(node, f"{where} line {node.lineno}")
            edits.append((node.lineno, node.end_lineno or node.lineno, " " * node.col_offset + statement + "\n"))
            needed += modules
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            raise BundleError(f"{where} line {node.lineno}: a relative import cannot be copied flat")
    for first, last, replacement in sorted(edits, reverse=True):
        lines[first - 1:last] = [replacement]
    return "".join(lines), needed


def source_files(rule: RuleSpec) -> dict[str, str]:
    """File name -> text of the copied source for a model of `rule`: the model, the rule's module, everything
    they import from rrtrain (rewritten), and `exported_rule.py` naming the rule."""
    start = rule_module(rule)
    queue = [*ROOTS, start.__name__]
    files: dict[str, str] = {}
    owners: dict[str, str] = {}
    while queue:
        name = queue.pop(0)
        file = name.rpartition(".")[2] + ".py"
        if owners.get(file) == name:
            continue
        if file in owners or file in {f"{SHIM}.py", f"{RULE_MODULE}.py", "modeling_rrtrain.py",
                                      "configuration_rrtrain.py"}:
            raise BundleError(f"two modules would be copied as {file}: {owners.get(file, 'the export')} and {name}")
        path = inspect.getsourcefile(importlib.import_module(name))
        if path is None:
            raise BundleError(f"module {name} has no source file to copy")
        text, needed = rewrite_source(Path(path).read_text(encoding="utf-8"), name)
        owners[file], files[file] = name, text
        queue += needed
    attr = "SPEC" if getattr(start, "SPEC", None) is rule else "SPECS"
    pick = "SPEC = _SPEC" if attr == "SPEC" else f"SPEC = next(s for s in _SPECS if s.name == {rule.name!r})"
    files[f"{RULE_MODULE}.py"] = (
        f'"""The residual rule this model was trained with, {rule.name!r} (written by rrtrain export)."""\n\n'
        f"from .{start.__name__.rpartition('.')[2]} import {attr} as _{attr}\n\n{pick}\n")
    return files


MARKER = "# BUNDLED-IMPORTS\n"


def template_files(modules: list[str]) -> dict[str, str]:
    """The Hugging Face configuration and model classes and the shim (rrtrain/export/remote/), the model class's
    file importing each of `modules` (the copied source) by a relative import of its own."""
    files = {name: (TEMPLATES / name).read_text(encoding="utf-8")
             for name in ("configuration_rrtrain.py", "modeling_rrtrain.py", f"{SHIM}.py")}
    lines = "".join(f"from .{m} import __name__ as _bundled_{i}  # noqa: F401\n" for i, m in enumerate(modules))
    if files["modeling_rrtrain.py"].count(MARKER) != 1:
        raise BundleError("modeling_rrtrain.py has no single import marker")
    files["modeling_rrtrain.py"] = files["modeling_rrtrain.py"].replace(MARKER, lines)
    return files


def write(out_dir: Path, rule: RuleSpec) -> list[str]:
    """Write the copied source and the templates into `out_dir`; the names written."""
    source = source_files(rule)
    files = {**source, **template_files(sorted([*(f[:-3] for f in source), SHIM]))}
    for name, text in sorted(files.items()):
        rrfiles.atomic_write_beneath(out_dir, name, text.encode("utf-8"))
    return sorted(files)
