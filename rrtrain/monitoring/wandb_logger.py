"""Weights & Biases for one run (`log.wandb`), for users who follow their runs there.

What W&B gets, from rank 0 only:
- every scalar the run writes to metrics.jsonl and TensorBoard, under TensorBoard's tags (`train/loss`,
  `eval/val_loss`, `diag/block_grad_norm/000`, `ckpt/write_s`, ...) at the optimizer step (a checkpoint's
  timings at the step it was published: W&B's steps only increase);
- the resolved config (config.yaml's content, and `resolved`: parameters, steps, tokens per step, ranks);
- each flag as it is raised: a point `monitor/FLAG` = 1 at its step, an alert (title the flag, text its step
  and reason) and the summary's `flag/FLAG` = {step, detail};
- at the end, final.json's fields in the summary (the outcome), and the W&B run finished with the run's exit
  code (a preempted run is marked preempting first).

One W&B run per start from scratch: its id is the directory's (`wandb_run_id`) and a token made when the run
starts without a checkpoint (`new_run_id`), kept in every checkpoint's train_state.json (this callback's state);
W&B is asked to resume it (`resume="allow"`), so a requeued or resumed run continues its own W&B run, while a
fresh run in a reused directory (other settings, no checkpoint) is a new W&B run, never the old curve. A
checkpoint that holds no id (written by an older rrtrain) resumes the directory's id alone. Steps that W&B holds
already (a run resumed from a checkpoint older than its last logged step) are not sent again: W&B refuses
steps below its last one, and by determinism they are the same values. W&B's files go to `$WANDB_DIR`, else
into the run directory (`wandb/`). wandb is imported when the run starts and only here, so a run without
`log.wandb` never loads it; a W&B that cannot start (no network in online mode) costs the run its W&B record,
said in one line, not the run.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import re
import sys
import uuid
from pathlib import Path
from typing import Any, Optional

from rrtrain.config import WandbConfig
from rrtrain.core import files
from rrtrain.core.errors import UsageError
from rrtrain.rundir import layout
from rrtrain.rundir.outcome import EXIT_CODES
from rrtrain.rundir.readers import read_json_object
from rrtrain.training.callbacks import DIAG_KEYS  # a training record's keys that TensorBoard gets under diag/
from rrtrain.training.loop import Callback, Loop


def wandb_run_id(run_dir: str | os.PathLike[str]) -> str:
    """The W&B run id of a run directory: its name (characters W&B accepts) and a hash of its absolute path,
    so every start of the same directory gets the same id and two sweeps' `tiny-review-s0` do not meet."""
    path = str(Path(run_dir).resolve())
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(path).name)[:48].strip("-.") or "run"
    return f"{stem}-{hashlib.sha256(path.encode()).hexdigest()[:12]}"


#: a W&B run id as this module makes them (W&B accepts up to 128 of these characters)
RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


def setup_in(run_dir: str | os.PathLike[str]) -> None:
    """W&B's process-wide setup (`wandb.setup()`), with the run directory as the working directory meanwhile.
    As it sets up, W&B reads a workspace settings file, `wandb/settings` or `.wandb/settings`, from the working
    directory, before `dir=` or WANDB_DIR count: a run started in a shared directory read a co-tenant's file
    there, whose `base_url` sent the user's API key and the run to their server. The run directory is the user's
    alone; the user's own settings (~/.config/wandb/settings, WANDB_* variables) apply as before. A process whose
    W&B is set up already (a callback of the user's that used it) keeps its settings."""
    import wandb

    with files.working_in(run_dir):
        wandb.setup()


def check_wandb_dir() -> None:
    """WANDB_DIR, when the user set it, holds the run's W&B files and `latest-run` link: like the compile and
    tiktoken caches, it must be a directory no one else can write (made 0700 when missing), or a co-tenant could
    rename, replace or remove what W&B keeps there. Refused in one line, before the run writes anything."""
    where = os.environ.get("WANDB_DIR")
    why = files.prepare_private_dir(where) if where else None
    if why is not None:
        raise UsageError(f"log.wandb: W&B's directory {where} (WANDB_DIR): {why}: set WANDB_DIR to a directory of "
                         "yours no one else can write, or unset it (the run directory is used)")


