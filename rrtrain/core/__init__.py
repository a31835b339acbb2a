"""Leaves every stage stands on: errors and exit codes, the command-line parser, atomic files, the distributed
environment, hardware peaks, lazy imports."""
