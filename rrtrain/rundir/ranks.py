"""Where each rank of a run ran: `RUN/ranks/rankN.json`, one per rank, written by the rank itself once it holds
the run directory. On one machine that is a curiosity; across nodes it is what a hang, a lost node or a slow
rank is read against (which host, which node of the job, which Slurm job and attempt).

Fields: rank, local_rank, world_size, node_rank (torchrun's GROUP_RANK, else SLURM_NODEID), host (the
hostname), pid, job_id, restart (SLURM_RESTART_COUNT), started (Unix time). A restarted or resumed run
rewrites the files of the ranks it has; a rank file whose world_size differs from the run's last start is
from an earlier layout. Only distributed runs (world size > 1) write them."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from rrtrain.core import files
from rrtrain.core.io import atomic_write_text
from rrtrain.rundir import fields
from rrtrain.rundir.layout import RANKS


def describe(rank: int, local_rank: int, world_size: int, env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    node = env.get("GROUP_RANK", env.get("SLURM_NODEID"))
    job = (f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}" if env.get("SLURM_ARRAY_TASK_ID")
           else env.get("SLURM_JOB_ID"))
    return {"rank": rank, "local_rank": local_rank, "world_size": world_size,
            "node_rank": int(node) if node is not None and node.isdigit() else None,
            "host": socket.gethostname(), "pid": os.getpid(), "job_id": job,
            "restart": int(env.get("SLURM_RESTART_COUNT", "0") or 0), "started": time.time()}


def record(run_dir: str | os.PathLike[str], rank: int, local_rank: int, world_size: int) -> None:
    """Write this rank's file; a failure to write is a warning (the run does not depend on it)."""
    if world_size < 2:
        return
    path = Path(run_dir) / RANKS / f"rank{rank}.json"
    try:
        files.make_dirs(path.parent)
        atomic_write_text(path, json.dumps(describe(rank, local_rank, world_size)) + "\n")
    except OSError as err:
        print(f"rrtrain: warning: cannot record rank {rank}'s host in {path} ({err})", file=sys.stderr, flush=True)


def read(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The rank files of a run, by rank; a file that is unreadable, not an object, or without an integer
    `rank` and a text `host` is left out (anyone may have written it). `host` is text, `world_size` a count or
    None, `started` a finite number or None."""
    found: list[dict[str, Any]] = []
    for path in sorted((Path(run_dir) / RANKS).glob("rank*.json")):
        try:
            rec = json.loads(files.read_bytes(path, "rank"))
        except (OSError, ValueError, RecursionError):
            continue
        rank, host = (fields.count(rec.get("rank")), fields.text(rec.get("host"))) if isinstance(rec, dict) else (None, None)
        if rank is not None and host is not None and fields.step(rec.get("rank")) is not None:
            found.append({**rec, "rank": rank, "host": host[:255], "world_size": fields.count(rec.get("world_size")),
                          "started": fields.finite(rec.get("started"))})
    return sorted(found, key=lambda r: r["rank"])


def nodes(run_dir: str | os.PathLike[str]) -> list[str]:
    """The hosts of the run's latest start (the rank files of its most recent layout), in rank order, each
    once; [] for a run of one process."""
    recs = read(run_dir)
    if not recs:
        return []
    latest = max(recs, key=lambda r: fields.number(r.get("started")) or 0.0)
    hosts: list[str] = []
    for r in recs:
        if r.get("world_size") == latest.get("world_size") and r["host"] not in hosts:
            hosts.append(r["host"])
    return hosts


def hosts(run_dir: str | os.PathLike[str], world_size: Optional[int] = None) -> dict[int, str]:
    """rank -> host, only of rank files written at `world_size` when given."""
    return {r["rank"]: r["host"] for r in read(run_dir) if world_size is None or r.get("world_size") == world_size}
