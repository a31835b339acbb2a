"""rrtrain's model package, copied as it is into an export so that the model loads without rrtrain.

rrtrain/model/ and rrtrain/residuals/ import nothing else of rrtrain, and their modules import each other by
relative imports of one dot (`from .base import Site`; tests/unit/repository/test_import_layers.py holds them
to both), so their files run unchanged as flat modules of one directory. That is what transformers'
remote-code loader makes of an export: it copies the modeling file, and each file the modeling file names by a
relative import, into one package of its module cache. The modeling file (remote/modeling_rrtrain.py) gets one
such import per copied file, written at its marker.

Left out: each package's `__init__.py` (the registry, which also searches installed packages for rules: an
export finds its rule in `builtin.py`). A rule from another package is not rrtrain's to copy: its export is refused.
"""

from __future__ import annotations

from pathlib import Path

from rrtrain.core import files as rrfiles
from rrtrain.core.errors import UsageError
from rrtrain.residuals import BUILTIN, RuleSpec

ROOT = Path(__file__).resolve().parents[1]  # rrtrain/
#: the directories copied, and the files of theirs that are not part of the model package
PACKAGES = (ROOT / "model", ROOT / "residuals")
LEFT_OUT = frozenset({"__init__.py"})
TEMPLATES = Path(__file__).resolve().parent / "remote"
TEMPLATE_FILES = ("configuration_rrtrain.py", "modeling_rrtrain.py")
MARKER = "# COPIED-MODULES\n"


class BundleError(RuntimeError):
    """The model package cannot be copied flat (two files of one name): a bug in rrtrain, caught by its tests."""


def package_files() -> dict[str, str]:
    """File name -> text of every file of the model package, as it is."""
    out: dict[str, str] = {}
    for package in PACKAGES:
        for path in sorted(package.glob("*.py")):
            if path.name in LEFT_OUT:
                continue
            if path.name in out or path.name in TEMPLATE_FILES:
                raise BundleError(f"two files would be copied as {path.name} (the last from {package})")
            out[path.name] = path.read_text(encoding="utf-8")
    return out


def template_files(modules: list[str]) -> dict[str, str]:
    """The Hugging Face configuration and model classes (rrtrain/export/remote/), the model class's file naming
    each of `modules` (the copied package) by a relative import of its own."""
    files = {name: (TEMPLATES / name).read_text(encoding="utf-8") for name in TEMPLATE_FILES}
    if files["modeling_rrtrain.py"].count(MARKER) != 1:
        raise BundleError("modeling_rrtrain.py has no single import marker")
    lines = "".join(f"from .{m} import __name__ as _copied_{i}  # noqa: F401\n" for i, m in enumerate(modules))
    files["modeling_rrtrain.py"] = files["modeling_rrtrain.py"].replace(MARKER, lines)
    return files


def check_exportable(rule: RuleSpec) -> None:
    """Only rrtrain's own rules travel with the copied package; another package's rule imports rrtrain."""
    if not any(rule is spec for spec in BUILTIN):
        raise UsageError(f"residual rule '{rule.name}' comes from another package ({rule.site.__module__}): an "
                         "export carries rrtrain's own rules only (or use the run with rrtrain installed)")


def write(out_dir: Path, rule: RuleSpec) -> list[str]:
    """Write the copied package and the templates into `out_dir`; the names written."""
    check_exportable(rule)
    source = package_files()
    files = {**source, **template_files(sorted(name[:-3] for name in source))}
    for name, text in sorted(files.items()):
        rrfiles.atomic_write_beneath(out_dir, name, text.encode("utf-8"))
    return sorted(files)
