"""torchrun's two stores on sockets bound here, so that neither listens on every interface.

A torchrun agent may host two TCPStores: the c10d rendezvous store (the agent on the endpoint's host) and the
store its ranks share at MASTER_PORT (the agent that becomes node rank 0). torch creates both listening on `::`
/ `0.0.0.0`. `bind_stores` makes the agent create them on sockets bound to chosen addresses instead
(`TCPStore(master_listen_fd=...)`, rrtrain.core.stores); where no address is given, torch's own store stays.
Used by launchers.torchrun.local (one node: loopback) and launchers.torchrun.node (one node of several: the
node's own address).
"""

from __future__ import annotations

import socket
from typing import Any, Callable, Optional

from rrtrain.core.stores import bound_store


def bind_stores(rdzv_port: int, rdzv_socket: Callable[[], Optional[socket.socket]],
                shared_addr: Optional[str]) -> None:
    """From now on in this process, torchrun's rendezvous store at `rdzv_port` listens on the socket
    `rdzv_socket()` gives when the agent hosts it (None: torch's own), and the store the ranks share on
    `shared_addr` at a free port (None: torch's own)."""
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as backend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    real = backend.TCPStore

    def rendezvous_store(host: str, port: int, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("is_master") and port == rdzv_port and "master_listen_fd" not in kwargs:
            sock = rdzv_socket()
            if sock is not None:
                kwargs["master_listen_fd"] = sock.detach()  # the store owns the socket from here on
        return real(host, port, *args, **kwargs)

    backend.TCPStore = rendezvous_store  # type: ignore[assignment, misc]
    if shared_addr is not None:
        def shared_store(self: Any, master_addr: str, master_port: Optional[int]) -> Any:
            return bound_store(shared_addr, 0 if master_port is None else int(master_port), multi_tenant=True)

        DynamicRendezvousHandler._create_tcp_store_server = shared_store  # type: ignore[method-assign]
