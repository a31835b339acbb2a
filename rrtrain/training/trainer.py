"""The training loop: one code path for one CPU process, FSDP2 and DeepSpeed ZeRO.

A run is a function of its config and seed. Per optimizer step it reads `global_batch` sequences
(micro-batches x ranks x accumulation), steps AdamW on its learning-rate schedule (rrtrain.schedule), logs,
evaluates and checkpoints on their cadences, and stops cleanly at a step boundary on a signal. Starting a run
whose directory holds a checkpoint resumes it exactly; `train.branch_from` starts one from another run's
(rrtrain.training.continuation).
"""

from __future__ import annotations

import math
import socket
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Optional

import torch
import yaml

from rrtrain import schedule as lr_schedule
from rrtrain.budget import require as require_budget, warmup_steps
from rrtrain.config import Config
from rrtrain.core import dist
from rrtrain.core.errors import UsageError
from rrtrain.core.hardware import peak_flops
from rrtrain.core.io import atomic_write_json, atomic_write_text, unwritable_reason
from rrtrain.data.sources import absolute_data, absolute_in_saved, read_mixture
from rrtrain import sizing
from rrtrain.parallel import build_training_engine
from rrtrain.parallel.adamw import parametrization_record
from rrtrain.parallel.compile_policy import resolve_compile
from rrtrain.parallel.float8 import require_hardware as require_float8
from rrtrain.parallel.auto_batch import require_device as require_auto_device
from rrtrain.parallel.auto_batch import resolve_micro_batch
from rrtrain.resolve import ResolvedRun, resolve
from rrtrain.rundir import layout, own_files, writers
from rrtrain.rundir import lock as runlock
from rrtrain.rundir.metrics import MetricsLogger
from rrtrain.rundir.outcome import CANCELLED, EXIT_CODES, decide, keeps_recorded  # the ending, its status and exit code: one place
from rrtrain.rundir.readers import read_cancelled, read_final
from rrtrain.training import artifact
from rrtrain.training.checkpoint import CheckpointManager, Published
from rrtrain.training.loop import Callback, RunFacts, due
from rrtrain.training.continuation import announce, check_same_run, continue_from, lr_note, prepare_branch
from rrtrain.training.step import grad_accumulation, optimizer_step, set_matmul_precision


