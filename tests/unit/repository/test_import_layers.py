"""Import layers: every package of the tree has a rank, and imports only go down (or stay in the package).

The layers, bottom to top: core -> data -> data_prep -> config -> residuals -> model -> {sizing, knobs}
-> resolve -> {parallel, rundir} -> training -> monitoring -> rrtrain.train -> {planning, report, dashboard}
-> cli;
`launchers` sits above rrtrain (which reaches it from `rrtrain.cli` only), by stage:
sweep -> state (read-only) -> {prune, cancel} -> executors -> submit. `rrtrain.data` (the prepared
dataset's format, its verification and the loader) stands on core alone, and `data_prep` writes that format,
so it stands on data and core. The model package (rrtrain/model/ and rrtrain/residuals/, which `rrtrain export`
copies as it is) stands on nothing else of rrtrain at all, and its modules import each other by relative
imports of one dot, so that the copied files run as flat modules of one directory.
A static pass over every module's imports (function-local ones and `TYPE_CHECKING` blocks included)
checks every edge against the table and finds every circle, the two old ones included
(trainer <-> callbacks <-> console <-> monitor, parallel.engine <-> parallel.deepspeed). A fresh
interpreter shows what `import rrtrain.config` and `import rrtrain.cli.status` load.
"""

from __future__ import annotations

import ast
import functools
import json
import subprocess
from pathlib import Path

import pytest

from trainutil import PY, REPO, env

ROOTS = ("rrtrain", "launchers", "data_prep")  # the packages whose modules the pass reads

#: package (or module) -> rank; a module may import modules of a lower or equal rank, or of its own package
LAYERS: dict[str, int] = {
    "rrtrain": 0,  # the package's __init__: a version string
    "rrtrain.core": 0,
    "rrtrain.data": 1,
    "data_prep": 2,
    "rrtrain.config": 3,
    "rrtrain.config_load": 3,  # YAML files and overrides into dataclasses: on errors and the file layer alone
    "rrtrain.budget": 3,  # steps and tokens from the train section: torch-free, for `rrtrain status` too
    "rrtrain.schedule": 3,  # the learning-rate schedules and their settings' checks: on errors alone, below the config
    "rrtrain.residuals": 4,
    "rrtrain.model": 5,
    "rrtrain.sizing": 5,  # presets and the model's counts from a config's model section (rrtrain.model.spec's shape)
    "rrtrain.knobs": 5,  # `model.residual` checked and typed against its rules' knobs
    "rrtrain.resolve": 6,
    "rrtrain.parallel": 7,  # the engines, and the memory model of what they hold (train.micro_batch=auto)
    "rrtrain.rundir": 7,
    "rrtrain.training": 8,
    "rrtrain.monitoring": 9,
    "rrtrain.eval": 9,  # downstream evaluation (lm-eval): the model class, and its callback on the loop
    "rrtrain.artifact": 9,  # a trained run's model: its artifact, or its checkpoint through the engines' reader
    "rrtrain.train": 10,
    "rrtrain.planning": 11,
    "rrtrain.report": 11,
    "rrtrain.dashboard": 11,
    "rrtrain.export": 11,  # a run's model as a Hugging Face directory (rrtrain.artifact)
    "rrtrain.cli": 12,
    "rrtrain.__main__": 12,
    # the sweep side, by stage: each stage imports only the stages before it
    "launchers": 13,  # the package's face, and the torchrun launch helpers
    "launchers.sweep": 13,  # the sweep file, its runs, the code snapshot, the locks, sweep.json
    "launchers.state": 14,  # read-only: the runs' state, squeue, the sweep-level flags, the status table
    "launchers.prune": 15,  # successive halving: reads runs through launchers.state
    "launchers.cancel": 15,  # the one module that cancels jobs or signals a run
    "launchers.executors": 16,  # slurm (submitit), local, debug, behind one protocol; sbatch scripts; the job entry
    "launchers.submit": 17,  # the one submit loop (a plain sweep is a pruned one with no rungs)
}
#: the one way up: the CLI's subcommands (`rrtrain sweep`, `rrtrain status`, ...) reach the launchers
UPWARD_ALLOWED = {("rrtrain.cli", key) for key in LAYERS if key == "launchers" or key.startswith("launchers.")}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path) -> set[str]:
    """Every module name that `path` imports anywhere in its body, `if TYPE_CHECKING:` blocks included (a type
    named from a higher layer is a dependency on it: the trainer circle ran through such imports), relative
    imports made absolute; `from pkg import name` counts `pkg` and `pkg.name`."""
    st = path.stat()
    return set(_parsed_imports(path, st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=None)
def _parsed_imports(path: Path, mtime_ns: int, size: int) -> frozenset[str]:
    """imported_names, each file parsed once per process while it is unchanged: six tests read the whole tree
    (~1.4 CPU-s a reading)."""
    names: set[str] = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]

    class Visitor(ast.NodeVisitor):
        def visit_Import(self, node: ast.Import) -> None:
            names.update(alias.name for alias in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)  # `from pkg import submodule`

    Visitor().visit(ast.parse(path.read_text()))
    return frozenset(names)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The modules of `modules` that `path` imports."""
    found = set()
    for name in imported_names(path):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found - {module_name(path)}


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for root in ROOTS for p in (REPO / root).rglob("*.py")}
    return {name: imported_modules(path, set(paths)) for name, path in paths.items()}


def layer_of(module: str) -> str | None:
    """The most specific entry of LAYERS that `module` is, or lies inside."""
    owners = [key for key in LAYERS if module == key or module.startswith(key + ".")]
    return max(owners, key=len) if owners else None


def upward_edges(graph: dict[str, set[str]]) -> list[str]:
    """Each import that climbs: to a higher rank, outside the importer's own package and UPWARD_ALLOWED."""
    bad = []
    for src in sorted(graph):
        for dst in sorted(graph[src]):
            a, b = layer_of(src), layer_of(dst)
            if a == b or (a, b) in UPWARD_ALLOWED or LAYERS[b] <= LAYERS[a]:
                continue
            bad.append(f"{src} ({a}, rank {LAYERS[a]}) -> {dst} ({b}, rank {LAYERS[b]})")
    return bad


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # recursion depth is bounded by the module count (~150)
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def describe_circles(graph: dict[str, set[str]], found: list[list[str]]) -> str:
    lines = []
    for component in found:
        inside = set(component)
        edges = [f"{a} -> {b}" for a in component for b in sorted(graph[a] & inside)]
        lines.append(f"circle of {len(component)}: " + "; ".join(edges))
    return "\n".join(lines)


