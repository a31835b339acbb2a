"""Checkpoints: model + optimizer through the engine (DCP, or DeepSpeed's own), plus the training state.

Layout: RUN/checkpoints/step_00000100/{state/, train_state.json, rng_rank{r}.pt}, written into a hidden
`.tmp_*` directory and renamed when complete; `RUN/checkpoints/latest` names the newest one and is updated
last, so a crash at any point leaves the previous checkpoint usable. The last `keep` are kept.

Where: `RUN/checkpoints` is resolved once, when the manager is made (a link the user made to scratch space is
followed then, and only then): every later save, and the pruning of old checkpoints, uses that directory even
when the link is changed meanwhile. It must be the user's alone (`files.check_private_path`). Below it no link is
followed: a `step_*` link is not a checkpoint. `rrtrain eval`, `rrtrain export` and a warm start read a run's
checkpoints through this manager too, so they follow the same link under the same check. A directory a
save made is marked under the durable key in `checkpoints/.rrtrain-key` (`files.directory_key`), so a later
invocation of the same run may prune it; a directory whose marker does not prove that is kept and named in a
one-line warning, never deleted.

Integrity: `train_state.json` records the length and xxh64 of every other file of its checkpoint (hashed by
the ranks in turn before the rename). Resume takes the newest checkpoint whose files all match, and warns,
naming the file and the fault, for each newer one it passes over; it never starts afresh while checkpoints
exist. RNG state is stored as tensors and plain numbers and read with `torch.load(weights_only=True)`; the
train state is JSON. Two readers below still unpickle, and both run only after the checksums passed: DCP's
`.metadata` (torch reads it with `pickle.load`) and DeepSpeed's loader (rrtrain/parallel/deepspeed.py).
A write that fails (a full disk) removes its partial files and ends the run with `RunError`; the
previous checkpoint stays as it was.

Asynchronous saves (`train.ckpt_async`, DCP's `async_save`): `start` writes the RNG files, copies the model and
optimizer state into CPU memory (so later steps cannot change what is written) and hands the write to a
background thread, which then hashes this rank's share of the files. `finish` publishes (train_state.json with
the checksums, the rename, `latest`) only once the write has completed on every rank; the caller decides when
(`writing()` all-reduced at a step boundary, or before the next save, the end of the run or a signal). At
most one save is in flight; until it is published it is a hidden `.tmp_*` directory that no resume reads.
"""

from __future__ import annotations

import copy
import datetime
import errno
import os
import pickle
import random
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Optional

import numpy as np
import torch
from torch.distributed.checkpoint.api import CheckpointException

from rrtrain.config import resume_rule
from rrtrain.config_load import dotted_keys
from rrtrain.core import dist
from rrtrain.core import files as rrfiles
from rrtrain.core.dist import DistInfo
from rrtrain.core.errors import RunError, UsageError
from rrtrain.core.io import atomic_write_json, atomic_write_text, replace_dir
from rrtrain.data.verify import file_digest
from rrtrain.rundir import train_state as train_state_file

TRAIN_STATE = "train_state.json"
HASH = "xxh64"