class Trainer:
    def __init__(self, cfg: Config) -> None:
        # data paths absolute, as config.yaml and the checkpoints record them (found from any folder)
        cfg = replace(cfg, data=absolute_data(cfg.data))
        self.cfg, self.t0 = cfg, time.time()
        self.info = dist.setup(cfg.parallel.timeout_s)
        # settings this device cannot run (float8 without float8 matmuls, micro_batch=auto without a GPU): one
        # line, before the run directory is touched
        require_float8(cfg.parallel.float8, self.info.device)
        require_auto_device(cfg, self.info.device)
        # a cooldown branch's parent (train.branch_from), checked before the run directory is touched
        self.cfg, self.parent = prepare_branch(cfg, self.info, absolute_in_saved)
        self.run_dir = Path(cfg.run.dir)
        self.status, self.reason, self.signal_name = "failed", "", None
        self.step, self.tokens, self.skipped = 0, 0, 0
        self.wall_before, self.best_val, self.last_val = 0.0, math.inf, None
        self.last_val_note: Optional[str] = None  # why the last evaluation has no loss, when it ran no batch
        self.run: Optional[ResolvedRun] = None  # set up by `setup`: the config resolved against the dataset
        self.shape: Optional[sizing.ModelShape] = None
        self.params = 0
        self.callbacks: list[Callback] = []  # attached by `fit` once set up: until then no hook is called
        self.loop: Optional[LoopView] = None  # what the callbacks see of this trainer
        self.pending: list[tuple[dict[str, Any], torch.Tensor]] = []  # steps whose values are still on the device
        self.stopping, self.checkpoint_at_end = False, True  # set by request_stop
        self.started = False  # whether the training loop began (before it, a failure leaves final.json alone)
        self.resumed_at: Optional[int] = None  # the checkpoint step this process started from
        self.resumed_callbacks: dict[str, Any] = {}  # the callbacks' states in that checkpoint
        self.saved_step: Optional[int] = None  # the step of the newest checkpoint on disk: published or resumed from
        # `init.from`'s weights (rrtrain.artifact.warm.WarmStart: .state, .record), read and checked by rrtrain.train
        self.warm_start: Optional[Any] = None
        problem = unwritable_reason(self.run_dir) if self.info.is_main else None
        dist.raise_together(f"run.dir '{self.run_dir}' cannot be written: {problem}" if problem else None)
        self.lock = runlock.hold(self.run_dir, cfg.run.lock_wait_s, self.info.is_main, self.info.device)
        try:  # a FIFO, a directory, a link where one of the run's files belongs: one line, nothing touched
            dist.raise_together(own_files.problem(self.run_dir) if self.info.is_main else None)
        except UsageError:
            if self.lock is not None:
                self.lock.release()
            raise
        dist.barrier()

    # -- set-up -------------------------------------------------------------------------------

    def setup(self) -> None:
        from rrtrain.data.loader import TrainLoader, eval_batches, read_manifest
        from rrtrain.data.verify import verify_run_data

        cfg, info = self.cfg, self.info
        t = cfg.train
        mixture = read_mixture(cfg.data) if cfg.data.sources else None  # a weighted mixture of datasets
        if mixture is not None:
            for source, source_manifest in zip(mixture.sources, mixture.manifests):
                verify_run_data(source.path, source_manifest, info.local_rank)
            manifest = mixture.manifest
        else:
            if cfg.data.path is None:
                raise UsageError("data.path is not set: point it at a directory written by `rrtrain prep` "
                                 "(or list several in data.sources)")
            manifest = read_manifest(cfg.data.path)
            verify_run_data(cfg.data.path, manifest, info.local_rank)
        run = resolve(cfg, manifest)  # the rule's spec, shape, counts and budget: worked out once, there
        cfg, _ = resolve_micro_batch(run, info.world_size, info.device, announce=info.is_main)  # "auto" -> an int
        self.cfg, t, run = cfg, cfg.train, replace(run, cfg=cfg)
        self.accum = grad_accumulation(t, info.world_size)
        b = require_budget(run.budget)
        self.shape, self.params, self.flops_per_token = run.shape, run.params, run.flops_per_token
        self.tokens_per_step, self.total_steps, self.warmup = b.tokens_per_step, b.total_steps, b.warmup_steps

        set_matmul_precision(cfg.parallel.precision)
        compiled = resolve_compile(t.compile, info.device, self.total_steps, announce=info.is_main)
        cfg = self.cfg = replace(cfg, train=replace(t, compile=compiled))  # resolved, as config.yaml records it
        self.run = replace(run, cfg=cfg)
        torch.manual_seed(t.seed)  # no weight draws from it (see below); anything else stays a function of the seed
        # on meta: the engine shards it, then materialises and initialises each rank's part from the seed,
        # the same bits at every world size and on every backend (rrtrain/parallel/materialize.py)
        self.engine = build_training_engine(cfg, run.shape, info, rule=run.rule)
        self.peak, self.peak_source = peak_flops(info.device, cfg.parallel.precision)

        # one cache per node: the ranks of a node share it through that node's streaming state (its /dev/shm),
        # which another node cannot see, so two nodes must never fill one directory
        cache = (Path(cfg.data.cache_dir) if cfg.data.cache_dir
                 else self.run_dir / layout.DATA_CACHE / socket.gethostname())
        self.loader = TrainLoader(
            cfg.data.path, micro_batch=t.micro_batch, global_batch=t.global_batch, rank=info.rank,
            world_size=info.world_size, local_rank=info.local_rank, seed=t.seed,
            num_canonical_nodes=cfg.data.num_canonical_nodes, num_workers=cfg.data.num_workers,
            cache_dir=str(cache / "train"), shuffle=cfg.data.shuffle, manifest=manifest, mixture=mixture)
        # a mixture: each source's validation split on its own (`val/<name>`), weighted as in training
        self.val_sources: list[tuple[str, float, list[torch.Tensor]]] = []
        if mixture is not None:
            for source, source_manifest in zip(mixture.sources, mixture.manifests):
                self.val_sources.append((source.name, source.weight, eval_batches(
                    source.path, micro_batch=t.micro_batch, n_batches=cfg.data.eval_batches, rank=info.rank,
                    world_size=info.world_size, cache_dir=str(cache / "val" / source.name),
                    manifest=source_manifest)))
            self.val_batches = [b for _, _, batches in self.val_sources for b in batches]
        else:
            self.val_batches = eval_batches(cfg.data.path, micro_batch=t.micro_batch,
                                            n_batches=cfg.data.eval_batches, rank=info.rank,
                                            world_size=info.world_size, cache_dir=str(cache / "val"),
                                            manifest=manifest)
        self.last_val_sources: dict[str, float] = {}
        self.fingerprint = manifest.get("fingerprint")
        self.tokenizer_ref = artifact.tokenizer_reference(  # what the artifact records of the tokenizer
            manifest, cfg.data.path or (mixture.sources[0].path if mixture is not None else None))
        self.artifact_step: Optional[int] = None  # the step of the artifact this process wrote last
        self.ckpt = CheckpointManager(self.run_dir, t.keep_ckpts, info, asynchronous=t.ckpt_async,
                                      timeout_s=cfg.parallel.timeout_s,
                                      allow_unverified=t.allow_unverified_checkpoint)

    def resume(self) -> Optional[int]:
        """Load the latest checkpoint if there is one; returns its step. The callbacks' states wait in
        `resumed_callbacks` until the callbacks exist."""
        latest = self.ckpt.latest()  # verifies every file's checksum: once per resume
        parent = self.parent if latest is None else None  # a branch starts from its parent's (checked) checkpoint
        latest = parent.checkpoint if parent is not None else latest
        if latest is None:
            return None
        state = self.ckpt.read_train_state(latest)
        self.resumed_callbacks = state.get("callbacks", {})
        saved = absolute_in_saved(state["config"])
        if parent is not None:
            check_same_run(state, parent.spec, self.fingerprint, asdict(self.shape) if self.shape else None)
        # the schedule's rules (an extension; a branch's own schedule) and the resume check (rrtrain.training.continuation)
        cfg, accepted = continue_from(state, saved, self.cfg, self.shape.seq_len, self.info.world_size, parent)
        if cfg is not self.cfg:  # the checkpoint's warmup kept
            self.cfg, self.run = cfg, replace(self.run, cfg=cfg)
            self.warmup = warmup_steps(cfg.train.warmup_steps, self.total_steps)
        self.ckpt.load(self.engine, latest)
        self.loader.load_state_dict(state["loader"], allow_change=self.cfg.train.allow_config_change)
        self.step, self.tokens = state["step"], state["tokens"]
        # a run resumed at its last step does not write the same checkpoint again (a branch has not written it)
        self.saved_step = self.step if parent is None else None
        self.skipped = state["skipped"]  # (older checkpoints also hold a "streak": never needed)
        self.wall_before, self.best_val = state["wall_s"], state["best_val_loss"]
        self.last_val = state.get("last_val_loss")
        if accepted and self.info.is_main:
            print(f"rrtrain: resuming with accepted changes: {'; '.join(accepted)}", flush=True)
        if parent is not None and self.info.is_main:
            announce(parent, lr_note(state, saved, self.cfg, self.shape.seq_len, self.total_steps, self.warmup))
        return self.step

    def train_state(self) -> dict[str, Any]:
        return {
            "step": self.step, "tokens": self.tokens, "skipped": self.skipped,
            "wall_s": self.wall_s(), "best_val_loss": self.best_val, "last_val_loss": self.last_val,
            "loader": self.loader.state_dict(), "config": self.cfg.to_dict(), "world_size": self.info.world_size,
            "fingerprint": self.fingerprint, "shape": asdict(self.shape) if self.shape else None,
            "callbacks": {c.name: c.state_dict() for c in self.callbacks},
        }

    def wall_s(self) -> float:
        return self.wall_before + (time.time() - self.t0)

    # -- one optimizer step -------------------------------------------------------------------

    def train_step(self, batches, diag: bool) -> None:
        """One optimizer step (`rrtrain.training.step.optimizer_step`, the one `rrtrain bench` times), without a host sync:
        its loss, gradient norm and skip flag stay on the device in `self.pending` until `flush_records`
        (diagnostic steps read their statistics on the host)."""
        sites = self.engine.inner.sites() if diag else []
        host: dict[str, Any] = {}
        lr = lr_schedule.lr_at(self.step, self.total_steps, self.warmup, self.cfg.train)
        out = optimizer_step(self.engine, batches, self.accum, lr, self.cfg.train.grad_clip, self.info,
                             record=sites, poison=self.injects_fault(self.step + 1),
                             before_clip=(lambda: host.update(self.diagnostics(sites))) if diag else None)
        self.step += 1
        self.tokens += self.tokens_per_step
        host.update({"step": self.step, "lr": lr, "tokens": self.tokens})
        self.pending.append((host, torch.stack([out.loss.float(), out.grad_norm.float(), out.nonfinite])))

    def records_due(self) -> bool:
        """Steps after which the pending records reach the host: the log cadence, the steps where evaluation,
        a checkpoint or the stop check follow (they see every record up to their step), and the last step.
        Every step when a callback may end the run at a record's own step (`Callback.exact_records`, e.g.
        `train.on_nonfinite=halt`, `monitor.on_stall: stop`): such a stop is exact, at one host sync per step."""
        t, step = self.cfg.train, self.step
        return (any(c.exact_records for c in self.callbacks) or step % t.log_every == 0 or step >= self.total_steps or step % t.stop_check_every == 0
                or due(step, t.eval_every, self.total_steps) or due(step, t.ckpt_every, self.total_steps))

    def flush_records(self) -> None:
        """One device-to-host transfer for all pending steps, then `on_train_records` with one record per step."""
        if not self.pending:
            return
        values = torch.stack([v for _, v in self.pending]).tolist()
        records = []
        for (host, _), (loss_v, norm_v, skipped) in zip(self.pending, values):
            diag = {k: v for k, v in host.items() if k not in ("step", "lr", "tokens")}
            rec = {**diag, "step": host["step"], "loss": loss_v, "grad_norm": norm_v, "lr": host["lr"],
                   "tokens": host["tokens"]}
            if skipped:
                rec["skipped"] = True
                self.skipped += 1
            records.append(rec)
        self.pending = []
        self.emit("on_train_records", records)

    def injects_fault(self, step: int) -> bool:
        first = self.cfg.train.fail_at_step
        return first is not None and first <= step < first + self.cfg.train.fail_steps

    def diagnostics(self, sites) -> dict[str, Any]:
        """Per-block gradient norms (the depth profile) and, for gated rules, each gate's mean and spread."""
        groups = [list(b.parameters()) for b in self.engine.inner.blocks]
        norms = self.engine.grad_sq_norms(groups).sqrt().tolist()
        out: dict[str, Any] = {"block_grad_norm": norms}
        stats = [s.stats for s in sites if s.stats]
        if stats:
            out["gate_mean"] = [float(s["gate_mean"]) for s in stats]
            out["gate_std"] = [float(s["gate_std"]) for s in stats]
            out["gate_hist"] = [s["gate_hist"].tolist() for s in stats if "gate_hist" in s]
            for s in sites:
                s.stats = {}
        return out

    @torch.no_grad()
    def evaluate(self) -> float:
        if self.val_sources:
            return self.evaluate_sources()
        total = torch.zeros(2, device=self.info.device)
        for batch in self.val_batches:
            batch = batch.to(self.info.device)
            total[0] += self.engine.forward(batch[:, :-1], batch[:, 1:]).float()
            total[1] += 1
        dist.all_reduce(total)
        ran = total[1].item() > 0
        val = (total[0] / total[1]).item() if ran else math.nan  # no batch ran: no loss (never 0.0)
        self.last_val, self.last_val_note = val, None if ran else "no evaluation batch ran"
        self.best_val = min(self.best_val, val) if math.isfinite(val) else self.best_val
        return val

    @torch.no_grad()
    def evaluate_sources(self) -> float:
        """A mixture's validation: each source's loss over its own batches (`last_val_sources`), and the
        validation loss, their mean weighted as the sources are in training."""
        total = torch.zeros(len(self.val_sources), 2, device=self.info.device)
        for i, (_, _, batches) in enumerate(self.val_sources):
            for batch in batches:
                batch = batch.to(self.info.device)
                total[i, 0] += self.engine.forward(batch[:, :-1], batch[:, 1:]).float()
                total[i, 1] += 1
        dist.all_reduce(total)
        sums, counts = total.tolist(), [c for _, c in total.tolist()]
        per = [s / c if c > 0 else math.nan for s, c in sums]
        self.last_val_sources = {name: v for (name, _, _), v in zip(self.val_sources, per)}
        ran = all(c > 0 for c in counts)
        weights = [w for _, w, _ in self.val_sources]
        val = sum(w * v for w, v in zip(weights, per)) / sum(weights) if ran else math.nan
        self.last_val, self.last_val_note = val, None if ran else "no evaluation batch ran"
        self.best_val = min(self.best_val, val) if math.isfinite(val) else self.best_val
        return val

    @torch.no_grad()
    def logits(self, idx: torch.Tensor) -> torch.Tensor:
        """The model's logits for `idx` as it is now, in eval mode (its mode restored after), for evaluations
        inside training (rrtrain.eval.callback). Through the wrapped model: a collective under sharding."""
        model = self.engine.model
        training = model.training
        model.eval()
        try:
            with self.engine.autocast():
                return model(idx.to(self.info.device))
        finally:
            model.train(training)

    # -- the loop -----------------------------------------------------------------------------

    def fit(self, callbacks: list[Callback]) -> str:
        """Train to an ending with `callbacks` (composed by `rrtrain.train`), highest priority first."""
        self.setup()
        resumed = self.resume()
        if resumed is None and self.warm_start is not None:
            self.apply_warm_start()
        self.callbacks = sorted(callbacks, key=lambda c: -c.priority)
        self.load_callback_states(self.resumed_callbacks)
        if self.info.is_main:  # before metrics.jsonl exists: whoever finds the run (the dashboard) can tell what it is
            atomic_write_text(self.run_dir / "config.yaml", yaml.safe_dump(self.cfg.to_dict(), sort_keys=False))
            record = parametrization_record(self.engine.inner, self.cfg.train)  # mup/completep only
            if record is not None:
                writers.write_parametrization(self.run_dir, record)
        self.log = MetricsLogger(self.run_dir, self.info.is_main, resume_step=resumed)
        self.loop = LoopView(self, self.facts())
        batches = iter(self.loader)
        self.status, self.resumed_at = "completed", resumed
        try:
            self.started = True
            self.emit("on_start")
            while self.step < self.total_steps and not self.stopping:
                self.emit("on_step_start")
                diag = due(self.step + 1, self.cfg.train.diag_every, self.total_steps + 1)
                self.train_step(batches, diag)
                if self.records_due():
                    self.flush_records()
                if not self.stopping:
                    self.emit("on_step_end")
                if due(self.step, self.cfg.train.artifact_every, self.total_steps):
                    self.write_artifact()
            self.flush_records()
            if self.status != "preempted" and self.checkpoint_at_end:
                self.run_eval()
            self.finish_checkpoint()  # whatever the ending, a save in flight is published before the run ends
            if self.checkpoint_at_end:
                self.save_checkpoint()
                if self.status != "preempted":  # a preemption has a deadline; its checkpoint exports all the same
                    self.write_artifact()
        finally:
            self.log.close()
            self.loader.close()  # stop loader workers before the process group goes
        return self.status

    def facts(self) -> RunFacts:
        info = self.info
        return RunFacts(config=self.cfg, run=self.run, run_dir=self.run_dir, rank=info.rank,
                        world_size=info.world_size, is_main=info.is_main, device=info.device, params=self.params,
                        seq_len=self.shape.seq_len, tokens_per_step=self.tokens_per_step, accum=self.accum,
                        warmup_steps=self.warmup, flops_per_token=self.flops_per_token, peak_flops=self.peak)

    def emit(self, hook: str, *args: Any) -> None:
        """Call `hook` on every callback, highest priority first; none before the loop exists (a requeue's
        SystemExit or an error can end `fit` between attaching the callbacks and making the loop they read)."""
        if self.loop is None:
            return
        for callback in self.callbacks:
            getattr(callback, hook)(self.loop, *args)

    def request_stop(self, status: str, reason: str, checkpoint: bool = True, signal: Optional[str] = None) -> None:
        """End the run at this step boundary (the first request wins); `checkpoint` saves the state first."""
        if not self.stopping:
            self.stopping, self.status, self.reason, self.checkpoint_at_end = True, status, reason, checkpoint
            self.signal_name = signal

    def any_rank(self, flag: int) -> int:
        """Collective: the largest `flag` of any rank (`Loop.any_rank`). The same all-reduce says whether the
        checkpoint in flight is written on every rank; it is then published (waiting for nothing)."""
        mine = [float(int(flag)), 1.0 if self.ckpt.writing() else 0.0]
        raised, writing = dist.all_reduce(torch.tensor(mine, device=self.info.device), "max").tolist()
        if self.ckpt.in_flight is not None and not writing:
            self.finish_checkpoint()
        return int(raised)

    def raise_flag(self, name: str, step: int, detail: str) -> None:
        self.emit("on_flag", {"kind": "flag", "step": step, "flag": name, "detail": detail})

    def run_eval(self) -> float:
        record = {"step": self.step, "val_loss": self.evaluate(), "tokens": self.tokens}
        record.update({f"val/{name}": v for name, v in self.last_val_sources.items()})
        self.emit("on_eval", record)
        return record["val_loss"]

    def save_checkpoint(self, background: bool = False) -> None:
        """Collective. A checkpoint of this step; a save still in flight is published first (at most one is in
        flight) and a step already saved is not saved again. With `background` and `train.ckpt_async` the
        write goes on while the loop trains; `finish_checkpoint` publishes it."""
        self.finish_checkpoint()
        if self.saved_step == self.step:
            return
        if background and self.cfg.train.ckpt_async:
            self.ckpt.start(self.engine, self.step, self.train_state())
        else:
            self.published(self.ckpt.save(self.engine, self.step, self.train_state()))

    def apply_warm_start(self) -> None:
        """Collective. A fresh run's weights from `init.from` (optimizer and schedule fresh); where they came from
        into RUN/init.json (rank 0)."""
        self.engine.load_model_state(self.warm_start.state)
        if self.info.is_main:
            atomic_write_json(self.run_dir / layout.INIT, self.warm_start.record)
        self.warm_start = None  # the tensors are the model's now

    def write_artifact(self) -> None:
        """Collective. The model artifact of this step (rrtrain/training/artifact.py), once per step."""
        if self.artifact_step == self.step:
            return
        if (self.run_dir / layout.ARTIFACT / artifact.step_name(self.step) / artifact.SPEC).is_file():
            self.artifact_step = self.step  # written by an earlier process of this run (resumed at this step)
            return
        artifact.write(self.engine, self.run_dir, self.step, self.tokens, self.last_val, self.tokenizer_ref,
                       self.info.is_main)
        self.artifact_step = self.step

    def finish_checkpoint(self) -> None:
        """Collective. Waits for the save in flight, if any, to be written on every rank and publishes it."""
        done = self.ckpt.finish()
        if done is not None:
            self.published(done)

    def published(self, done: Published) -> None:
        self.saved_step = done.step
        self.emit("on_checkpoint", {"kind": "checkpoint", "step": done.step, "published_at": self.step,
                                    "blocking_s": round(done.blocking_s, 6), "write_s": round(done.write_s, 6)})

    def load_callback_states(self, states: dict[str, Any]) -> None:
        """Each callback's state from the checkpoint; one that does not fit its callback is one line naming it
        (the checkpoint's train state is checked for shape, not each callback's contents)."""
        for callback in self.callbacks:
            if callback.name in states:
                try:
                    callback.load_state_dict(states[callback.name])
                except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as err:
                    raise UsageError(f"the checkpoint's train_state.json: callbacks.{callback.name} does not fit "
                                     f"the callback ({type(err).__name__}: {err})".splitlines()[0]) from None

    def write_final(self) -> bool:
        """Rank 0 writes final.json; False (after saying why) when it cannot be written, e.g. on a full disk.

        Every rank settles the ending first (`rrtrain.rundir.outcome.decide`), so all exit alike: a run that
        `rrtrain sweep --cancel-flagged` stopped (its cancelled.json was written before the signal) ends as
        what it was flagged, and final.json says so, and why, when it is written."""
        ending = decide(self.status, self.reason, read_cancelled(self.run_dir))
        self.status, self.reason = ending.status, ending.reason
        if not self.info.is_main:
            return True
        recorded = read_final(self.run_dir)
        if keeps_recorded(recorded.status if recorded else None, self.status, self.started):
            # the attempt's error is the caller's one line; final.json keeps the ending it records
            if self.lock is not None:
                self.lock.release()
            return True
        cfg = self.cfg
        raised = self.raised_flags()
        flags, details = self.flags(), {k: v["detail"] for k, v in raised.items()}
        marker = ending.cancelled
        if marker is not None:
            flags += [] if CANCELLED in flags else [CANCELLED]
            details[CANCELLED] = marker.reason
        final = {
            "status": self.status, "step": self.step, "tokens": self.tokens,
            "final_val_loss": self.last_val if self.last_val is not None and math.isfinite(self.last_val) else None,
            "best_val_loss": self.best_val if math.isfinite(self.best_val) else None,
            "params": self.params, "variant": cfg.model.variant, "size": cfg.model.size, "seed": cfg.train.seed,
            "wall_s": round(self.wall_s(), 3), "flags": flags, "flag_steps": {k: v["step"] for k, v in raised.items()},
            "flag_details": details,
            "exit_code": ending.exit_code,
            "nonfinite_skipped": self.skipped, "reason": self.reason, "signal": self.signal_name,
            "cancelled": None if marker is None else {"reason": marker.reason, "flags": list(marker.flags),
                                                      "time": marker.time},
            "world_size": self.info.world_size, "backend": cfg.parallel.backend,
            "shape": asdict(self.shape) if self.shape else None,
        }
        if self.last_val is not None and final["final_val_loss"] is None:  # JSON has no NaN: null, and why
            final["final_val_loss_note"] = self.last_val_note or f"the last evaluation's loss was {self.last_val}"
        try:
            writers.write_final(self.run_dir, final)
        except OSError as err:
            print(f"rrtrain train: error: cannot write {self.run_dir / layout.FINAL} ({err.strerror or err}); "
                  f"the run ended {self.status}", file=sys.stderr, flush=True)
            return False
        finally:
            if self.lock is not None:  # final.json is this copy's last write: the directory is free again
                self.lock.release()
        return True

    def fail_final(self, reason: str) -> None:
        """The run failed for `reason`: final.json says so (rank 0)."""
        self.status, self.reason = "failed", reason
        self.write_final()

    def raised_flags(self) -> dict[str, dict[str, Any]]:
        """Every callback's flags: name -> {"step", "detail"}."""
        raised: dict[str, dict[str, Any]] = {}
        for callback in self.callbacks:
            raised.update(callback.raised_flags())
        return raised

    def flags(self) -> list[str]:
        out = ["nonfinite_steps"] if self.skipped else []
        out += list(self.raised_flags())
        if self.status == "diverged" and "diverged" not in out:
            out.append("diverged")
        return out



