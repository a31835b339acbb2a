"""The training loop: one code path for one CPU process, FSDP2 and DeepSpeed ZeRO.

A run is a function of its config and seed. Per optimizer step it reads `global_batch` sequences
(micro-batches x ranks x accumulation), steps AdamW on the warmup-cosine schedule, logs, evaluates and
checkpoints on their cadences, and stops cleanly at a step boundary on a signal. Starting a run whose
directory holds a checkpoint resumes it exactly.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import torch
import yaml

from rrtrain import dist, runlock, sizing
from rrtrain.checkpoint import CheckpointManager, check_resume
from rrtrain.config import Config
from rrtrain.errors import UsageError
from rrtrain.hardware import peak_flops, peak_memory_gb
from rrtrain.io import atomic_write_json, atomic_write_text
from rrtrain.metrics import MetricsLogger
from rrtrain.model import build_model
from rrtrain.optim import lr_at
from rrtrain.parallel import build_engine
from rrtrain.signals import StopFlag

EXIT_CODES = {"completed": 0, "failed": 1, "diverged": 3, "stalled": 4, "preempted": 75}


def resolve_model_shape(cfg: Config, data_vocab: Optional[int], data_seq_len: Optional[int]) -> sizing.ModelShape:
    """The model's shape: preset + overrides, the dataset's vocabulary and sequence length unless set,
    widened to the reference variant's parameter count when `match.reference` is set."""
    m = cfg.model
    if data_seq_len is not None and m.seq_len is not None and m.seq_len != data_seq_len:
        raise UsageError(f"model.seq_len={m.seq_len} but the dataset was packed with seq_len={data_seq_len}")
    base = sizing.resolve_shape(m, data_vocab)
    if data_seq_len is not None:
        base = sizing.ModelShape(**{**asdict(base), "seq_len": data_seq_len})
    if data_vocab is not None and base.vocab_size < data_vocab:
        raise UsageError(f"dataset vocabulary {data_vocab} does not fit the model's vocab_size {base.vocab_size}")
    ref = cfg.match.reference
    if ref is None or ref == m.variant:
        return base
    target = sizing.count_params(base, ref, m.residual)
    return sizing.match_shape(base, m.variant, m.residual, target, cfg.match.widen, cfg.match.tolerance)


