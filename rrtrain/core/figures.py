"""Matplotlib's own defaults for every figure rrtrain draws, whatever a `matplotlibrc` in the working directory says.

Matplotlib reads `./matplotlibrc` when it is imported, ahead of the user's own settings, so a report or a
coordinate check started in a shared directory would draw with a co-tenant's file: `text.usetex` makes the command
run LaTeX (with their `text.latex.preamble`, which can read the user's files into the picture) or fail with a
traceback where LaTeX is missing. Figures are built and saved inside `default_style()`: matplotlib's built-in
style (every key but the backend and the other process-wide ones, which a bare `Figure` on the Agg canvas does not
read)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def default_style() -> Iterator[None]:
    import matplotlib.style

    with matplotlib.style.context("default"):
        yield
