"""Which rank is gone: heartbeats through the rendezvous store, so a survivor can name the missing rank.

Under torchrun a dead rank takes the whole group down. Under srun or submitit (one plain process per rank)
nothing does: the survivors block in their next collective until it fails (gloo: a reset connection, or the
collective timeout) or forever (NCCL with a peer that hung). Every rank therefore runs a daemon thread that
bumps its counter in the c10d store (its own client connection, MASTER_ADDR:MASTER_PORT) every
`interval` seconds and watches the others'. The trainer asks `lost()` when a collective fails; and when the
main thread is stuck, the thread itself ends the process once a peer has been silent for `timeout_s`, or for
`grace` once the process is being stopped (`stopping()`: Slurm ending the job of a node it declared down sends
SIGTERM, then SIGKILL KillWait seconds later, and a stop cannot save collectively without the silent peer).
Rank 0's process hosts the store when no launcher does: a store that stops answering means rank 0 is gone.
Silence is counted only over time this process ran: a job suspended whole (SIGSTOP to its tasks: `scontrol
suspend`, gang scheduling, a debugger) stops every rank's beat, and the first rank to run again must not take
its peers, not yet resumed, for dead.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import threading
import time
from typing import Callable, Optional

import torch.distributed as dist

from rrtrain.core.dist import DistInfo

PREFIX = "rrtrain/heartbeat/"
HOST_PREFIX = "rrtrain/host/"  # each rank's hostname, set once: a lost rank is named with its host
DONE = "done"


class PeerWatch:
    def __init__(self, info: DistInfo, timeout_s: float, on_lost: Optional[Callable[[str], None]] = None,
                 stopping: Callable[[], bool] = lambda: False) -> None:
        self.info, self.timeout_s, self.on_lost, self.stopping = info, float(timeout_s), on_lost, stopping
        self.interval = max(0.5, min(5.0, self.timeout_s / 10))
        self.addr, self.port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        self.store = dist.TCPStore(self.addr, self.port, is_master=False,
                                   timeout=datetime.timedelta(seconds=max(2.0, 2 * self.interval)),
                                   wait_for_workers=False)
        self.peers = [r for r in range(info.world_size) if r != info.rank]
        now = time.monotonic()
        self.seen: dict[int, tuple[str, float]] = {r: ("", now) for r in self.peers}  # value, when it last changed
        self.hosts: dict[int, str] = {}  # peers' hostnames, read once each
        self.store_lost_at: Optional[float] = None
        self.polled_at: Optional[float] = None  # when this thread's last round ended
        self.beats = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._ended = False
        self.thread = threading.Thread(target=self._run, name="rrtrain-peer-watch", daemon=True)

    @classmethod
    def start(cls, info: DistInfo, timeout_s: float, on_lost: Optional[Callable[[str], None]] = None,
              stopping: Callable[[], bool] = lambda: False) -> Optional["PeerWatch"]:
        """A running watch when this process is one rank of several (None otherwise)."""
        if info.world_size < 2 or not dist.is_initialized() or "MASTER_ADDR" not in os.environ:
            return None
        try:
            watch = cls(info, timeout_s, on_lost, stopping)
            watch.store.set(f"{HOST_PREFIX}{info.rank}", socket.gethostname())
            watch.beat()
        except Exception as err:  # no store to reach: train on, only without naming lost ranks
            print(f"rrtrain: warning: no heartbeat through the rendezvous store ({str(err).splitlines()[0]}); "
                  "a lost rank will not be named", file=sys.stderr, flush=True)
            return None
        watch.thread.start()
        return watch

    # -- the thread ---------------------------------------------------------------------------

    def beat(self, value: Optional[str] = None) -> None:
        self.beats += 1
        self.store.set(f"{PREFIX}{self.info.rank}", value or str(self.beats))

    def store_answers(self) -> bool:
        """A plain connection to the store's port: cheaper than a failing store call, which logs a C++ stack."""
        try:
            with socket.create_connection((self.addr, self.port), timeout=max(1.0, self.interval)):
                return True
        except OSError:
            return False

    def _forgive_pause(self, now: float) -> None:
        """When this process did not run for a while since its last round (the thread's wait is `interval`), the
        time in between counts as no peer's silence: the peers were most likely suspended with it."""
        if self.polled_at is None or now - self.polled_at <= 1.5 * self.interval + 1.0:
            return
        with self._lock:
            self.seen = {r: (value, now) for r, (value, _) in self.seen.items()}
            if self.store_lost_at is not None:
                self.store_lost_at = now

    def poll(self) -> None:
        """One round: publish this rank's beat, read the others'."""
        self._forgive_pause(time.monotonic())
        try:
            self._poll()
        finally:
            self.polled_at = time.monotonic()

    def _poll(self) -> None:
        try:
            if not self.store_answers():
                raise ConnectionError("the store does not answer")
            self.beat()
            keys = [f"{PREFIX}{r}" for r in self.peers]
            present = [r for r, k in zip(self.peers, keys) if self.store.check([k])]
            values = self.store.multi_get([f"{PREFIX}{r}" for r in present]) if present else []
            for r in present:
                if r not in self.hosts and self.store.check([f"{HOST_PREFIX}{r}"]):
                    host = self.store.get(f"{HOST_PREFIX}{r}")
                    self.hosts[r] = host.decode() if isinstance(host, bytes) else str(host)
            self.store_lost_at = None
        except Exception:  # the store does not answer: the process hosting it is gone
            if self.store_lost_at is None:
                self.store_lost_at = time.monotonic()
            return
        now = time.monotonic()
        with self._lock:
            for r, v in zip(present, values):
                text = v.decode() if isinstance(v, bytes) else str(v)
                if text != self.seen[r][0]:
                    self.seen[r] = (text, now)

    def silent(self, for_s: float) -> list[int]:
        """Ranks not heard from for `for_s` seconds (rank 0 when the store it hosts has been gone that long)."""
        now = time.monotonic()
        if self.store_lost_at is not None and now - self.store_lost_at >= for_s:
            return [0] if self.info.rank != 0 else []
        with self._lock:
            return [r for r, (v, t) in self.seen.items() if v != DONE and now - t >= for_s]

    @property
    def grace(self) -> float:
        """How long a rank that died takes to fall silent: a few missed beats."""
        return 3 * self.interval + 1.0

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()
            quiet = self.grace if self.stopping() else self.timeout_s
            gone = self.silent(quiet)
            if gone and not self._stop.is_set():
                self._end(self.message(gone, quiet))

    def _end(self, message: str) -> None:
        """The main thread is stuck waiting for a rank that is gone: say so and end this process."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
        print(f"rrtrain train: error: {message}", file=sys.stderr, flush=True)
        if self.on_lost is not None:
            try:
                self.on_lost(message)
            except Exception:
                pass
        os._exit(1)

    # -- the main thread ----------------------------------------------------------------------

    def message(self, gone: list[int], quiet_s: float) -> str:
        who = ", ".join(str(r) for r in gone)
        s = "s" if len(gone) > 1 else ""
        how = ("its rendezvous store stopped answering" if gone == [0] and self.store_lost_at is not None
               else f"no heartbeat for {quiet_s:.0f} s")
        where = "; ".join(f"rank {r} ran on {self.hosts[r]}" for r in gone if r in self.hosts)
        return (f"rank{s} {who} of {self.info.world_size} stopped responding ({how}; the process died or hung"
                f"{'; ' + where if where else ''}); rank {self.info.rank} is ending the run")

    def lost(self, give_up: Callable[[], bool] = lambda: False) -> Optional[str]:
        """After a failed collective: the message naming the silent ranks, or None if all still beat.
        Waits a few heartbeats for a dead rank to fall silent, unless `give_up()` says the process is being
        stopped (Slurm ending a job whose node it declared down: SIGTERM, then SIGKILL KillWait seconds later),
        so that final.json is written, with the collective's own error, before the kill. From here the main
        thread ends the run: the watch's thread no longer does."""
        with self._lock:
            self._ended = True
        grace = self.grace
        deadline = time.monotonic() + 1.5 * grace + 2 * self.interval
        while time.monotonic() < deadline and not give_up():
            gone = self.silent(grace)
            if gone:
                return self.message(gone, grace)
            time.sleep(self.interval / 2)
        return None

    def stop(self) -> None:
        """The run ended on this rank: stop watching and tell the others this silence is not a loss."""
        with self._lock:
            self._ended = True
        self._stop.set()
        self.thread.join(timeout=2 * self.interval + 5)
        try:
            self.beat(DONE)
        except Exception:
            pass


def is_comm_error(err: BaseException) -> bool:
    """A failed or timed-out collective (gloo / NCCL), as opposed to an error of the run itself."""
    if isinstance(err, dist.DistError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and any(
        s in text for s in ("gloo", "NCCL", "Connection reset", "Connection closed", "Timed out", "timed out"))
