"""torchrun for one node of a multi-node job, with its stores listening on this node's address only:
`python -m launchers.node_torchrun TORCHRUN_ARGS...` (slurm/multinode.sbatch runs it on every node).

The agent on the rendezvous endpoint's host hosts the c10d rendezvous store; the agent that becomes node rank
0 hosts the store its ranks share (MASTER_PORT, at MASTER_ADDR = `--local-addr`, else the node's fully
qualified name). torch listens on every interface for both. Here the rendezvous store listens on the address
the endpoint's host resolves to, and the shared store on the address MASTER_ADDR resolves to: the addresses
the other nodes reach them at. Where a name does not resolve to one of this machine's addresses, or resolves to
a loopback address (a hosts file's `127.0.1.1 HOSTNAME`, which the other nodes cannot reach), that store is
torch's own. Everything else is torchrun's (launchers/store_binding.py).
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from typing import Optional

from launchers.store_binding import bind_stores
from rrtrain.core.stores import bindable_address, listener

DEFAULT_RDZV_PORT = 29400  # torchrun's, when the endpoint names none


def node_address(name: str) -> Optional[str]:
    """The address `name` resolves to, when it is this machine's and not a loopback address."""
    addr = bindable_address(name)
    return None if addr is None or ipaddress.ip_address(addr).is_loopback else addr


def main(argv: list[str]) -> None:
    from torch.distributed import run
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    args = run.get_args_parser().parse_args(argv)
    host, port = parse_rendezvous_endpoint(args.rdzv_endpoint, default_port=DEFAULT_RDZV_PORT)
    rdzv_addr = node_address(host)

    def rdzv_socket() -> Optional[socket.socket]:
        if rdzv_addr is None:
            return None
        try:
            return listener(rdzv_addr, port)
        except OSError:  # the port is taken: torch's own store fails the same way and says so
            return None

    bind_stores(port, rdzv_socket, node_address(args.local_addr or socket.getfqdn()))
    run.main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