def rng_state() -> dict[str, Any]:
    """This process's RNG states as tensors and plain numbers (loadable with weights_only=True)."""
    version, py_state, gauss = random.getstate()
    _, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python_version": version, "python": torch.tensor(py_state, dtype=torch.int64), "python_gauss": gauss,
        "numpy": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "numpy_pos": int(pos),
        "numpy_has_gauss": int(has_gauss), "numpy_gauss": float(cached), "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate((state["python_version"], tuple(state["python"].tolist()), state["python_gauss"]))
    np.random.set_state(("MT19937", state["numpy"].numpy().astype(np.uint32), state["numpy_pos"],
                         state["numpy_has_gauss"], state["numpy_gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def checksum_files(root: Path, rank: int, world: int) -> dict[str, dict[str, Any]]:
    """Length and xxh64 of this rank's share (every world-th, in sorted order) of the files under root."""
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): {"bytes": p.stat().st_size, HASH: file_digest(str(p), HASH)}
            for p in files[rank::world]}


def file_problems(root: Path, recorded: dict[str, dict[str, Any]], rank: int, world: int) -> list[str]:
    """What is wrong with this rank's share of a checkpoint's recorded files (empty: they all match)."""
    problems = []
    for rel in sorted(recorded)[rank::world]:
        want, path = recorded[rel], root / rel
        if not path.is_file():
            problems.append(f"{rel} is missing")
        elif path.stat().st_size != want["bytes"]:
            problems.append(f"{rel} is {path.stat().st_size} bytes, {want['bytes']} were written")
        elif file_digest(str(path), HASH) != want[HASH]:
            problems.append(f"{rel} does not match its {HASH} checksum")
    return problems


def manifest_problem(recorded: Any) -> Optional[str]:
    """What is wrong with the shape of a `files` manifest (None: a mapping of relative paths inside the
    checkpoint to {"bytes": int, "xxh64": str})."""
    if not isinstance(recorded, dict):
        return f"'files' is a {type(recorded).__name__}, not a mapping"
    for rel, want in recorded.items():
        inside = isinstance(rel, str) and rel and not rel.startswith("/") and ".." not in Path(rel).parts
        if not inside:
            return f"'files' names {rel!r}, not a path inside the checkpoint"
        if not (isinstance(want, dict) and type(want.get("bytes")) is int and isinstance(want.get(HASH), str)):
            return f"'files'[{rel!r}] is not {{bytes, {HASH}}}"
    return None


def unrecorded_files(root: Path, recorded: dict[str, Any]) -> list[str]:
    """Files of a checkpoint that its manifest does not name (added after it was written), besides the
    train state itself."""
    on_disk = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()}
    return sorted(on_disk - set(recorded) - {TRAIN_STATE})


#: a filesystem with less free space than this, just after a write failed, failed for lack of space
NEARLY_FULL_BYTES = 64 << 20


def is_disk_full(err: BaseException, where: Optional[Path] = None) -> bool:
    """Whether a write failed for lack of space: ENOSPC / EDQUOT anywhere in the error (DCP's
    CheckpointException wraps each rank's error), or, since torch's zip writer reports a short write as
    "unexpected pos" with no errno, a failed write where the filesystem of `where` is now nearly full."""
    seen: list[BaseException] = [err]
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict):
        for f in failures.values():
            f = f[0] if isinstance(f, tuple) and f else f
            if isinstance(f, BaseException):
                seen.append(f)
    for e in seen:
        cause: Optional[BaseException] = e
        while cause is not None:
            if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
                return True
            cause = cause.__cause__ or cause.__context__
    if "No space left on device" in str(err) or "Disk quota exceeded" in str(err):
        return True
    if where is None:
        return False
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        st = os.statvfs(probe)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < NEARLY_FULL_BYTES


@dataclass
class Published:
    """A checkpoint that `latest` now names, and what it cost the training loop."""

    step: int
    path: Path
    blocking_s: float  # time the loop spent in this save: all of it (sync), or starting + publishing (async)
    write_s: float  # from the start of the save until its files were written and hashed (on this rank)


@dataclass
class InFlight:
    """An asynchronous save started and not yet published."""

    step: int
    tmp: Path
    final: Path
    train_state: dict  # as it was when the save started
    job: Future  # this rank: DCP's write, then the checksums of this rank's share -> (files, finished_at)
    started: float  # time.perf_counter() at the start
    blocking_s: float  # what starting it cost the loop


