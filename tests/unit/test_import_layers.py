"""Import layers: `rrtrain.config` is the bottom layer, below the residual-rule registry and `rrtrain.model.sizing`.

Both import the config's dataclasses; the checks that need them live in `rrtrain.resolve`, one layer up.
A static pass over every module's imports (function-local ones included, `TYPE_CHECKING` blocks excluded)
finds any import circle through those modules; a fresh interpreter shows what `import rrtrain.config` loads.
"""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

from trainutil import PY, REPO, env

PACKAGE = REPO / "rrtrain"
BOTTOM = ("rrtrain.config", "rrtrain.model.sizing", "rrtrain.residuals")  # the layers that formed the circle


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The rrtrain modules `path` imports anywhere in its body (outside `if TYPE_CHECKING:`)."""
    names: set[str] = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            test = node.test
            if getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == "TYPE_CHECKING":
                for child in node.orelse:
                    self.visit(child)
            else:
                self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            names.update(alias.name for alias in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)  # `from pkg import submodule`

    Visitor().visit(ast.parse(path.read_text()))
    found = set()
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found - {module_name(path)}


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: imported_modules(path, set(paths)) for name, path in paths.items()}


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_no_import_circle_through_config_sizing_or_the_registry():
    graph = import_graph()
    assert "rrtrain.residuals.base" in graph["rrtrain.residuals"]  # the pass does see imports
    assert "rrtrain.config" in graph["rrtrain.residuals.base"] and "rrtrain.config" in graph["rrtrain.model.sizing"]
    circles = {}
    for name in graph:
        if name.startswith(BOTTOM) and name in reachable(graph, name):
            circles[name] = sorted(m for m in reachable(graph, name) if name in reachable(graph, m))
    assert not circles, f"import circles: {circles}"
    assert graph["rrtrain.config"] <= {"rrtrain.core.errors"}  # the bottom layer stands on errors alone


def test_importing_config_loads_neither_sizing_nor_the_registry():
    code = "import json, sys, rrtrain.config; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([PY, "-c", code], cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = set(json.loads(proc.stdout))
    assert "rrtrain.config" in loaded
    assert not {m for m in loaded if m.startswith(("rrtrain.residuals", "rrtrain.model.sizing"))}


def test_rrtrain_status_loads_no_torch():
    """`rrtrain status` reads hundreds of runs' tails in under 2 s: importing torch alone would take over 1 s."""
    code = "import json, sys, launchers.status_cli; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([PY, "-c", code], cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = set(json.loads(proc.stdout))
    assert "launchers.expand" in loaded  # through launchers.record: the module whose imports matter here
    assert "torch" not in loaded
