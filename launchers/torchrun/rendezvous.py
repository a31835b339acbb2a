"""A multi-node job's rendezvous: a port and an id drawn at random when the job is submitted, kept in a file that
only its owner can read.

The agents of a multi-node job meet in a c10d store on the head node, and read the rendezvous state from it.
A port and id derived from the job id (which `squeue` shows everyone) let a co-tenant squat the port before the
job starts or write the state key into the job's store. Here both are drawn from the operating system's random
source at submission (`rrtrain sweep` writes one file per multi-node run, `slurm/multinode.sbatch` draws one at
its first start when none is given), travel only in this file and in the agents' memory (never on a command line,
which every user of a node can read), and the file is refused unless it is a regular file of this user that no
one else may read. The state the agents read back is unpickled by `launchers.torchrun.rendezvous_state`, which
builds nothing but the rendezvous' own types.

`python -m launchers.torchrun.rendezvous new FILE [--port N]` draws one into FILE at submission (N: a port the
cluster's firewall lets through, instead of a random one); `RRTRAIN_RDZV_FILE=FILE sbatch slurm/multinode.sbatch`
then uses it. The script draws the same (JSON `{"port": N, "id": "..."}`, mode 600) itself when given none.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from rrtrain.core import files
from rrtrain.core.errors import UsageError, fail

#: ports drawn from, below Linux's default ephemeral range (32768-60999), so that no outgoing connection on the
#: head node holds the drawn one by chance
PORTS = (20000, 32767)
ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{16,64}")
MAX_BYTES = 4096


@dataclass(frozen=True)
class Rendezvous:
    port: int
    id: str


def draw(port: int | None = None) -> Rendezvous:
    """A fresh rendezvous: a random port in PORTS (or `port`) and a random 128-bit id."""
    if port is None:
        port = PORTS[0] + secrets.randbelow(PORTS[1] - PORTS[0] + 1)
    return Rendezvous(check_port(port), "rrtrain-" + secrets.token_hex(16))


def check_port(port: object) -> int:
    if not isinstance(port, int) or isinstance(port, bool) or not 1024 <= port <= 65535:
        raise UsageError(f"rendezvous port {port!r}: not a port number from 1024 to 65535")
    return port


def write(path: Path, rdzv: Rendezvous) -> None:
    """Write `rdzv` to `path`, readable and writable by this user only from its creation (mode 600), atomically:
    created beside `path` under a fresh name, never through a link, and renamed over it."""
    files.atomic_write_file(path, json.dumps({"port": rdzv.port, "id": rdzv.id}) + "\n", mode=0o600)


def read(path: Path) -> Rendezvous:
    """The rendezvous in `path`; UsageError (one line) unless it is a regular file of this user, not a link, that
    no other user may read or write, holding a port and an id."""
    try:
        with files.open_regular(path) as fh:
            st = os.fstat(fh.fileno())
            if st.st_uid != os.getuid() or st.st_mode & 0o077:
                raise UsageError(f"rendezvous file {path}: must belong to you and be readable by you only (mode "
                                 "600); resubmit, or draw a new one with `python -m launchers.torchrun.rendezvous "
                                 "new FILE`")
            data = fh.read(MAX_BYTES + 1)
    except files.LinkRefused:
        raise UsageError(f"rendezvous file {path}: a symbolic link") from None
    except files.NotRegular:
        raise UsageError(f"rendezvous file {path}: not a regular file") from None
    except OSError as err:
        raise UsageError(f"rendezvous file {path}: {err.strerror or err}") from None
    try:
        obj = json.loads(data) if len(data) <= MAX_BYTES else None
    except (ValueError, UnicodeDecodeError):
        obj = None
    if not isinstance(obj, dict) or not isinstance(obj.get("id"), str) or not ID_PATTERN.fullmatch(obj["id"]):
        raise UsageError(f"rendezvous file {path}: not a rendezvous (a JSON object with a port and an id)")
    return Rendezvous(check_port(obj.get("port")), obj["id"])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m launchers.torchrun.rendezvous",
                                     description="Draw a multi-node job's rendezvous into FILE (mode 600).")
    sub = parser.add_subparsers(dest="command", required=True)
    new = sub.add_parser("new", help="draw a random port and id into FILE")
    new.add_argument("file", type=Path)
    new.add_argument("--port", type=int, default=None, help="this port instead of a random one (firewalls)")
    args = parser.parse_args(argv)
    try:
        write(args.file, draw(args.port))
    except UsageError as err:
        return fail(parser.prog, str(err))
    except OSError as err:
        return fail(parser.prog, f"{args.file}: {err.strerror or err}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