class LoopView:
    """The `rrtrain.training.loop.Loop` a trainer hands its callbacks: its progress, read-only, and its
    requests; nothing else of the trainer is reachable from a callback."""

    def __init__(self, trainer: Trainer, facts: RunFacts) -> None:
        self._trainer, self.facts, self.metrics = trainer, facts, trainer.log

    @property
    def step(self) -> int:
        return self._trainer.step

    @property
    def total_steps(self) -> int:
        return self._trainer.total_steps

    @property
    def tokens(self) -> int:
        return self._trainer.tokens

    @property
    def resumed_at(self) -> Optional[int]:
        return self._trainer.resumed_at

    @property
    def status(self) -> str:
        return self._trainer.status

    @property
    def reason(self) -> str:
        return self._trainer.reason

    @property
    def last_val_loss(self) -> Optional[float]:
        return self._trainer.last_val

    def wall_s(self) -> float:
        return self._trainer.wall_s()

    def request_stop(self, status: str, reason: str, checkpoint: bool = True, signal: Optional[str] = None) -> None:
        if status not in EXIT_CODES:  # final.json's status and the exit code follow from it
            raise ValueError(f"request_stop: status must be one of {sorted(EXIT_CODES)}, got {status!r}")
        self._trainer.request_stop(status, reason, checkpoint, signal)

    def raise_flag(self, name: str, step: int, detail: str) -> None:
        self._trainer.raise_flag(name, step, detail)

    def run_eval(self) -> float:
        return self._trainer.run_eval()

    def save_checkpoint(self, background: bool = False) -> None:
        self._trainer.save_checkpoint(background)

    def any_rank(self, flag: int) -> int:
        return self._trainer.any_rank(flag)

    def logits(self, idx: Any) -> Any:
        return self._trainer.logits(idx)
