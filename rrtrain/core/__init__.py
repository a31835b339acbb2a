"""Leaves every stage stands on: errors and exit codes, the end of a command, the command-line parser, atomic files,
the distributed environment, stop signals, hardware peaks, lazy imports."""
