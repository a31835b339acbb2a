"""What a person running `rrtrain train` sees on rank 0: a header, a line every `train.log_every` steps,
each monitor flag the moment it is raised, and one line saying how the run ended."""

from __future__ import annotations

import math
import sys
import time
from typing import Any, Optional, TextIO

from rrtrain.training.loop import Callback, Loop


def duration(seconds: float) -> str:
    """`42s`, `3m05s`, `2h07m`: short enough for a progress line."""
    s = int(round(max(seconds, 0.0)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _num(value: Optional[float], fmt: str) -> str:
    return "nan" if value is None or not math.isfinite(value) else format(value, fmt)


def progress_line(rec: dict[str, Any], total: int, val: Optional[float], elapsed: float, eta: Optional[float]) -> str:
    parts = [f"step {rec['step']}/{total}", f"loss {_num(rec.get('loss'), '.4f')}"]
    if val is not None:
        parts.append(f"val {_num(val, '.4f')}")
    parts += [f"lr {rec['lr']:.2e}", f"gnorm {_num(rec.get('grad_norm'), '.3f')}"]
    if "tokens_per_s" in rec:
        parts += [f"tok/s {rec['tokens_per_s']:,.0f}", f"mfu {100 * rec['mfu']:.2f}%", f"mem {rec['mem_gb']:.2f}GB"]
    parts.append(f"elapsed {duration(elapsed)}")
    if eta is not None:
        parts.append(f"eta {duration(eta)}")
    return "rrtrain: " + " | ".join(parts)


class Console(Callback):
    """Prints on rank 0 only; every other rank keeps quiet."""

    name, priority = "console", 60

    def __init__(self, log_every: int, out: TextIO | None = None) -> None:
        self.log_every = log_every
        self.out = out or sys.stdout
        self.val: Optional[float] = None  # a validation loss not yet shown
        self.t0, self.step0 = time.time(), 0

    def say(self, loop: Loop, text: str) -> None:
        if loop.facts.is_main:
            print(text, file=self.out, flush=True)

    def on_start(self, loop: Loop) -> None:
        f, cfg = loop.facts, loop.facts.config
        self.t0, self.step0 = time.time(), loop.step
        resumed = f", resumed at step {loop.step}" if loop.resumed_at is not None else ""
        self.say(loop, f"rrtrain: {cfg.model.variant} {cfg.model.size} seed {cfg.train.seed}: {f.params:,} params, "
                 f"{loop.total_steps} steps x {cfg.train.global_batch} seqs x {f.seq_len} tokens, "
                 f"world {f.world_size} x accum {f.accum}{resumed}")

    def on_train_records(self, loop: Loop, records: list[dict[str, Any]]) -> None:
        for rec in records:
            if rec["step"] % self.log_every and rec["step"] != loop.total_steps:
                continue
            done = rec["step"] - self.step0
            spent = time.time() - self.t0
            eta = spent / done * (loop.total_steps - rec["step"]) if done > 0 else None
            self.say(loop, progress_line(rec, loop.total_steps, self.val, loop.wall_s(), eta))
            self.val = None

    def on_eval(self, loop: Loop, record: dict[str, Any]) -> None:
        self.val = record["val_loss"]

    def on_flag(self, loop: Loop, flag: dict[str, Any]) -> None:
        self.say(loop, f"rrtrain: FLAG {flag['flag']} at step {flag['step']}: {flag['detail']}")

    def on_end(self, loop: Loop) -> None:
        val = _num(loop.last_val_loss, ".4f") if loop.last_val_loss is not None else "none"
        reason = f" ({loop.reason})" if loop.reason and loop.status != "completed" else ""
        self.say(loop, f"rrtrain: {loop.status}{reason} at step {loop.step}/{loop.total_steps}, "
                 f"final val loss {val}, wall {duration(loop.wall_s())}; {loop.facts.run_dir / 'final.json'}")
