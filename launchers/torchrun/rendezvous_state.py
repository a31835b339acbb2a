"""The c10d rendezvous state, read back from the store without running anything a writer put in it.

torchrun's agents keep the rendezvous state (the round, the participants, their heartbeats) pickled under one key
of a TCPStore, and `pickle.loads` it on every sync. A TCPStore has no authentication and lists its keys to any
client, so whoever reaches the store's port could write a state that, unpickled, runs code as the job's owner.
`install()` makes torch's rendezvous handler unpickle with `StateUnpickler`, which builds the state's own
types (and datetimes, sets) and refuses every other global: a forged state can at worst fail the rendezvous
(torch's "the rendezvous state is corrupt"), never run code.
"""

from __future__ import annotations

import io
import pickle
from types import SimpleNamespace
from typing import Any

_DYNAMIC = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
#: every global a rendezvous state pickles (checked against torch's own state in
#: tests/unit/launchers/torchrun/test_trust_rendezvous.py)
ALLOWED = {
    (_DYNAMIC, "_RendezvousState"), (_DYNAMIC, "_NodeDesc"),
    ("datetime", "datetime"), ("datetime", "timezone"), ("datetime", "timedelta"),
    ("builtins", "set"), ("builtins", "frozenset"),
}


class StateUnpickler(pickle.Unpickler):
    """An unpickler that finds only the globals in ALLOWED."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED:
            raise pickle.UnpicklingError(f"the rendezvous state names {module}.{name}, which it never holds")
        return super().find_class(module, name)


def loads(data: bytes) -> Any:
    return StateUnpickler(io.BytesIO(data)).load()


def install() -> None:
    """From now on in this process, torch's rendezvous handler reads its state with `loads` (it writes it as before)."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    dynamic_rendezvous.pickle = SimpleNamespace(  # type: ignore[attr-defined]
        dumps=pickle.dumps, loads=loads, PickleError=pickle.PickleError)
