"""How a run goes on from a checkpoint under its learning-rate schedule (`rrtrain.schedule`): a resume whose
budget grew (an extension), and a cooldown branch (`train.branch_from=RUN_DIR@STEP`).

*Extension.* A resume whose total steps grew (`train.max_steps`, or `train.tokens`) is accepted without consent,
and listed, under `train.schedule=wsd` and `constant` when no step taken so far, nor the next, has another rate
under the new total: under `constant` always; under `wsd` while the checkpoint is in its warmup or stable phase
(the decay is anchored to the run's end, so it moves to the end of the new total: the stable phase goes on).
A run whose `train.warmup_steps` is unset keeps the checkpoint's warmup (5% of the old total), which a new total
would otherwise move. Any other change of the total (a shrink; a `cosine` or `linear` run, whose every rate
depends on the total; a `wsd` run already in its decay, whose rate would jump back to the peak) is refused in one
line saying why, unless `train.allow_config_change=true`.

*Cooldown branch.* `train.branch_from=RUN_DIR@STEP` starts a new run (its own, new `run.dir`) from that
checkpoint of another run with everything a resume takes from one: weights, optimizer, data position, every
rank's random state, the counters and the callbacks' states, so that its first step is the one the parent took
next, bit for bit, where the schedules agree. A branch sets its own schedule (`BRANCH_OWN`: the total, the
schedule and its decay, the warmup and the floor); the model, matching, data, seed and backend must be the
parent's (refused whatever the user says), and any other change needs consent as on resume. All of it is checked
before the branch's directory is touched (`prepare_branch`): the parent's directory, the step (a refusal lists
the steps there are), the parent's checkpoint directory and files as resume checks a run's own (private to the
user, every file against the manifest in train_state.json; `train.allow_unverified_checkpoint` as on resume),
the configuration, the model's shape and the dataset's fingerprint. The parent is only read: no key, marker,
`latest` or pruning there. The `.rrtrain-made` markers (HMACs under `checkpoints/.rrtrain-key`) are not
required: they prove to a run which directories it may delete, which a branch never does there, and resume does
not read them either; so a parent that was moved or copied (its markers then prove nothing) is branched from
like any other, and its key is neither read nor made. Once the branch has a checkpoint of its own it resumes
from its own (the parent may be gone by then), and `train.branch_from` is a key that never changes on resume.
The branch's config.yaml records its parent as an absolute `RUN_DIR@STEP`.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional

from rrtrain import budget as budgets
from rrtrain import schedule as lr_schedule
from rrtrain.config import Config
from rrtrain.core import dist
from rrtrain.core.dist import DistInfo
from rrtrain.core.errors import UsageError
from rrtrain.rundir import layout
from rrtrain.training.checkpoint import CheckpointManager, check_resume, config_changes

#: the `train` keys a branch sets for itself, whatever its parent's were: its schedule (and its parent)
BRANCH_OWN = ("max_steps", "tokens", "schedule", "decay_shape", "decay_fraction", "decay_steps", "warmup_steps",
              "min_lr_ratio", "branch_from")
#: the `train` keys a checkpoint written before schedules existed lacks, with the values that mean what it did
NEW_KEYS = {"schedule": "cosine", "decay_shape": None, "decay_fraction": None, "decay_steps": None,
            "branch_from": None}
STEP_DIR = re.compile(r"^step_(\d{1,18})$")
ADVICE = ("extend runs of train.schedule=wsd (before their decay) or constant, branch a new run from a checkpoint "
          "(train.branch_from=RUN_DIR@STEP), or set train.allow_config_change=true to go on anyway")


@dataclass(frozen=True)
class Parent:
    """The checkpoint a branch starts from, checked."""

    run_dir: Path  # absolute
    step: int
    checkpoint: Path

    @property
    def spec(self) -> str:
        return f"{self.run_dir}@{self.step}"


# ---------------------------------------------------------------------------------------------
# Any continuation: a resume (extended or not) or a branch


def with_new_keys(saved: dict) -> dict:
    """A checkpoint's config with the schedule keys an older rrtrain did not write, at the values that mean what
    it did (a cosine schedule, no branch)."""
    train = saved.get("train")
    if not isinstance(train, dict):
        return saved
    return {**saved, "train": {**NEW_KEYS, **train}}


def length_of(train: dict, seq_len: int) -> Optional[tuple[int, int]]:
    """(total steps, warmup steps) of a recorded `train` section; None when it records no budget."""
    try:
        total = budgets.total_steps(train.get("max_steps"), train.get("tokens"), int(train["global_batch"]) * seq_len)
        return None if total is None else (total, budgets.warmup_steps(train.get("warmup_steps"), total))
    except (KeyError, TypeError, ValueError):
        return None


def _total(cfg: Config, seq_len: int) -> Optional[int]:
    t = cfg.train
    return budgets.total_steps(t.max_steps, t.tokens, t.global_batch * seq_len)


def pin_warmup(cfg: Config, saved: dict, seq_len: int) -> tuple[Config, dict]:
    """With `train.warmup_steps` unset, a continued run keeps the checkpoint's warmup when its total (which
    the default warmup is 5% of) changed, or when the checkpoint already pinned one: `cfg` with it set, and
    `saved` with it too (the same warmup, not a change)."""
    t, train = cfg.train, saved.get("train") or {}
    old = length_of(train, seq_len)
    if t.warmup_steps is not None or old is None:
        return cfg, saved
    if train.get("warmup_steps") is None and _total(cfg, seq_len) == old[0]:
        return cfg, saved
    cfg = replace(cfg, train=replace(t, warmup_steps=old[1]))
    return cfg, {**saved, "train": {**train, "warmup_steps": old[1]}}


def continue_from(state: dict, saved: dict, cfg: Config, seq_len: int, world: int,
                  parent: Optional[Parent]) -> tuple[Config, list[str]]:
    """The config to go on with from a checkpoint (`state`, its train_state.json; `saved`, its config as the
    trainer compares it) and the accepted changes, to be printed; a one-line UsageError for a refused one.
    A resume (`parent` None) may extend the run (module docstring); a branch sets its own schedule."""
    cfg, saved = pin_warmup(cfg, with_new_keys(saved), seq_len)
    current = cfg.to_dict()
    allow = cfg.train.allow_config_change
    if parent is not None:
        return cfg, check_branch(saved, current, state["world_size"], world, allow, parent.spec)
    saved, notes = _extension(saved, cfg, int(state["step"]), seq_len)
    return cfg, notes + check_resume(saved, current, state["world_size"], world, allow)


def _extension(saved: dict, cfg: Config, step: int, seq_len: int) -> tuple[dict, list[str]]:
    """A resume with another total: accepted and noted (the saved total then reads as the current one), refused
    in one line, or, with consent, left to the resume check to list."""
    t, train = cfg.train, saved.get("train") or {}
    old, total = length_of(train, seq_len), _total(cfg, seq_len)
    if old is None or total is None or total == old[0]:
        return saved, []
    moved = [k for k in ("max_steps", "tokens") if train.get(k) != getattr(t, k)]
    change = "; ".join(f"train.{k}: {train.get(k)!r} -> {getattr(t, k)!r}" for k in moved) or \
        f"{old[0]} -> {total} steps"  # the tokens per step changed under a token budget
    before = SimpleNamespace(**{**NEW_KEYS, **train})
    why = lr_schedule.extension_refusal(before, t, old[0], total, old[1], step)
    if why is not None:
        if t.allow_config_change:
            return saved, []
        raise UsageError(f"cannot change the run's length on resume ({change}): {why}; {ADVICE}")
    note = f"{change} (extended from {old[0]} to {total} steps under train.schedule={t.schedule}"
    start = lr_schedule.decay_start(t, total, t.warmup_steps if t.warmup_steps is not None else old[1])
    note += f"; its decay now begins after step {start})" if t.schedule == "wsd" else ")"
    return {**saved, "train": {**train, **{k: getattr(t, k) for k in moved}}}, [note]


def check_branch(saved: dict, current: dict, saved_world: int, world: int, allow: bool, spec: str) -> list[str]:
    """A branch's config against its parent's checkpoint: the branch's own schedule (`BRANCH_OWN`) compared to
    nothing, the model, data, seed and backend refused when they differ, any other change with consent only.
    Returns the accepted changes (layout included)."""
    train, mine = saved.get("train") or {}, current.get("train") or {}
    saved = {**saved, "train": {**train, **{k: mine.get(k) for k in BRANCH_OWN}}}
    relevant, fatal, consent = config_changes(saved, current, saved_world, world)
    if fatal:
        text = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in fatal)
        raise UsageError(f"train.branch_from: cannot branch from {spec}: it was trained with another model, data, "
                         f"seed or backend ({text}); a branch keeps its parent's")
    if consent and not allow:
        text = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in consent)
        raise UsageError(f"train.branch_from: {spec} was trained with other settings ({text}); a branch sets its "
                         "own schedule (train.max_steps, tokens, schedule, decay_*, warmup_steps, min_lr_ratio) and "
                         "keeps the rest: set train.allow_config_change=true to change it anyway")
    return [f"{k}: {a!r} -> {b!r}" for k, a, b in relevant]


def check_same_run(state: dict, spec: str, fingerprint: Optional[str], shape: Optional[dict]) -> None:
    """The branch's dataset and model shape against its parent's checkpoint (where both are known)."""
    theirs = state.get("fingerprint")
    if fingerprint and isinstance(theirs, str) and theirs != fingerprint:
        raise UsageError(f"train.branch_from: {spec} was trained on other data (dataset fingerprint {theirs[:16]} "
                         f"there, {fingerprint[:16]} here); a branch keeps its parent's data")
    recorded = state.get("shape")
    if shape is not None and isinstance(recorded, dict) and recorded != shape:
        differ = next((k for k in shape if recorded.get(k) != shape[k]), "?")
        raise UsageError(f"train.branch_from: {spec} holds a model of another shape ({differ}: {recorded.get(differ)!r}"
                         f" there, {shape.get(differ)!r} here); a branch keeps its parent's model")


def lr_note(state: dict, saved: dict, cfg: Config, seq_len: int, total: int, warmup: int) -> str:
    """What a branch's next step's learning rate is, and what its parent's was (they agree unless the branch's
    schedule differs there)."""
    step = int(state["step"])
    mine = lr_schedule.lr_at(step, total, warmup, cfg.train)
    train = with_new_keys(saved).get("train") or {}
    old = length_of(train, seq_len)
    if old is None:
        return f"the learning rate of step {step + 1}: {mine:.6g}"
    try:
        theirs = lr_schedule.lr_at(step, old[0], old[1], SimpleNamespace(**train))
    except (AttributeError, TypeError, ValueError, ZeroDivisionError):
        return f"the learning rate of step {step + 1}: {mine:.6g}"
    same = "as in the parent" if theirs == mine else f"the parent's: {theirs:.6g}"
    return f"the learning rate of step {step + 1}: {mine:.6g} ({same})"


# ---------------------------------------------------------------------------------------------
# A branch's parent, found and checked before the branch's directory is touched


def checkpoint_steps(run_dir: Path) -> dict[int, Path]:
    """The published checkpoints of a run directory by step (renamed into place: complete when written); links and
    files named like one are not checkpoints."""
    root = run_dir / layout.CHECKPOINTS
    try:
        entries = list(root.iterdir()) if root.is_dir() else []
    except OSError:
        return {}
    out = {}
    for p in entries:
        m = STEP_DIR.match(p.name)
        if m and not p.is_symlink() and p.is_dir():
            out[int(m.group(1))] = p
    return dict(sorted(out.items()))


def _parent_problem(own: Path, where: str, parent_dir: Path, step: int) -> Optional[str]:
    if os.path.realpath(own) == os.path.realpath(parent_dir):
        return f"train.branch_from: {where} is this run's own directory: a branch starts a new run.dir"
    if not parent_dir.is_dir():
        what = "not a directory" if os.path.lexists(parent_dir) else "no such directory"
        return f"train.branch_from: {where} is not a run directory ({what})"
    steps = checkpoint_steps(parent_dir)
    if not steps:
        return f"train.branch_from: {where} has no checkpoints (nothing under {parent_dir / layout.CHECKPOINTS})"
    if step not in steps:
        return (f"train.branch_from: {where} has no checkpoint at step {step} (its checkpoints: "
                f"{', '.join(map(str, steps))})")
    return None


def prepare_branch(cfg: Config, info: DistInfo,
                   normalise: Callable[[dict], dict] = lambda c: c) -> tuple[Config, Optional[Parent]]:
    """Collective. `cfg` with `train.branch_from` made absolute, and the parent's checkpoint checked (module
    docstring); None for the parent when the config names none, or when the branch already has checkpoints of its
    own (it resumes from them). Every refusal is one line, before anything is written. `normalise`: what the
    trainer does to a checkpoint's config before comparing it (its data paths made absolute)."""
    spec = cfg.train.branch_from
    if spec is None:
        return cfg, None
    where, step = lr_schedule.parse_branch(spec)
    parent_dir = Path(os.path.abspath(where))
    cfg = replace(cfg, train=replace(cfg.train, branch_from=f"{parent_dir}@{step}"))
    if checkpoint_steps(Path(cfg.run.dir)):
        return cfg, None
    dist.raise_together(_parent_problem(Path(cfg.run.dir), where, parent_dir, step) if info.is_main else None)
    path = checkpoint_steps(parent_dir)[step]
    manager = CheckpointManager(parent_dir, keep=1, info=info,  # only read: it never saves nor prunes there
                                allow_unverified=cfg.train.allow_unverified_checkpoint)
    problem = manager.problem(path)
    if problem is not None:
        raise UsageError(f"train.branch_from: checkpoint {path} is unusable: {problem}")
    try:
        state = manager.read_train_state(path)
    except (OSError, ValueError) as err:
        raise UsageError(f"train.branch_from: checkpoint {path}: {err}") from None
    parent = Parent(parent_dir, step, path)
    _check_before_start(cfg, state, normalise, parent)
    return cfg, parent