def new_run_id(run_dir: str | os.PathLike[str]) -> str:
    """The W&B run id of a run starting from scratch: the directory's (`wandb_run_id`) and a random token, so
    a new run in a directory that held another is a W&B run of its own. Not a training input: the run's
    random streams are untouched (a token from the OS, not from Python's or torch's generators)."""
    return f"{wandb_run_id(run_dir)}-{uuid.uuid4().hex[:8]}"


def scalars(record: dict[str, Any], prefix: str) -> dict[str, float]:
    """A record's values as TensorBoard gets them (`rrtrain.rundir.metrics.MetricsLogger.log`): numbers as
    `PREFIX/KEY`, lists of numbers as `PREFIX/KEY/000`...; `step`, `kind`, other values and non-finite numbers
    are left out."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in ("step", "kind"):
            continue
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[f"{prefix}/{key}"] = value
        elif isinstance(value, list):
            for i, v in enumerate(value):
                if isinstance(v, (int, float)) and math.isfinite(v):
                    out[f"{prefix}/{key}/{i:03d}"] = v
    return out


class WandbLogger(Callback):
    """Mirrors the run to W&B (see the module docstring); does nothing on ranks other than 0."""

    # after the monitor (70), so the flags raised on a batch of records reach it before those records do
    name, priority = "wandb", 55

    def __init__(self, cfg: WandbConfig) -> None:
        if importlib.util.find_spec("wandb") is None:  # refused before the run writes anything
            raise UsageError("log.wandb is set but the wandb package is not installed: "
                             "pip install 'rrtrain[wandb]' (or unset log.wandb)")
        check_wandb_dir()
        self.cfg = cfg
        self.run: Any = None  # the wandb Run on rank 0 while it is open
        self.floor = 0  # steps below this are in W&B already (a resumed W&B run)
        self.last = 0  # the highest step sent
        self.pending: dict[int, dict[str, float]] = {}  # flag points waiting for their step's records
        self.flags: dict[str, dict[str, Any]] = {}  # name -> {"step", "detail"}, as raised
        self.run_id: Optional[str] = None  # this run's W&B id: from the checkpoint resumed, else made at start

    def state_dict(self) -> dict[str, Any]:
        """The W&B run id, so that a resume continues this run's own W&B run."""
        return {"run_id": self.run_id} if self.run_id is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        run_id = state.get("run_id")
        if run_id is not None and not (isinstance(run_id, str) and RUN_ID.fullmatch(run_id)):
            raise ValueError(f"run_id: not a W&B run id ({str(run_id)[:40]!r})")
        self.run_id = run_id

    # -- the hooks ------------------------------------------------------------------------------

    def on_start(self, loop: Loop) -> None:
        if not loop.facts.is_main:
            return
        f = loop.facts
        if self.run_id is None:  # from scratch, or a checkpoint of an older rrtrain (which used the directory's)
            self.run_id = new_run_id(f.run_dir) if loop.resumed_at is None else wandb_run_id(f.run_dir)
        try:
            import wandb

            setup_in(f.run_dir)
            c = self.cfg
            settings = {k: v for k, v in (("project", c.project), ("entity", c.entity), ("group", c.group),
                                          ("mode", c.mode)) if v is not None}
            if "WANDB_DIR" not in os.environ:
                settings["dir"] = str(f.run_dir)
            self.run = wandb.init(id=self.run_id, resume="allow", name=f.config.run.name or
                                  Path(f.run_dir).name, job_type="train", **settings)
            self.run.config.update({**f.config.to_dict(), "resolved": {
                "params": f.params, "total_steps": loop.total_steps, "tokens_per_step": f.tokens_per_step,
                "warmup_steps": f.warmup_steps, "world_size": f.world_size, "accum": f.accum,
                "wandb_run_id": self.run.id}}, allow_val_change=True)
        except Exception as err:  # noqa: BLE001 - W&B's failure must not end the run
            self._give_up(err)
            return
        self.floor = int(self.run.step or 0) if self.run.resumed else 0
        self.last = self.floor - 1

    def on_train_records(self, loop: Loop, records: list[dict[str, Any]]) -> None:
        if self.run is None:
            return
        for rec in records:
            step = rec["step"]
            train = {k: v for k, v in rec.items() if k not in DIAG_KEYS}
            diag = {k: v for k, v in rec.items() if k in DIAG_KEYS}
            self._send(step, {**scalars(train, "train"), **scalars(diag, "diag"), **self.pending.pop(step, {})})

    def on_eval(self, loop: Loop, record: dict[str, Any]) -> None:
        if self.run is not None:
            self._send_pending()
            self._send(record["step"], scalars(record, "eval"))

    def log_record(self, step: int, record: dict[str, Any], prefix: str) -> None:
        """Another callback's metrics.jsonl record (downstream evaluations: rrtrain.eval.callback), as
        TensorBoard gets it."""
        if self.run is not None:
            self._send_pending()
            self._send(step, scalars(record, prefix))

    def on_checkpoint(self, loop: Loop, record: dict[str, Any]) -> None:
        if self.run is not None:
            self._send_pending()
            self._send(record.get("published_at", record["step"]), scalars(record, "ckpt"))

    def on_flag(self, loop: Loop, flag: dict[str, Any]) -> None:
        if self.run is None:
            return
        self._flag(flag["flag"], flag["step"], flag["detail"])
        if flag["step"] > self.last:  # its step's records are still to come: the point goes with them
            self.pending.setdefault(flag["step"], {})[f"monitor/{flag['flag']}"] = 1.0
        else:
            self._send(flag["step"], {f"monitor/{flag['flag']}": 1.0})

    def on_end(self, loop: Loop) -> None:
        if self.run is None:
            return
        self._send_pending()
        final = self._final(loop)
        try:
            # flags not raised on the loop (cancelled, nonfinite_steps, diverged by non-finite steps, ...)
            steps, details, names = (final.get(k) if isinstance(final.get(k), kind) else kind()
                                     for k, kind in (("flag_steps", dict), ("flag_details", dict), ("flags", list)))
            for name in names:
                if not isinstance(name, str) or name in self.flags:
                    continue
                at = steps.get(name) if isinstance(steps.get(name), int) else loop.step
                if loop.resumed_at is not None and at <= loop.resumed_at:
                    continue  # raised before this start: W&B has had it since then
                self._flag(name, at, str(details.get(name) or final.get("reason") or ""))
                self._send(at, {f"monitor/{name}": 1.0})
            if self.run is None:
                return
            self.run.summary.update(final)
            if final.get("status") == "preempted":
                self.run.mark_preempting()
            code = final.get("exit_code")
            self.run.finish(exit_code=code if isinstance(code, int) else EXIT_CODES.get(loop.status, 1))
        except Exception as err:  # noqa: BLE001
            self._give_up(err)
        self.run = None

    # -- helpers --------------------------------------------------------------------------------

    def _final(self, loop: Loop) -> dict[str, Any]:
        """final.json as this run wrote it; when it is missing or left by an earlier start (this one could not
        write it), the loop's own ending."""
        data = read_json_object(Path(loop.facts.run_dir) / layout.FINAL)
        if data is not None and data.get("status") == loop.status and data.get("step") == loop.step:
            return data
        return {"status": loop.status, "reason": loop.reason, "step": loop.step, "tokens": loop.tokens,
                "final_val_loss": loop.last_val_loss, "exit_code": EXIT_CODES.get(loop.status, 1),
                "flags": list(self.flags)}

    def _flag(self, name: str, step: int, detail: str) -> None:
        """The summary's `flag/NAME` (a key per flag: a resumed start adds to the earlier starts' flags) and an
        alert."""
        self.flags[name] = {"step": step, "detail": detail}
        self._call(lambda: self.run.summary.update({f"flag/{name}": {"step": step, "detail": detail}}))
        self._call(lambda: self.run.alert(title=name, text=f"{self.run.name}: {name} at step {step}: {detail}",
                                          level="WARN"))

    def _send(self, step: int, values: dict[str, float]) -> None:
        """One history row at `step` (rows of one step merge); a step below the last one sent is dropped, as W&B
        would drop it (the summary keeps every flag)."""
        if values and step >= max(self.last, self.floor):
            self._call(lambda: self.run.log(values, step=step))
            self.last = step

    def _send_pending(self) -> None:
        for step in sorted(self.pending):
            self._send(step, self.pending.pop(step))

    def _call(self, action: Any) -> None:
        if self.run is None:
            return
        try:
            action()
        except Exception as err:  # noqa: BLE001 - W&B's failure must not end the run
            self._give_up(err)

    def _give_up(self, err: BaseException) -> None:
        print(f"rrtrain: W&B logging off for this run: {type(err).__name__}: {err}".splitlines()[0],
              file=sys.stderr, flush=True)
        self.run = None
