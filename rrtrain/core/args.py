"""The argument parser of every `rrtrain` subcommand (and `rrtrain prep`, `rrtrain sweep`, `rrtrain status`).

argparse, on bad arguments, prints its usage block and exits from inside `parse_args`; here a bad argument
raises `UsageError` instead, so the command's caller prints it as one line (`rrtrain NAME: error: ...`) and
exits 2, the same as every other kind of bad input. It lives in `core` so that data_prep/ and launchers/,
which sit beside the stages, use the same one.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

from rrtrain.core.errors import UsageError


class CommandParser(argparse.ArgumentParser):
    """`argparse.ArgumentParser` whose usage errors are `UsageError`s; `--help` behaves as argparse's."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)