class Trainer:
    def __init__(self, cfg: Config) -> None:
        self.cfg, self.t0 = cfg, time.time()
        self.info = dist.setup(cfg.parallel.timeout_s)
        self.run_dir = Path(cfg.run.dir)
        self.status, self.reason, self.signal_name = "failed", "", None
        self.step, self.tokens, self.skipped, self.streak = 0, 0, 0, 0
        self.wall_before, self.best_val, self.last_val = 0.0, math.inf, None
        self.shape: Optional[sizing.ModelShape] = None
        self.params = 0
        if self.info.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        self.lock = runlock.hold(self.run_dir, cfg.run.lock_wait_s, self.info.is_main, self.info.device)
        dist.barrier()

    # -- set-up -------------------------------------------------------------------------------

    def setup(self) -> None:
        from rrtrain.data import TrainLoader, check_vocab, eval_batches, read_manifest

        cfg, info = self.cfg, self.info
        t = cfg.train
        if cfg.data.path is None:
            raise UsageError("data.path is not set: point it at a directory written by `rrtrain prep`")
        manifest = read_manifest(cfg.data.path)
        self.shape = resolve_model_shape(cfg, manifest["vocab_size"], manifest["seq_len"])
        check_vocab(manifest, self.shape.vocab_size)
        per_step = t.micro_batch * info.world_size
        if t.global_batch % per_step:
            raise UsageError(f"train.global_batch={t.global_batch} is not a multiple of train.micro_batch "
                             f"({t.micro_batch}) x world size ({info.world_size})")
        self.accum = t.global_batch // per_step
        self.tokens_per_step = t.global_batch * self.shape.seq_len
        if t.max_steps is not None:
            self.total_steps = t.max_steps
        elif t.tokens is not None:
            self.total_steps = max(1, t.tokens // self.tokens_per_step)
        else:
            raise UsageError("set train.max_steps or train.tokens (the run's budget)")
        self.warmup = t.warmup_steps if t.warmup_steps is not None else max(1, self.total_steps // 20)

        if cfg.parallel.precision == "fp32_tf32":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        torch.manual_seed(t.seed)  # identical initial weights on every rank and every world size
        model = build_model(cfg.model, shape=self.shape)
        self.params = sizing.count_params(self.shape, cfg.model.variant, cfg.model.residual)
        self.engine = build_engine(model, cfg, info)
        self.flops_per_token = sizing.flops_per_token(self.shape, cfg.model.variant, cfg.model.residual)
        self.peak, self.peak_source = peak_flops(info.device, cfg.parallel.precision)

        cache = Path(cfg.data.cache_dir) if cfg.data.cache_dir else self.run_dir / "data_cache"
        self.loader = TrainLoader(
            cfg.data.path, micro_batch=t.micro_batch, global_batch=t.global_batch, rank=info.rank,
            world_size=info.world_size, local_rank=info.local_rank, seed=t.seed,
            num_canonical_nodes=cfg.data.num_canonical_nodes, num_workers=cfg.data.num_workers,
            cache_dir=str(cache / "train"), shuffle=cfg.data.shuffle)
        self.val_batches = eval_batches(cfg.data.path, micro_batch=t.micro_batch, n_batches=cfg.data.eval_batches,
                                        rank=info.rank, world_size=info.world_size, cache_dir=str(cache / "val"))
        self.fingerprint = manifest.get("fingerprint")
        self.ckpt = CheckpointManager(self.run_dir, t.keep_ckpts, info)

    def resume(self) -> Optional[int]:
        """Load the latest checkpoint if there is one; returns its step."""
        latest = self.ckpt.latest()
        if latest is None:
            return None
        state = self.ckpt.read_train_state(latest)
        accepted = check_resume(state["config"], self.cfg.to_dict(), state["world_size"], self.info.world_size,
                                self.cfg.train.allow_config_change)
        self.ckpt.load(self.engine, latest)
        self.loader.load_state_dict(state["loader"], allow_change=self.cfg.train.allow_config_change)
        self.step, self.tokens = state["step"], state["tokens"]
        self.skipped, self.streak = state["skipped"], state["streak"]
        self.wall_before, self.best_val = state["wall_s"], state["best_val_loss"]
        self.last_val = state.get("last_val_loss")
        if accepted and self.info.is_main:
            print(f"rrtrain: resuming with accepted changes: {'; '.join(accepted)}", flush=True)
        return self.step

    def train_state(self) -> dict[str, Any]:
        return {
            "step": self.step, "tokens": self.tokens, "skipped": self.skipped, "streak": self.streak,
            "wall_s": self.wall_s(), "best_val_loss": self.best_val, "last_val_loss": self.last_val,
            "loader": self.loader.state_dict(), "config": self.cfg.to_dict(), "world_size": self.info.world_size,
            "fingerprint": self.fingerprint, "shape": asdict(self.shape) if self.shape else None,
        }

    def wall_s(self) -> float:
        return self.wall_before + (time.time() - self.t0)

    # -- one optimizer step -------------------------------------------------------------------

    def train_step(self, batches, diag: bool) -> dict[str, Any]:
        engine, device = self.engine, self.info.device
        sites = engine.inner.sites()
        for s in sites:
            s.record = diag
        loss_sum = torch.zeros((), device=device)
        for micro in range(self.accum):
            batch = next(batches).to(device, non_blocking=True)
            loss = engine.forward(batch[:, :-1], batch[:, 1:])
            if self.injects_fault(self.step + 1):
                loss = loss * float("nan")  # injected fault, for testing the non-finite paths
            engine.backward(loss / self.accum, last_micro=micro == self.accum - 1)
            loss_sum += loss.detach().float()
            for s in sites:
                s.record = False
        loss_mean = dist.all_reduce(loss_sum / self.accum) / self.info.world_size
        record: dict[str, Any] = {}
        if diag:
            record.update(self.diagnostics(sites))
        grad_norm = engine.clip_grad_norm(self.cfg.train.grad_clip)
        loss_v, norm_v = torch.stack([loss_mean, grad_norm.to(device)]).tolist()
        lr = lr_at(self.step, self.total_steps, self.cfg.train.lr, self.warmup, self.cfg.train.min_lr_ratio)
        finite = math.isfinite(loss_v) and math.isfinite(norm_v)
        if finite:
            engine.step(lr)
            self.streak = 0
        else:
            engine.skip()
            self.skipped += 1
            self.streak += 1
        self.step += 1
        self.tokens += self.tokens_per_step
        record.update({"step": self.step, "loss": loss_v, "grad_norm": norm_v, "lr": lr, "tokens": self.tokens})
        if not finite:
            record["skipped"] = True
        return record

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
            for s in sites:
                s.stats = {}
        return out

    @torch.no_grad()
    def evaluate(self) -> float:
        total = torch.zeros(2, device=self.info.device)
        for batch in self.val_batches:
            batch = batch.to(self.info.device)
            total[0] += self.engine.forward(batch[:, :-1], batch[:, 1:]).float()
            total[1] += 1
        dist.all_reduce(total)
        val = (total[0] / total[1].clamp(min=1)).item()
        self.last_val = val
        self.best_val = min(self.best_val, val) if math.isfinite(val) else self.best_val
        return val

    # -- the loop -----------------------------------------------------------------------------

    def fit(self) -> str:
        cfg, t, info = self.cfg, self.cfg.train, self.info
        self.setup()
        resumed = self.resume()
        log = MetricsLogger(self.run_dir, info.is_main, resume_step=resumed)
        if info.is_main:
            atomic_write_text(self.run_dir / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
            print(f"rrtrain: {cfg.model.variant} {cfg.model.size} seed {t.seed}: {self.params:,} params, "
                  f"{self.total_steps} steps x {t.global_batch} seqs x {self.shape.seq_len} tokens, "
                  f"world {info.world_size} x accum {self.accum}"
                  + (f", resumed at step {resumed}" if resumed is not None else ""), flush=True)
        stop = StopFlag().install()
        batches = iter(self.loader)
        window_tokens, window_time = 0, 0.0
        self.status = "completed"
        try:
            while self.step < self.total_steps:
                diag = t.diag_every > 0 and (self.step + 1) % t.diag_every == 0
                t_step = time.perf_counter()
                record = self.train_step(batches, diag)
                window_time += time.perf_counter() - t_step
                window_tokens += self.tokens_per_step
                if self.step % t.log_every == 0 or self.step == self.total_steps:
                    tps = window_tokens / max(window_time, 1e-9)
                    record.update({"tokens_per_s": tps, "mfu": self.flops_per_token * tps / info.world_size / self.peak,
                                   "mem_gb": peak_memory_gb(info.device)})
                    window_tokens, window_time = 0, 0.0
                diag_keys = ("block_grad_norm", "gate_mean", "gate_std")
                diag_rec = {k: record.pop(k) for k in diag_keys if k in record}
                log.log(record)
                if diag_rec:
                    log.log({"kind": "diag", "step": self.step, **diag_rec}, tb_prefix="diag")
                if record.get("skipped") and (t.on_nonfinite == "halt" or self.streak >= t.max_nonfinite):
                    self.status = "diverged"
                    self.reason = f"non-finite loss or gradients for {self.streak} step(s) in a row at step {self.step}"
                    break
                if t.eval_every and self.step % t.eval_every == 0 and self.step < self.total_steps:
                    log.log({"step": self.step, "val_loss": self.evaluate(), "tokens": self.tokens}, tb_prefix="eval")
                if t.ckpt_every and self.step % t.ckpt_every == 0 and self.step < self.total_steps:
                    self.ckpt.save(self.engine, self.step, self.train_state())
                flag = dist.all_reduce(torch.tensor([1.0 if stop.signum else 0.0], device=info.device), "max")
                if flag.item() > 0:
                    self.status, self.signal_name = "preempted", stop.name or "remote"
                    self.reason = f"stopped by {self.signal_name} at step {self.step}"
                    break
            if self.status == "completed":
                log.log({"step": self.step, "val_loss": self.evaluate(), "tokens": self.tokens}, tb_prefix="eval")
            if self.status in ("completed", "preempted"):
                self.ckpt.save(self.engine, self.step, self.train_state())
        finally:
            stop.restore()
            log.close()
            self.loader.close()  # stop loader workers before the process group goes
        return self.status

    def write_final(self) -> None:
        if not self.info.is_main:
            return
        cfg = self.cfg
        final = {
            "status": self.status, "step": self.step, "tokens": self.tokens,
            "final_val_loss": self.last_val,
            "best_val_loss": self.best_val if math.isfinite(self.best_val) else None,
            "params": self.params, "variant": cfg.model.variant, "size": cfg.model.size, "seed": cfg.train.seed,
            "wall_s": round(self.wall_s(), 3), "flags": self.flags(), "exit_code": EXIT_CODES[self.status],
            "nonfinite_skipped": self.skipped, "reason": self.reason, "signal": self.signal_name,
            "world_size": self.info.world_size, "backend": cfg.parallel.backend,
            "shape": asdict(self.shape) if self.shape else None,
        }
        atomic_write_json(self.run_dir / "final.json", final)
        if self.lock is not None:  # final.json is this copy's last write: the directory is free again
            self.lock.release()

    def flags(self) -> list[str]:
        out = []
        if self.skipped:
            out.append("nonfinite_steps")
        if self.status == "diverged":
            out.append("diverged")
        return out


def run(cfg: Config) -> int:
    """Run one training job to any ending; always leaves final.json; returns the process exit code.

    A second copy of a run whose directory is locked by a live process writes nothing and returns 73."""
    try:
        trainer = Trainer(cfg)
    except runlock.RunLocked as err:
        print(f"rrtrain: {err}", file=sys.stderr, flush=True)
        return runlock.LOCKED_EXIT
    try:
        trainer.fit()
    except UsageError as err:
        trainer.status, trainer.reason = "failed", str(err)
        trainer.write_final()
        raise
    except BaseException as err:
        trainer.status, trainer.reason = "failed", f"{type(err).__name__}: {err}".splitlines()[0]
        trainer.write_final()
        raise
    trainer.write_final()
    dist.barrier()
    dist.teardown()
    return EXIT_CODES[trainer.status]
