"""Leaves every stage stands on: errors and exit codes, atomic files, the distributed environment, hardware peaks, lazy imports."""
