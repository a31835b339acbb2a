"""What Slurm says about jobs, from `squeue` only (no accounting database is assumed)."""

from __future__ import annotations

import shutil
import subprocess
from typing import Optional

#: squeue states in which a job has not started yet / is (or is about to be) running
WAITING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED",
           "RESIZING"}
ACTIVE = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "STOPPED"}


def squeue_states(timeout_s: float = 10.0) -> Optional[dict[str, str]]:
    """Job id (array tasks as ARRAY_TASK) -> state for every job in the queue; None without squeue."""
    if shutil.which("squeue") is None:
        return None
    try:
        proc = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T"], capture_output=True, text=True,
                              timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    states: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states
