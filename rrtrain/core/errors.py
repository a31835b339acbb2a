"""One error type for bad user input, so every command can turn it into a one-line message and exit 2."""

from __future__ import annotations

import sys

USAGE_EXIT = 2


class UsageError(Exception):
    """Bad input from the user (arguments, configuration, data). Printed as one line; exit status 2."""


def fail(prog: str, message: str) -> int:
    """Print `prog: error: message` on stderr and return the usage exit status."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return USAGE_EXIT


class RunError(Exception):
    """The run cannot go on for a reason outside its input (a full disk, a lost rank). Printed as one line;
    the run ends `failed`, exit status 1."""


RUN_ERROR_EXIT = 1
