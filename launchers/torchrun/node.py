"""torchrun for one node of a multi-node job, meeting the other nodes at a rendezvous only the job knows, with its
stores listening on this node's address only:
`RRTRAIN_RDZV_FILE=FILE python -m launchers.torchrun.node --rdzv_endpoint=HEAD TORCHRUN_ARGS...`
(slurm/multinode.sbatch runs it on every node).

The rendezvous port and id come from FILE (launchers.torchrun.rendezvous: drawn at random at submission, readable
by the user only), not from the command line, which every user of the node can read. The agent on HEAD hosts the
c10d rendezvous store on a socket it binds itself before torchrun starts, on the address HEAD resolves to (every
interface where that is a loopback address the other nodes cannot reach): when the port is taken, the job ends
with one line naming it. torch would instead connect as a client to whoever holds the port; the other agents are
told they never host it (`is_host`), so none of them falls back either. The state they read back is unpickled
by launchers.torchrun.rendezvous_state. The id torch names in its log lines and errors is written as
`<rendezvous id>` (launchers.torchrun.log_redaction): the job's log may be readable by others.

The agent that becomes node rank 0 hosts the store its ranks share (MASTER_PORT, at MASTER_ADDR = `--local-addr`,
else the node's fully qualified name), at a free port on the address MASTER_ADDR resolves to (torch's own where
it is not one of this node's, or is a loopback address). Everything else is torchrun's
(launchers/torchrun/store_binding.py).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
from pathlib import Path
from typing import Optional

from launchers.torchrun import log_redaction, rendezvous, rendezvous_state
from launchers.torchrun.store_binding import bind_stores
from rrtrain.core.errors import UsageError, fail
from rrtrain.core.stores import bindable_address, listener

PROG = "rrtrain multinode"
RDZV_FILE_ENV = "RRTRAIN_RDZV_FILE"


def node_address(name: str) -> Optional[str]:
    """The address `name` resolves to, when it is this machine's and not a loopback address."""
    addr = bindable_address(name)
    return None if addr is None or ipaddress.ip_address(addr).is_loopback else addr


def rendezvous_args(args: argparse.Namespace, rdzv: rendezvous.Rendezvous, is_host: bool) -> None:
    """Point torchrun's parsed arguments at `rdzv` on the endpoint's host, hosting it here exactly when `is_host`."""
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    if args.rdzv_id not in (None, "", "none"):
        raise UsageError("--rdzv_id: the rendezvous id comes from the rendezvous file, not the command line")
    host, _ = parse_rendezvous_endpoint(args.rdzv_endpoint, default_port=rdzv.port)
    if not host or args.rdzv_endpoint.strip() != host:
        raise UsageError(f"--rdzv_endpoint={args.rdzv_endpoint}: give the host only; the port comes from the "
                         "rendezvous file")
    args.rdzv_endpoint, args.rdzv_id = f"{host}:{rdzv.port}", rdzv.id
    conf = [c for c in (args.rdzv_conf or "").split(",") if c and not c.startswith("is_host=")]
    args.rdzv_conf = ",".join([*conf, f"is_host={str(is_host).lower()}"])


def host_socket(host: str, port: int) -> socket.socket:
    """The rendezvous store's socket on this node, which hosts it; UsageError naming the port when it is taken."""
    addr = node_address(host) or "0.0.0.0"
    try:
        return listener(addr, port)
    except OSError as err:
        raise UsageError(f"the rendezvous port {port} on {host} ({addr}) cannot be bound ({err.strerror or err}): "
                         "another process holds it; resubmit the job (a new port is drawn), or set RDZV_PORT "
                         "to a free one") from None


def main(argv: list[str]) -> int:
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.errors import record

    args = run.get_args_parser().parse_args(argv)
    try:
        path = os.environ.get(RDZV_FILE_ENV)
        if not path:
            raise UsageError(f"{RDZV_FILE_ENV} is not set: the rendezvous file (slurm/multinode.sbatch sets it)")
        rdzv = rendezvous.read(Path(path))
        log_redaction.install(rdzv.id)
        host = args.rdzv_endpoint.strip()
        is_host = bindable_address(host) is not None
        rendezvous_args(args, rdzv, is_host)
        sock = host_socket(host, rdzv.port) if is_host else None
    except UsageError as err:
        return fail(PROG, str(err))
    handed = [sock] if sock is not None else []
    bind_stores(rdzv.port, lambda: handed.pop() if handed else None,
                node_address(args.local_addr or socket.getfqdn()))
    rendezvous_state.install()
    record(run.run)(args)  # as torchrun's own main: a failed rank's error file is read and reported
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