class CheckpointManager:
    def __init__(self, run_dir: Path, keep: int, info: DistInfo, asynchronous: bool = False,
                 timeout_s: int = 600, allow_unverified: bool = False) -> None:
        self.root = _resolved_once(Path(run_dir) / "checkpoints")
        dist.raise_together(rrfiles.private_path_refusal(self.root) if info.is_main else None)
        self._key: Optional[bytes] = None  # the durable key of `root` (rank 0, once it is needed)
        self._reported: set[str] = set()  # directories already said to be kept (one warning each)
        self.allow_unverified = allow_unverified  # train.allow_unverified_checkpoint: accept one without a manifest
        self.keep, self.info = keep, info
        self.passed_over: list[str] = []  # warnings of the last latest(): newer checkpoints not usable
        self.in_flight: Optional[InFlight] = None
        self._pg = None  # the background write's process group (a collective to create: every rank, once)
        self._hasher: Optional[ThreadPoolExecutor] = None
        if asynchronous:
            # DCP's background thread runs its own collectives (plans, metadata). On the training group they
            # would interleave with the loop's; a separate gloo group keeps them apart, and gloo is what DCP's
            # async save needs beside NCCL too (it refuses a group without a CPU backend).
            if torch.distributed.is_initialized():
                self._pg = torch.distributed.new_group(backend="gloo",
                                                       timeout=datetime.timedelta(seconds=timeout_s))
            self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rrtrain-ckpt")

    def complete(self) -> list[Path]:
        """Renamed (hence complete when written) checkpoint directories, newest first; a link named like one is
        not one (a link is followed at `checkpoints/` alone)."""
        if not self.root.is_dir():
            return []
        return sorted((p for p in self.root.glob("step_*") if p.is_dir() and not p.is_symlink()), reverse=True)

    def problem(self, path: Path) -> Optional[str]:
        """Collective. What is wrong with a checkpoint, checked by all ranks in turn (None: usable)."""
        try:
            state = self.read_train_state(path)
        except (OSError, ValueError) as err:
            return f"{TRAIN_STATE} is unreadable ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
        if not isinstance(state, dict):
            return f"{TRAIN_STATE} is a JSON {type(state).__name__}, not an object"
        recorded = state.get("files")
        if recorded is None:
            if self.allow_unverified:  # the user's word (train.allow_unverified_checkpoint): nothing to check against
                return None
            return (f"{TRAIN_STATE} records no files manifest (written by an older rrtrain, or edited), so its files "
                    "cannot be checked; set train.allow_unverified_checkpoint=true to load it unchecked")
        malformed = manifest_problem(recorded)
        if malformed:
            return f"{TRAIN_STATE}: {malformed}"
        mine = file_problems(path, recorded, self.info.rank, self.info.world_size)
        if self.info.is_main:
            mine += [f"{rel} is not in the manifest" for rel in unrecorded_files(path, recorded)]
        found = [p for ps in dist.gather_objects(mine) for p in ps]
        return "; ".join(found) if found else None

    def latest(self) -> Optional[Path]:
        """Collective. The newest checkpoint whose files match their checksums; warns about newer ones passed
        over; None only when there is none at all; UsageError when there are some and none is usable."""
        self.passed_over = []
        for path in self.complete():
            problem = self.problem(path)
            if problem is None:
                if self.passed_over and self.info.is_main:
                    for line in self.passed_over:
                        print(f"rrtrain: warning: {line}; resuming from {path.name}", file=sys.stderr, flush=True)
                return path
            self.passed_over.append(f"checkpoint {path.name} is unusable: {problem}")
        if self.passed_over:
            raise UsageError(f"no usable checkpoint in {self.root} ({'; '.join(self.passed_over)}); "
                             "move the checkpoints away to start the run afresh")
        return None

    def save(self, engine, step: int, train_state: dict) -> Published:
        """Collective. A checkpoint of this step, written and published before it returns.
        When any rank's write fails for lack of space, the partial checkpoint is removed and every rank raises
        RunError. Call `finish` first when a save is in flight."""
        self._idle()
        started = time.perf_counter()
        tmp, final = self._paths(step)
        failure = self._prepare(tmp, final)
        if failure is None:
            failure = _first(_space_failure(lambda: engine.save(tmp / "state"), tmp))
        files = checksum_files(tmp, self.info.rank, self.info.world_size) if failure is None else {}
        self._conclude(tmp, final, train_state, files, failure)
        spent = time.perf_counter() - started
        return Published(step, final, blocking_s=spent, write_s=spent)

    def start(self, engine, step: int, train_state: dict) -> None:
        """Collective. Starts an asynchronous save of this step: RNG files now, the model and optimizer state
        copied to CPU memory now and written in the background; `finish` publishes it. Call `finish` first
        when one is in flight (at most one is)."""
        self._idle()
        if self._hasher is None:
            raise RuntimeError("this CheckpointManager was made for synchronous saves only")
        started = time.perf_counter()
        tmp, final = self._paths(step)
        failure = self._prepare(tmp, final)
        if failure is not None:
            self._give_up(tmp, final, failure)
        write = engine.save_async(tmp / "state", self._pg)  # returns once the state is copied
        job = self._hasher.submit(self._hash_when_written, write, tmp)
        self.in_flight = InFlight(step, tmp, final, copy.deepcopy(train_state), job, started,
                                  blocking_s=time.perf_counter() - started)

    def writing(self) -> bool:
        """Whether this rank is still writing (or hashing) the save in flight. Local: all-reduce it to learn
        whether every rank has finished."""
        return self.in_flight is not None and not self.in_flight.job.done()

    def finish(self) -> Optional[Published]:
        """Collective. Waits for the save in flight (if any) to be written on every rank, then publishes it.
        A background write that failed for lack of space ends like a synchronous one: RunError, its partial
        files removed, the previous checkpoint intact."""
        pending, self.in_flight = self.in_flight, None
        if pending is None:
            return None
        waited = time.perf_counter()
        files, written, failure = {}, waited, None
        try:
            files, written = pending.job.result()
        except (Exception, CheckpointException) as err:
            failure = _space_message(err, pending.tmp)
        failure = _first(failure)
        self._conclude(pending.tmp, pending.final, pending.train_state, files, failure)
        return Published(pending.step, pending.final, blocking_s=pending.blocking_s + time.perf_counter() - waited,
                         write_s=written - pending.started)

    def _hash_when_written(self, write: Future, tmp: Path) -> tuple[dict[str, dict[str, Any]], float]:
        """Background: wait for DCP's write (it ends with a collective, so every rank's files are complete when
        it returns), then hash this rank's share of the checkpoint's files."""
        write.result()
        return checksum_files(tmp, self.info.rank, self.info.world_size), time.perf_counter()

    def _idle(self) -> None:
        if self.in_flight is not None:  # at most one save in flight: a new one first publishes the last
            raise RuntimeError(f"the save of step {self.in_flight.step} is still in flight: finish it first")

    def _paths(self, step: int) -> tuple[Path, Path]:
        name = f"step_{step:08d}"
        return self.root / f".tmp_{name}", self.root / name

    def key(self) -> bytes:
        """Rank 0: the durable key of the checkpoint directory (made, `files.dir_mode()`, when missing)."""
        if self._key is None:
            rrfiles.make_dirs(self.root)
            self._key = rrfiles.directory_key(self.root)
        return self._key

    def _discard(self, path: Path) -> None:
        """Rank 0: delete a directory of the checkpoint directory when its marker proves a save of this run
        made it there; otherwise keep it and say so, once."""
        try:
            key = self.key()
        except OSError:  # no key to be had (a full disk): nothing was made under it, nothing is proven
            return
        why = rrfiles.discard_made_dir(path, key=key)
        if why is not None and os.path.lexists(path) and str(path) not in self._reported:
            self._reported.add(str(path))
            print(f"rrtrain: warning: kept {why}; delete it yourself when it is not needed", file=sys.stderr,
                  flush=True)

    def _prepare(self, tmp: Path, final: Path) -> Optional[str]:
        """Collective: rank 0 makes the hidden directory, then every rank writes its RNG state into it; the
        failure (lack of space) of the lowest rank that had one, on every rank."""
        made = _space_failure(lambda: _fresh_dir(tmp, self.key(), final), tmp) if self.info.is_main else None
        failure = _first(made)
        if failure is None:
            rng_file = tmp / f"rng_rank{self.info.rank}.pt"
            failure = _first(_space_failure(lambda: torch.save(rng_state(), rng_file), tmp))
        return failure

    def _conclude(self, tmp: Path, final: Path, train_state: dict, files: dict[str, Any],
                  failure: Optional[str]) -> None:
        """Collective: publish a written checkpoint given every rank's share of its checksums, or give up on it."""
        if failure is None:
            every: dict[str, Any] = {}
            for part in dist.gather_objects(files):
                every.update(part)
            state = {**train_state, "files": every}
            failure = _first(_space_failure(lambda: self._publish(tmp, final, state), tmp)
                             if self.info.is_main else None)
        if failure:
            self._give_up(tmp, final, failure)
        dist.barrier()

    def _give_up(self, tmp: Path, final: Path, failure: str) -> NoReturn:
        if self.info.is_main:
            self._discard(tmp)  # made by _fresh_dir, marked
        previous = next((p.name for p in self.complete() if p != final), None)
        raise RunError(f"no space left on the device while writing checkpoint {final.name} under {self.root} "
                       f"({failure}); its partial files were removed"
                       + (f" and {previous} is intact" if previous else "")
                       + ": free space and start the run again to resume")

    def _publish(self, tmp: Path, final: Path, train_state: dict) -> None:
        """Rank 0: the train state (with the checksums) into the hidden directory, then the rename, then `latest`."""
        rrfiles.set_private_modes(tmp)  # DCP, DeepSpeed and torch.save chose their own modes: the user's alone
        atomic_write_json(tmp / TRAIN_STATE, train_state_file.encode(train_state))
        replace_dir(tmp, final, key=self.key())  # one of this step already there: deleted once this one is in
        atomic_write_text(self.root / "latest", final.name + "\n")
        self._prune()

    def _prune(self) -> None:
        done = sorted(self.complete())
        for old in done[: max(0, len(done) - self.keep)]:
            self._discard(old)  # only a checkpoint a save of this run made there: never a planted or moved one
        for stale in self.root.glob(".tmp_*"):
            self._discard(stale)

    @staticmethod
    def read_train_state(path: Path) -> dict:
        """Checked field by field (`rrtrain.rundir.train_state`): a bad one is a ValueError naming it."""
        return train_state_file.read(path / TRAIN_STATE)

    def load(self, engine, path: Path) -> None:
        """Collective. Restores model, optimizer and this rank's RNG."""
        engine.load(path / "state")
        rng_file = path / f"rng_rank{self.info.rank}.pt"
        if rng_file.exists():
            from rrtrain.parallel.safe_load import DAMAGE, damaged

            try:
                with rrfiles.open_regular(rng_file) as fh:  # by the layer: a FIFO or a link there is one line
                    state = torch.load(fh, weights_only=True)
            except pickle.UnpicklingError as err:
                raise UsageError(f"checkpoint {path.name}: {rng_file.name} is not plain tensors and numbers (written by "
                                 "an older rrtrain, which pickled its RNG state); refusing to unpickle it") from err
            except (OSError, *DAMAGE) as err:
                raise damaged(rng_file, err) from None
            set_rng_state(state)


