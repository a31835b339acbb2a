"""TCPStore servers that listen on one address instead of every interface.

A TCPStore server listens on `::` / `0.0.0.0` whatever host it is given: anyone who reaches any of the
machine's interfaces reaches the job's store. Handed a socket that is already bound (`master_listen_fd`), it
listens there only. The launchers bind torchrun's stores this way (launchers/store_binding.py: loopback for one
node, the node's own address across nodes), and `rrtrain.core.dist` binds rank 0's store under an env://
launcher without torchrun's agent (submitit's srun tasks).
"""

from __future__ import annotations

import datetime
import socket
from typing import Any, Optional


def bindable_address(host: str) -> Optional[str]:
    """The IPv4 address `host` resolves to, when it is one of this machine's (a socket can bind it); else None."""
    try:
        addr = socket.gethostbyname(host)
    except OSError:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((addr, 0))
        except OSError:
            return None
    return addr


def listener(addr: str, port: int = 0) -> socket.socket:
    """A listening TCP socket on `addr` (at `port`, or one the kernel chose, free by construction). SO_REUSEADDR,
    as torch's own store sets it: a requeued job takes its fixed port again while the last attempt's
    connections linger in TIME_WAIT."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


def bound_store(addr: str, port: int = 0, **kwargs: Any) -> Any:
    """A TCPStore server listening on `addr` only (at `port`, or a free one), on a socket bound here."""
    import torch.distributed as dist

    sock = listener(addr, port)
    return dist.TCPStore(addr, sock.getsockname()[1], is_master=True,
                         master_listen_fd=sock.detach(), **kwargs)  # the store owns the socket from here on


def serve_env_store(host: str, port: int, timeout_s: float) -> Optional[Any]:
    """Start, before `init_process_group("env://")`, the store that rank 0 would host at MASTER_ADDR:MASTER_PORT,
    listening on that address only. torch's own env:// store is multi-tenant: at the same port in this process it
    serves from this one. None where the address is not this machine's or the port is taken (torch then does
    what it always does, and says so if it fails). Keep the store referenced as long as the process group."""
    addr = bindable_address(host)
    if addr is None:
        return None
    try:
        return bound_store(addr, port, multi_tenant=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=timeout_s))
    except OSError:
        return None
