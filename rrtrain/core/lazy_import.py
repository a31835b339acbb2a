"""Import a submodule without running the heavy `__init__` files of the packages above it.

`import streaming.base.dataset` first runs `streaming/__init__.py`, which imports `streaming.text`,
`streaming.vision` and `streaming.multimodal`, and `streaming/base/__init__.py`, which imports the
`StreamingDataLoader`: together they pull in transformers and torchvision (about 1 s with a warm page
cache, 6.5 s cold, and 0.2 GB of RSS per process). The trainer reads MDS shards through
`StreamingDataset` and its shuffles, which need none of that.

`import_deferred("streaming.base.dataset", ("streaming", "streaming.base"))` registers the named
packages with their `__path__` but without executing their `__init__`, then imports the submodule as
usual. Nothing else changes: a package's `__init__` runs in full the first time anyone asks the
package for a name that is not a submodule (`from streaming import MDSWriter`, `streaming.__version__`),
exactly as the normal import would have run it, only later.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Any, Iterable


def _defer_package(name: str) -> None:
    """Put package `name` into sys.modules with its path set and its `__init__` not yet run."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None or spec.loader is None:
        raise ImportError(f"{name} is not an importable package")
    module = importlib.util.module_from_spec(spec)

    def complete_init(attr: str) -> Any:
        # A submodule is imported on its own; any other name needs the package's __init__.
        if importlib.util.find_spec(f"{name}.{attr}") is not None:
            return importlib.import_module(f"{name}.{attr}")
        del module.__dict__["__getattr__"]
        spec.loader.exec_module(module)
        try:
            return module.__dict__[attr]
        except KeyError:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}") from None

    module.__dict__["__getattr__"] = complete_init
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)


def import_deferred(module: str, packages: Iterable[str]) -> ModuleType:
    """Import `module`, first registering each of `packages` (outermost first) with its `__init__` deferred."""
    if module not in sys.modules:
        for package in packages:
            _defer_package(package)
    return importlib.import_module(module)


STREAMING_PACKAGES = ("streaming", "streaming.base")


def streaming_module(module: str) -> ModuleType:
    """A submodule of mosaicml-streaming (e.g. "streaming.base.util") without transformers or torchvision.

    `streaming.base.dataset` is imported first, as streaming's own `__init__` does: its submodules import
    each other in a cycle (util -> format -> format.base.reader -> util) that only resolves in that order.
    """
    import_deferred("streaming.base.dataset", STREAMING_PACKAGES)
    return importlib.import_module(module)