def _resolved_once(root: Path) -> Path:
    """`root` with a link at its own name followed now, once: the directory every later save and prune uses."""
    return Path(os.path.realpath(root)) if root.is_symlink() else root


def _fresh_dir(path: Path, key: bytes, final: Path) -> None:
    """The hidden directory a save writes into, new and marked under the run's durable `key` for its own place
    and `final`, where it is renamed to (so that pruning may delete it later; marked before its files are
    hashed, the marker among them); a leftover of a killed save is deleted first when its marker proves a save
    of this run made it, else refused in one line."""
    why = rrfiles.discard_made_dir(path, key=key)
    if why is not None:
        raise UsageError(f"{why}: move it out of the checkpoint directory and start the run again")
    rrfiles.make_dir(path, key=key, places=[final])


def _space_failure(action, where: Path) -> Optional[str]:  # noqa: ANN001 - a thunk
    """Run `action`; the first line of its error when it fails for lack of space (other errors propagate)."""
    try:
        action()
    except (Exception, CheckpointException) as err:
        return _space_message(err, where)
    return None


def _space_message(err: BaseException, where: Path) -> str:
    """The first line of a write's error when it failed for lack of space; re-raises any other error."""
    if not is_disk_full(err, where):
        raise err
    inner = [f[0] if isinstance(f, tuple) else f for f in (getattr(err, "failures", None) or {}).values()]
    return next((str(e).splitlines()[0] for e in [*inner, err] if str(e).strip()), type(err).__name__)


