"""`rrtrain train CONFIG [key=value ...]`, and the same run distributed:
`torchrun --nproc_per_node=N -m rrtrain.train CONFIG [key=value ...]`.

Exit status: 0 completed, 1 failed, 2 bad input, 3 diverged, 4 stalled, 5 paused (after the step its run directory's
pause.json named, checkpointed: start it again to go on), 75 preempted (stopped by a signal at a step
boundary after writing a checkpoint: restart the same command to resume), 73 another live copy of this run
holds its directory (`run.lock`; nothing was written).
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

from rrtrain.resolve import load

if TYPE_CHECKING:  # the training stack loads when a run starts, not for `--help`
    from rrtrain.config import Config
    from rrtrain.core.signals import StopFlag
    from rrtrain.training.loop import Callback


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    path, overrides = argv[0], argv[1:]
    return run(load(path, overrides))


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
    try:
        trainer = Trainer(cfg)
    except runlock.RunLocked as err:
        print(f"rrtrain: {err}", file=sys.stderr, flush=True)
        return runlock.LOCKED_EXIT
    ranks.record(trainer.run_dir, trainer.info.rank, trainer.info.local_rank, trainer.info.world_size)
    watch = PeerWatch.start(trainer.info, cfg.parallel.timeout_s, on_lost=trainer.fail_final,
                            stopping=lambda: stop.signum is not None)
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


if __name__ == "__main__":
    from rrtrain.core.command import run_command

    sys.exit(run_command("rrtrain train", main, sys.argv[1:]))  # ends as `rrtrain train` does
