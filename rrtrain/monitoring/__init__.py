"""Convergence monitoring: the pure loss monitor, its in-run callback, the heartbeat watchdog and sweep-level flags."""