def _first(failure: Optional[str]) -> Optional[str]:
    """Collective: the lowest rank's failure, on every rank (None when no rank failed)."""
    return next((f for f in dist.gather_objects(failure) if f), None)


# ---------------------------------------------------------------------------------------------
# Which configuration changes a resume accepts

#: Each key's rule is written on its field in rrtrain/config.py (`field(metadata=...)`, read by `resume_rule`):
#: free (never changes a step: cadences, observers such as callbacks, the monitor, W&B and downstream
#: evaluation), layout (the parallel layout: step s takes the same samples at any layout, since the loader's
#: order depends on the global batch only, and DCP reshards the saved state exactly, so only the reductions'
#: rounding differs; DeepSpeed refuses a changed world size when it loads its own checkpoint), consent (the
#: default: the trajectory changes) or never (the saved state cannot be loaded: model, matching, data, seed,
#: backend). The world size is not a config key; it is a layout change.
WORLD_SIZE = "world_size"


def _rule(key: str) -> str:
    return "layout" if key == WORLD_SIZE else resume_rule(key)


def _without_other_rules_knobs(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's keys less the `model.residual` knobs of rules this run does not use: a checkpoint written
    before each rule owned its knobs recorded every registered rule's, and the run resumes as it was. The current
    config holds every knob of its own rules (`resolve`), so a knob missing there is another rule's; a key that no
    rule has stays, and is refused as a change of the model."""
    from rrtrain import residuals

    knobs = {name for rule in residuals.names() for name in residuals.get(rule).knob_names()}
    prefix = "model.residual."
    return {k: v for k, v in old.items()
            if not (k.startswith(prefix) and k not in new and k[len(prefix):] in knobs)}


def _defaults() -> dict[str, Any]:
    """Every config key's default: a key that a checkpoint predates (a setting added since) is no change while the
    run leaves it at its default, so a checkpoint written before a setting existed resumes as it was."""
    from dataclasses import asdict

    from rrtrain.config import Config

    return dotted_keys(asdict(Config()))


def config_changes(saved: dict, current: dict, saved_world: int, world: int) -> tuple[list, list, list]:
    """The differences between the checkpoint's config and the current one, each (key, old, new): those that
    matter (every one but the free ones), those no one may make (never), and those that need consent (never and
    consent)."""
    new = dotted_keys(current)
    old = _without_other_rules_knobs(dotted_keys(saved), new)
    defaults = _defaults()
    diffs = [(k, old.get(k), new.get(k)) for k in sorted(set(old) | set(new))
             if old.get(k) != new.get(k) and not (k not in old and k in defaults and new[k] == defaults[k])]
    if saved_world != world:
        diffs.append((WORLD_SIZE, saved_world, world))
    relevant = [d for d in diffs if _rule(d[0]) != "free"]
    fatal = [d for d in relevant if _rule(d[0]) == "never"]
    consent = [d for d in relevant if _rule(d[0]) != "layout"]
    return relevant, fatal, consent


def check_resume(saved: dict, current: dict, saved_world: int, world: int, allow: bool) -> list[str]:
    """Compare the checkpoint's config with the current one; raise UsageError listing refused differences.

    Returns the differences that were accepted (to be logged), layout changes included."""
    relevant, fatal, consent = config_changes(saved, current, saved_world, world)
    text = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in (fatal or consent))
    if fatal:
        raise UsageError(f"cannot resume: the checkpoint was written with a different configuration ({text}); "
                         "use a new run.dir")
    if consent and not allow:
        raise UsageError(f"refusing to resume with a changed configuration ({text}); "
                         "set train.allow_config_change=true to resume anyway")
    return [f"{k}: {a!r} -> {b!r}" for k, a, b in relevant]