def test_the_checks_catch_a_climbing_import_and_a_circle():
    """The checkers themselves, on a made-up graph: one upward edge, one circle, one allowed climb."""
    graph = {"rrtrain.config": {"rrtrain.model.transformer"}, "rrtrain.model.transformer": {"rrtrain.config"},
             "rrtrain.cli.main": {"launchers.submit"}, "launchers.submit": {"rrtrain.core.errors"},
             "rrtrain.core.errors": set()}
    assert upward_edges(graph) == ["rrtrain.config (rrtrain.config, rank 3) -> rrtrain.model.transformer "
                                   "(rrtrain.model, rank 5)"]
    assert circles(graph) == [["rrtrain.config", "rrtrain.model.transformer"]]
    assert "rrtrain.config -> rrtrain.model.transformer" in describe_circles(graph, circles(graph))


def test_every_module_has_a_layer():
    graph = import_graph()
    assert {"rrtrain.training.trainer", "rrtrain.parallel.engine", "rrtrain.cli.status", "data_prep.cli"} <= set(graph)
    unplaced = sorted(m for m in graph if layer_of(m) is None)
    if unplaced:
        pytest.fail(f"modules outside every layer (add their package to LAYERS): {unplaced}", pytrace=False)


def test_imports_only_go_down_the_layers():
    """rrtrain imports launchers only from rrtrain/cli/; data_prep imports rrtrain.core only."""
    graph = import_graph()
    assert "rrtrain.residuals.base" in graph["rrtrain.residuals"]  # the pass does see imports
    bad = upward_edges(graph)
    if bad:
        pytest.fail(f"{len(bad)} imports climb the layers (importer (layer, rank) -> imported):\n" + "\n".join(bad),
                    pytrace=False)


def test_matplotlib_is_imported_by_rrtrain_core_figures_alone():
    """matplotlib reads `./matplotlibrc` as it is first imported (a co-tenant's FIFO there hung `rrtrain report`):
    rrtrain.core.figures imports it with `/` as the working directory, and every figure comes through it."""
    importers = sorted(module_name(p) for root in ROOTS for p in (REPO / root).rglob("*.py")
                       if any(n == "matplotlib" or n.startswith("matplotlib.") for n in imported_names(p)))
    assert importers == ["rrtrain.core.figures"]


def test_no_import_circle_anywhere():
    """Both old circles included: trainer/callbacks/console/monitor, and parallel.engine/parallel.deepspeed."""
    graph = import_graph()
    found = circles(graph)
    if found:
        pytest.fail(f"{len(found)} import circles:\n" + describe_circles(graph, found), pytrace=False)


#: the model package: what `rrtrain export` copies beside an exported model (rrtrain/export/bundle.py)
MODEL_PACKAGE = ("rrtrain.model", "rrtrain.residuals")


