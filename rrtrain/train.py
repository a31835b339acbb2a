"""`rrtrain train CONFIG [key=value ...] [--print-config]`, and the same run distributed:
`torchrun --nproc_per_node=N -m rrtrain.train CONFIG [key=value ...]`.

Exit status: 0 completed, 1 failed, 2 bad input, 3 diverged, 4 stalled, 5 paused (after the step its run directory's
pause.json named, checkpointed: start it again to go on), 75 preempted (stopped by a signal at a step
boundary after writing a checkpoint: restart the same command to resume), 73 another live copy of this run
holds its directory (`run.lock`; nothing was written).

`--print-config` prints the resolved config as YAML (defaults, overrides, the rule's knobs in full) and runs nothing.
With `RRTRAIN_CONFIG_SHA256` set (a sweep's jobs set it: launchers.sweep.seal), CONFIG must be the file of that
digest, standing alone: a config changed after its sweep was submitted is refused (exit 2).
"""

from __future__ import annotations

import gc

#: a run's own process (`python -m rrtrain.train`): its start-up imports torch and the training stack, hundreds of
#: thousands of objects that live as long as the run and almost no garbage, which the cyclic collector would walk
#: again and again (~a fifth of a start-up's CPU: docs/performance.md). It is off until the first step
#: (`_collector_back`), and what the start-up made is then frozen out of its reach.
_COLLECTOR_PAUSED = __name__ == "__main__" and gc.isenabled()
if _COLLECTOR_PAUSED:
    gc.disable()

import importlib  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

from rrtrain.config_load import CONFIG_DIGEST_ENV  # noqa: E402
from rrtrain.resolve import load  # noqa: E402

if TYPE_CHECKING:  # the training stack loads when a run starts, not for `--help`
    from rrtrain.config import Config
    from rrtrain.core.signals import StopFlag
    from rrtrain.training.loop import Callback


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    show = PRINT_CONFIG in argv  # anywhere on the line, as torchrun passes it through too
    argv = [a for a in argv if a != PRINT_CONFIG]
    if not argv:
        from rrtrain.core.errors import UsageError

        raise UsageError(f"{PRINT_CONFIG} needs a CONFIG: rrtrain train CONFIG [key=value ...] {PRINT_CONFIG}")
    path, overrides = argv[0], argv[1:]
    cfg = load(path, overrides, os.environ.get(CONFIG_DIGEST_ENV) or None)  # a sweep's job: its submitted config
    if show:
        print(resolved_yaml(cfg), end="")
        return 0
    return run(cfg)


#: `rrtrain train CONFIG [key=value ...] --print-config`: the resolved config as YAML on stdout; nothing runs
PRINT_CONFIG = "--print-config"


def resolved_yaml(cfg: "Config") -> str:
    """The config a run of `cfg` starts from, as YAML: defaults filled in, overrides applied, `model.residual`
    written out in full, and, where `data.path` holds a readable manifest, checked against that dataset (a
    mismatch is the run's own one-line error). Reads nothing else and writes nothing."""
    import yaml

    from rrtrain.resolve import resolve, with_knobs

    manifest = None
    if cfg.data.path:
        from rrtrain.core.errors import UsageError
        from rrtrain.data.manifest import read_manifest

        try:
            manifest = read_manifest(cfg.data.path)
        except UsageError:  # not prepared yet (or remote and unreachable): the config is printed all the same
            manifest = None
    resolved = resolve(cfg, manifest).cfg if manifest is not None else with_knobs(cfg)
    return yaml.safe_dump(resolved.to_dict(), sort_keys=False)


def default_callbacks(cfg: "Config", stop: "StopFlag") -> list["Callback"]:
    """Everything the loop does besides the step: this module composes it, so the trainer knows none of it."""
    from rrtrain.monitoring.callback import MonitorCallback
    from rrtrain.training.callbacks import (
        Checkpointer,
        Evaluator,
        MetricsWriter,
        NonfiniteGuard,
        StopSignal,
        Throughput,
    )
    from rrtrain.training.console import Console
    from rrtrain.training.pause import PauseAt

    t = cfg.train
    callbacks = [Throughput(t.log_every), MetricsWriter(), NonfiniteGuard(t.on_nonfinite, t.max_nonfinite),
                 MonitorCallback(cfg.monitor), Console(t.log_every), Evaluator(t.eval_every),
                 Checkpointer(t.ckpt_every), PauseAt(t.stop_check_every), StopSignal(stop, t.stop_check_every)]
    downstream = None
    if cfg.eval.downstream.tasks:  # only then is lm_eval imported (and an unknown task refused, before any write)
        from rrtrain.eval.callback import DownstreamEval

        downstream = DownstreamEval(cfg.eval.downstream, t.ckpt_every)
        callbacks.append(downstream)
    if cfg.log.wandb is not None:  # only then is the module (and, when the run starts, wandb) imported
        from rrtrain.monitoring.wandb_logger import WandbLogger

        wandb = WandbLogger(cfg.log.wandb)
        callbacks.append(wandb)
        if downstream is not None:
            downstream.mirrors.append(wandb.log_record)
    return callbacks


