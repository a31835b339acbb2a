"""matplotlib for every figure rrtrain draws, never configured by a co-tenant's `matplotlibrc`.

Matplotlib reads `./matplotlibrc` as it is first imported, before the user's own settings, and opens whatever is
at that name: a report or a coordinate check started in a shared directory hung on a FIFO there, filled memory
from a link to /dev/zero, and ran LaTeX for `text.usetex` (with the file's `text.latex.preamble`, which can read
the user's files into the picture) or ended in a traceback where LaTeX is missing. So matplotlib is imported here
alone (tests/unit/repository/test_import_layers.py holds every other module to it), with `/` as the working
directory, and the figures are built and saved inside `default_style()`, matplotlib's built-in style, so that a
report's PNGs are the same whoever draws them (every key but the backend and the other process-wide ones, which a
bare `Figure` on the Agg canvas does not read)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rrtrain.core import files

with files.working_in("/"):
    import matplotlib  # noqa: F401  (its rc files are read now: the user's own, never the working directory's)

import matplotlib.style  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

__all__ = ["Figure", "Line2D", "default_style"]


@contextlib.contextmanager
def default_style() -> Iterator[None]:
    with matplotlib.style.context("default"):
        yield
