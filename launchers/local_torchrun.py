"""torchrun on one node with its stores listening on loopback only:
`python -m launchers.local_torchrun --nproc_per_node=N -m rrtrain.train CONFIG`.

`torchrun --standalone` hosts two TCPStores (the c10d rendezvous store and the store its ranks share at
MASTER_PORT), and a TCPStore server listens on every interface (`::` / `0.0.0.0`) whatever host it is given:
anyone on the network could reach a single-node job's stores. This launcher binds each store's socket to
127.0.0.1 itself (a free port, chosen per launch) and hands it over as the store's listening socket
(`TCPStore(master_listen_fd=...)`), then runs torchrun's own `main` with a c10d rendezvous at 127.0.0.1 under
a fresh id and `--local-addr=127.0.0.1`, so every rank reaches the stores over loopback and nothing of them
listens elsewhere. The remaining arguments are torchrun's.
"""

from __future__ import annotations

import socket
import sys
import uuid
from typing import Any


def loopback_listener(port: int = 0) -> socket.socket:
    """A listening TCP socket on 127.0.0.1 (at a port the kernel chose, free by construction, unless given)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", port))
    sock.listen(1024)
    return sock


def loopback_store(port: int = 0, **kwargs: Any) -> Any:
    """A TCPStore server listening on 127.0.0.1 only (at `port`, or a free one), on a socket bound here."""
    import torch.distributed as dist

    sock = loopback_listener(port)
    kwargs.pop("master_listen_fd", None)
    return dist.TCPStore("127.0.0.1", sock.getsockname()[1], is_master=True,
                         master_listen_fd=sock.detach(), **kwargs)  # the store owns the socket from here on


def serve_stores_on_loopback(rdzv: socket.socket) -> None:
    """Make torchrun host both of its stores on loopback: the c10d rendezvous store on `rdzv` (bound by the
    caller, whose port the rendezvous endpoint names) and the store the ranks share (`MASTER_PORT`), which
    the rendezvous handler creates on a port of its choosing."""
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as backend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    real = backend.TCPStore
    port = rdzv.getsockname()[1]
    handed: list[bool] = []

    def rendezvous_store(host: str, port_: int, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("is_master") and port_ == port and not handed:
            handed.append(True)
            kwargs["master_listen_fd"] = rdzv.detach()
        return real(host, port_, *args, **kwargs)

    def shared_store(self: Any, master_addr: str, master_port: int) -> Any:
        return loopback_store(0 if master_port is None else int(master_port), multi_tenant=True)

    backend.TCPStore = rendezvous_store  # type: ignore[assignment, misc]
    DynamicRendezvousHandler._create_tcp_store_server = shared_store  # type: ignore[method-assign]


def torchrun_args(port: int, argv: list[str]) -> list[str]:
    """torchrun's arguments: one node, a c10d rendezvous on 127.0.0.1:port under a fresh id, the ranks
    reaching the shared store at 127.0.0.1 (`--local-addr`), then `argv`."""
    return ["--nnodes=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id={uuid.uuid4().hex}", "--local-addr=127.0.0.1", *argv]


def main(argv: list[str]) -> None:
    from torch.distributed import run

    sock = loopback_listener()
    port = sock.getsockname()[1]
    serve_stores_on_loopback(sock)
    run.main(torchrun_args(port, argv))


if __name__ == "__main__":
    main(sys.argv[1:])
