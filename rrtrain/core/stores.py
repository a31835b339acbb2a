"""TCPStore servers that listen on one address instead of every interface.

A TCPStore server listens on `::` / `0.0.0.0` whatever host it is given: anyone who reaches any of the
machine's interfaces reaches the job's store. Handed a socket that is already bound (`master_listen_fd`), it
listens there only. The launchers bind torchrun's stores this way (launchers/torchrun/store_binding.py: loopback for one
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
    return store_on(listener(addr, port), **kwargs)


def store_on(sock: socket.socket, **kwargs: Any) -> Any:
    """A TCPStore server on the listening socket `sock`, which it owns from here on."""
    import torch.distributed as dist

    addr, port = sock.getsockname()[:2]
    return dist.TCPStore(addr, port, is_master=True, master_listen_fd=sock.detach(), **kwargs)


def serve_env_store(host: str, port: int, timeout_s: float) -> Optional[Any]:
    """Start, before `init_process_group("env://")`, the store that rank 0 would host at MASTER_ADDR:MASTER_PORT,
    listening on that address only. torch's own env:// store is multi-tenant: at the same port in this process it
    serves from this one. None where the address is not this machine's (torch then does
    what it always does). Keep the store referenced as long as the process group. A port that another process
    holds is a UsageError naming it: the other ranks would otherwise meet whoever holds it."""
    addr = bindable_address(host)
    if addr is None:
        return None
    try:
        sock = listener(addr, port)
    except OSError as err:
        from rrtrain.core.errors import UsageError

        raise UsageError(f"MASTER_PORT {port} on {host} ({addr}) cannot be bound ({err.strerror or err}): another "
                         "process holds it; resubmit the job") from None
    return store_on(sock, multi_tenant=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=timeout_s))