def _check_before_start(cfg: Config, state: dict, normalise: Callable[[dict], dict], parent: Parent) -> None:
    """What the trainer checks again once the run is set up, checked now, before the branch's directory exists:
    its dataset (when it has one manifest), the model's shape, the budget past the branch's step, the config."""
    from rrtrain.data.manifest import read_manifest
    from rrtrain.resolve import resolve, with_knobs

    current = with_knobs(cfg)
    manifest = read_manifest(cfg.data.path) if cfg.data.path and not getattr(cfg.data, "sources", None) else None
    run = resolve(current, manifest) if manifest is not None else None
    recorded = state.get("shape") if isinstance(state.get("shape"), dict) else {}
    check_same_run(state, parent.spec, manifest.get("fingerprint") if manifest else None,
                   asdict(run.shape) if run is not None else None)
    seq_len = run.shape.seq_len if run is not None else recorded.get("seq_len")
    if not isinstance(seq_len, int):
        return  # an older checkpoint without its shape, and no dataset to tell: the trainer checks at its start
    total = _total(current, seq_len)
    if total is not None and total <= parent.step:
        raise UsageError(f"train.branch_from: the branch's budget ({total} steps: train.max_steps or train.tokens) "
                         f"ends at or before its start, step {parent.step}: nothing to train")
    saved = with_new_keys(normalise(state["config"]))
    if current.train.micro_batch == "auto":  # chosen when the run starts: compared then
        current = replace(current, train=replace(current.train, micro_batch=(saved.get("train") or {}).get(
            "micro_batch", "auto")))
    current, saved = pin_warmup(current, saved, seq_len)
    check_branch(saved, current.to_dict(), 1, 1, current.train.allow_config_change, parent.spec)


def announce(parent: Parent, note: str) -> None:
    print(f"rrtrain: branching from {parent.spec}; {note}", file=sys.stdout, flush=True)
