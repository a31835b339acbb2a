"""The run directory: its lock and its metrics files."""
