"""torchrun on one node with its stores listening on loopback only:
`python -m launchers.torchrun.local --nproc_per_node=N -m rrtrain.train CONFIG`.

`torchrun --standalone` hosts two TCPStores (the c10d rendezvous store and the store its ranks share at
MASTER_PORT), and a TCPStore server listens on every interface (`::` / `0.0.0.0`) whatever host it is given:
anyone on the network could reach a single-node job's stores. This launcher binds the rendezvous store's
socket to 127.0.0.1 itself (a free port, chosen per launch) and has the shared store bound there too
(launchers/torchrun/store_binding.py), then runs torchrun's own `main` with a c10d rendezvous at 127.0.0.1 under a
fresh id and `--local-addr=127.0.0.1`, so every rank reaches the stores over loopback and nothing of them
listens elsewhere. Every user of the machine reaches loopback, so the rendezvous state is read back with
launchers.torchrun.rendezvous_state, which runs nothing a writer put in it. The remaining arguments are torchrun's.
"""

from __future__ import annotations

import sys
import uuid

from launchers.torchrun import rendezvous_state
from launchers.torchrun.store_binding import bind_stores
from rrtrain.core.stores import listener

LOOPBACK = "127.0.0.1"


def torchrun_args(port: int, argv: list[str]) -> list[str]:
    """torchrun's arguments: one node, a c10d rendezvous on 127.0.0.1:port under a fresh id, the ranks
    reaching the shared store at 127.0.0.1 (`--local-addr`), then `argv`."""
    return ["--nnodes=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={LOOPBACK}:{port}",
            f"--rdzv-id={uuid.uuid4().hex}", f"--local-addr={LOOPBACK}", *argv]


def main(argv: list[str]) -> None:
    from torch.distributed import run

    sock = listener(LOOPBACK)  # bound before torchrun starts: its port is the rendezvous endpoint's
    port = sock.getsockname()[1]
    handed = [sock]
    bind_stores(port, lambda: handed.pop() if handed else None, LOOPBACK)
    rendezvous_state.install()  # every user of the machine reaches loopback
    run.main(torchrun_args(port, argv))


if __name__ == "__main__":
    main(sys.argv[1:])
