"""`--dist loadgroup` for `make test`, scheduled by rrtrain's own scheduler: every test with the same
`xdist_group` mark runs on one worker, in collection order, without reading groups out of node ids.

pytest-xdist's own loadgroup has each worker append `@group` to its items' node ids and the controller parse it
back; pytest 9.2's structured node ids no longer take that suffix, and the groups silently vanish
(pytest-dev/pytest-xdist#1386). Here the workers tell the controller each test's group through a file (the
controller names its folder in `workerinput`, the channel pytest-xdist gives plugins), and the controller's
scheduler, returned through the public `pytest_xdist_make_scheduler` hook, hands out whole groups. It uses only
what the hook's `Scheduling` protocol and a worker's public methods (`send_runtest_some`, `shutdown`) offer.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import pytest

GROUPS_DIR = "rrtrain_xdist_groups"  # the key in workerinput: the folder the workers write their groups to
LOW_WATER = 2  # a worker holds back its last test until it knows the next: keep two pending where there are


def group_of(item: pytest.Item) -> str:
    """The item's group, as pytest-xdist names it: its `xdist_group` names sorted and joined; its own node id
    when it has none (a group of one)."""
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")})
    return "_".join(names) if names else item.nodeid


def configure_node(config: pytest.Config, node: Any) -> None:
    """Controller: name the folder each worker writes its groups to (one folder per session)."""
    folder = config.stash.get(_FOLDER, None)
    if folder is None:
        folder = tempfile.mkdtemp(prefix="rrtrain-xdist-groups-")
        config.stash[_FOLDER] = folder
    node.workerinput[GROUPS_DIR] = folder


def unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_FOLDER, None)
    if folder is not None:
        for f in Path(folder).iterdir():
            f.unlink()
        os.rmdir(folder)


def write_groups(session: pytest.Session) -> None:
    """Worker: {node id as sent to the controller: group}, written before the collection is sent."""
    workerinput = getattr(session.config, "workerinput", None)
    if not workerinput or GROUPS_DIR not in workerinput:
        return
    path = Path(workerinput[GROUPS_DIR]) / f"{workerinput['workerid']}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({item.nodeid: group_of(item) for item in session.items}))
    os.replace(tmp, path)


_FOLDER = pytest.StashKey[str]()


class GroupScheduling:
    """Whole groups to idle workers, in the order of their first test in the collection."""

    def __init__(self, config: pytest.Config, log: Any) -> None:
        self.config, self.log = config, log
        self.numnodes = sum(int(spec.split("*")[0]) if "*" in spec else 1 for spec in config.getvalue("tx") or ())
        self.pending: dict[Any, list[int]] = {}  # node -> indices sent, not completed
        self.collections: dict[Any, list[str]] = {}
        self.groups: dict[Any, dict[str, str]] = {}
        self.collection: Optional[list[str]] = None
        self.queue: list[list[int]] = []
        self.closed: set[Any] = set()

    # -- the Scheduling protocol ---------------------------------------------------------------------------

    @property
    def nodes(self) -> list[Any]:
        return list(self.pending)

    @property
    def collection_is_completed(self) -> bool:
        return len(self.collections) >= self.numnodes

    @property
    def tests_finished(self) -> bool:
        return (self.collection_is_completed and self.collection is not None and not self.queue
                and not any(self.pending.values()))

    @property
    def has_pending(self) -> bool:
        return bool(self.queue) or any(self.pending.values())

    def add_node(self, node: Any) -> None:
        assert node not in self.pending
        self.pending[node] = []

    def add_node_collection(self, node: Any, collection: Sequence[str]) -> None:
        self.collections[node] = list(collection)
        self.groups[node] = self._read_groups(node)

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        self.pending[node].remove(item_index)
        self._top_up(node)

    def mark_test_pending(self, item: str) -> None:
        raise NotImplementedError("rrtrain's group scheduler does not re-run tests")

    def remove_pending_tests_from_node(self, node: Any, indices: Sequence[int]) -> None:
        raise NotImplementedError("rrtrain's group scheduler does not steal work")

    def remove_node(self, node: Any) -> Optional[str]:
        """A worker that finished (nothing pending: None) or crashed: the test it was running, and the rest of
        what it held back at the front of the queue, still together."""
        left = self.pending.pop(node)
        self.closed.discard(node)
        if not left:
            return None
        assert self.collection is not None
        if left[1:]:
            self.queue.insert(0, left[1:])
        return self.collection[left[0]]

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is None:
            first = next(iter(self.collections.values()))
            if any(c != first for c in self.collections.values()):
                raise RuntimeError("the xdist workers collected different tests; aborting the run")
            self.collection = first
            groups = next((g for g in self.groups.values() if g), {})
            units: dict[str, list[int]] = {}
            for index, nodeid in enumerate(first):
                units.setdefault(groups.get(nodeid, nodeid), []).append(index)
            self.queue = list(units.values())
            self.log(f"{len(self.queue)} groups for {len(self.pending)} workers")
        for node in self.nodes:
            self._top_up(node)

    # -- internals --------------------------------------------------------------------------------------

    def _read_groups(self, node: Any) -> dict[str, str]:
        folder = self.config.stash.get(_FOLDER, None)
        path = Path(folder) / f"{node.gateway.id}.json" if folder is not None else None
        return json.loads(path.read_text()) if path is not None and path.is_file() else {}

    def _top_up(self, node: Any) -> None:
        """Send whole groups until the worker holds LOW_WATER tests; none left: let it finish and end."""
        if self.collection is None or node in self.closed:
            return
        while len(self.pending[node]) < LOW_WATER and self.queue:
            unit = self.queue.pop(0)
            self.pending[node].extend(unit)
            node.send_runtest_some(unit)
        if not self.queue:
            self.closed.add(node)
            node.shutdown()