def package_modules(graph: dict[str, set[str]]) -> set[str]:
    return {m for m in graph if layer_of(m) in MODEL_PACKAGE}


def test_the_model_package_imports_nothing_else_of_rrtrain():
    """rrtrain/model/ and rrtrain/residuals/ import each other and nothing else of rrtrain, launchers or
    data_prep (rrtrain.core and rrtrain.config included): an export carries these files alone."""
    graph = import_graph()
    members = package_modules(graph)
    assert {"rrtrain.model.transformer", "rrtrain.model.spec", "rrtrain.residuals.base"} <= members
    bad = sorted(f"{m} -> {d}" for m in members for d in graph[m] if d not in members)
    if bad:
        pytest.fail("the model package imports outside itself:\n" + "\n".join(bad), pytrace=False)


def test_the_model_package_imports_itself_by_one_dot():
    """Inside the package, `from .x import y` only (x a module of the same directory), never `rrtrain.` nor `..`:
    the same source then runs as rrtrain.model / rrtrain.residuals and as flat modules of an export."""
    graph = import_graph()
    bad = []
    for module in sorted(package_modules(graph)):
        path = REPO / (module.replace(".", "/") + ".py")
        path = path if path.exists() else REPO / module.replace(".", "/") / "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level > 1 or (node.level == 0 and (node.module or "")
                                                                         .split(".")[0] in ROOTS)):
                bad.append(f"{path.relative_to(REPO)} line {node.lineno}: from {'.' * node.level}{node.module}")
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] in ROOTS for a in node.names):
                bad.append(f"{path.relative_to(REPO)} line {node.lineno}: import {node.names[0].name}")
    if bad:
        pytest.fail("imports that cannot run flat:\n" + "\n".join(bad), pytrace=False)


def test_the_package_checks_catch_an_import_of_the_config():
    """The rule itself, on a made-up graph: a residual module importing the config is reported."""
    graph = {"rrtrain.residuals.base": {"rrtrain.config"}, "rrtrain.model.spec": set(), "rrtrain.config": set()}
    members = package_modules(graph)
    assert members == {"rrtrain.residuals.base", "rrtrain.model.spec"}
    assert [f"{m} -> {d}" for m in sorted(members) for d in graph[m] if d not in members] == \
        ["rrtrain.residuals.base -> rrtrain.config"]


def test_config_is_the_bottom_layer_on_errors_alone():
    graph = import_graph()
    assert "rrtrain.config" in graph["rrtrain.sizing"] and "rrtrain.config" in graph["rrtrain.knobs"]
    # the bottom layer stands on errors alone, and on the stdlib-only reader of files it did not write (through its
    # loader, rrtrain.config_load), on the checks of the schedules' settings, which stand on errors alone, and on the
    # checks of `data.sources`, which stand on errors and the manifest's reader (no torch, no streaming)
    assert graph["rrtrain.config"] <= {"rrtrain.core.errors", "rrtrain.core.files", "rrtrain.schedule",
                                       "rrtrain.data.sources", "rrtrain.config_load"}
    assert graph["rrtrain.config_load"] <= {"rrtrain.core.errors", "rrtrain.core.files"}
    assert graph["rrtrain.data.sources"] <= {"rrtrain.core.errors", "rrtrain.data.manifest"}
    assert graph["rrtrain.schedule"] <= {"rrtrain.core.errors"}


def test_importing_config_loads_neither_sizing_nor_the_registry():
    code = "import json, sys, rrtrain.config; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([PY, "-c", code], cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = set(json.loads(proc.stdout))
    assert "rrtrain.config" in loaded
    assert not {m for m in loaded if m.startswith(("rrtrain.residuals", "rrtrain.sizing", "rrtrain.model"))}


def test_rrtrain_status_loads_no_torch():
    """`rrtrain status` reads hundreds of runs' tails in under 2 s: importing torch alone would take over 1 s."""
    code = "import json, sys, rrtrain.cli.status; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([PY, "-c", code], cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = set(json.loads(proc.stdout))
    assert "launchers.sweep.expand" in loaded  # through launchers.sweep.record: the module whose imports matter here
    assert "torch" not in loaded


def test_rrtrain_status_loads_nothing_that_acts():
    """`rrtrain status` (and the dashboard's sweep tab) only read: the module that cancels, the executors and the
    submit loop are not even loaded, whatever sweep.json says (`cancel_flagged`)."""
    code = "import json, sys, rrtrain.cli.status; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([PY, "-c", code], cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = set(json.loads(proc.stdout))
    assert "launchers.state.status" in loaded
    assert not {m for m in loaded if m == "launchers.cancel" or m.startswith(("launchers.executors", "launchers.submit"))}