def user_callback(path: str) -> "Callback":
    """`module.path:ClassName` (`train.callbacks`, format checked with the config), imported and built with no
    arguments: a class that subclasses `rrtrain.training.loop.Callback`."""
    from rrtrain.core.errors import UsageError
    from rrtrain.training.loop import Callback

    module_name, _, class_name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise UsageError(f"train.callbacks: cannot import {module_name!r} for {path!r} ({err})") from None
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Callback)):
        what = "no such name" if cls is None else f"{type(cls).__name__}, not a subclass of Callback"
        raise UsageError(f"train.callbacks: {path!r} is not a callback class ({what}; subclass "
                         "rrtrain.training.loop.Callback)")
    try:
        return cls()
    except Exception as err:
        raise UsageError(f"train.callbacks: {path}() failed: {type(err).__name__}: {err}".splitlines()[0]) from None


def compose_callbacks(cfg: "Config", stop: "StopFlag") -> list["Callback"]:
    """The built-ins and then `train.callbacks`; every name once (a callback's state is saved under it)."""
    from rrtrain.core.errors import UsageError

    callbacks = default_callbacks(cfg, stop)
    owners = {c.name: f"the built-in {type(c).__name__}" for c in callbacks}
    for path in cfg.train.callbacks:
        callback = user_callback(path)
        if callback.name in owners:
            raise UsageError(f"train.callbacks: {path!r} is named {callback.name!r}, like {owners[callback.name]}; "
                             "give it another `name`")
        owners[callback.name] = repr(path)
        callbacks.append(callback)
    return callbacks


def run(cfg: "Config") -> int:
    """Run one training job to any ending; always leaves final.json once the run directory is held, except that
    an ending final.json already records stands against a failure before training (a refused resume) and an
    ending for good against any later failure (`rrtrain.rundir.outcome.keeps_recorded`); returns the process
    exit code. A bad `train.callbacks` entry is refused before anything is written.

    A second copy of a run whose directory is locked by a live process writes nothing and returns 73."""
    from rrtrain.core import dist
    from rrtrain.core.errors import RunError, UsageError
    from rrtrain.core.signals import StopFlag
    from rrtrain.monitoring.watchdog import PeerWatch, is_comm_error
    from rrtrain.rundir import lock as runlock
    from rrtrain.rundir import ranks
    from rrtrain.rundir.outcome import EXIT_CODES
    from rrtrain.training.checkpoint import is_disk_full
    from rrtrain.training.trainer import Trainer

    stop = StopFlag()
    callbacks = compose_callbacks(cfg, stop)
    if cfg.data.sources:  # a mixture's sources (there, prepared, one tokenizer): refused before anything is written
        from rrtrain.data.sources import read_mixture

        read_mixture(cfg.data)
    warm = None
    if cfg.init.from_:  # `init.from`: read and checked against the run's model before anything is written
        from rrtrain.artifact.warm import prepare

        warm = prepare(cfg)
    try:
        trainer = Trainer(cfg)
    except runlock.RunLocked as err:
        print(f"rrtrain: {err}", file=sys.stderr, flush=True)
        return runlock.LOCKED_EXIT
    trainer.warm_start = warm
    ranks.record(trainer.run_dir, trainer.info.rank, trainer.info.local_rank, trainer.info.world_size)
    watch = PeerWatch.start(trainer.info, cfg.parallel.timeout_s, on_lost=trainer.fail_final,
                            stopping=lambda: stop.signum is not None)
    _collector_back()
    try:
        trainer.fit(callbacks)
    except (UsageError, RunError) as err:
        trainer.fail_final(str(err))
        trainer.emit("on_end")
        raise
    except BaseException as err:
        lost = watch.lost(give_up=lambda: stop.signum is not None) if watch is not None and is_comm_error(err) else None
        trainer.fail_final(lost or f"{type(err).__name__}: {err}".splitlines()[0])
        trainer.emit("on_end")
        if lost:  # a rank died or hung (no launcher tore the group down): name it, not gloo's symptom
            raise RunError(lost) from None
        if is_disk_full(err):  # e.g. metrics.jsonl on a full disk: one line, not a traceback
            raise RunError(f"no space left on the device ({trainer.reason}); free space and start the run "
                           "again to resume from its last checkpoint") from None
        raise
    finally:
        stop.restore()  # the stop signal's handlers go with the run, whatever its ending (StopSignal.on_end too)
        if watch is not None:
            watch.stop()
    written = trainer.write_final()
    trainer.emit("on_end")
    dist.barrier()
    dist.teardown()
    return EXIT_CODES[trainer.status] if written else EXIT_CODES["failed"]


def _collector_back() -> None:
    """The cyclic collector on again, after a paused start-up (`_COLLECTOR_PAUSED`); what the start-up made frozen."""
    global _COLLECTOR_PAUSED
    if _COLLECTOR_PAUSED:
        _COLLECTOR_PAUSED = False
        gc.freeze()
        gc.enable()


if __name__ == "__main__":
    from rrtrain.core.command import run_command

    sys.exit(run_command("rrtrain train", main, sys.argv[1:]))  # ends as `rrtrain train` does
