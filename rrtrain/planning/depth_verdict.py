"""The depth study's verdict on one run, and its table: pure (no torch), so it is tested on recorded metrics.

A run is judged by what the convergence monitor (`rrtrain.monitoring.convergence.LossMonitor`) raised while it
trained and by where its loss ended against the data's unigram entropy, in this order:

- `diverged`: the monitor raised `diverged`, or the run stopped on consecutive non-finite steps, or its last
  loss is not finite;
- `stalled`: the monitor raised `stalled` (a plateau above the unigram entropy, at step N);
- `trained`: the final loss (the mean of the last `tail` finite losses) is below the entropy minus the monitor's
  margin: the run learned more than token frequencies;
- `undecided`: none of these within the steps it had (still above the entropy, but still descending).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional

from rrtrain.monitoring.convergence import DIVERGED, STALLED

TRAINED, UNDECIDED = "trained", "undecided"


def final_loss(losses: list[float], tail: int = 10) -> Optional[float]:
    """Mean of the last `tail` finite losses; None when there is none."""
    finite = [x for x in losses if math.isfinite(x)]
    return sum(finite[-tail:]) / len(finite[-tail:]) if finite else None


def verdict(losses: list[float], flags: dict[str, dict[str, Any]], entropy: float, margin: float,
            nonfinite_stop: Optional[int] = None, tail: int = 10) -> dict[str, Any]:
    """`{"verdict", "at_step", "final_loss", "vs_entropy"}` for a run whose per-step training losses were `losses`
    and whose monitor raised `flags` (name -> {"step", "detail"}); `nonfinite_stop`: the step at which it was
    stopped for non-finite steps, if it was."""
    final = final_loss(losses, tail)
    out: dict[str, Any] = {"final_loss": final, "vs_entropy": None if final is None else final - entropy,
                           "at_step": None}
    if DIVERGED in flags:
        out.update(verdict=DIVERGED, at_step=flags[DIVERGED]["step"])
    elif nonfinite_stop is not None or (losses and not math.isfinite(losses[-1])):
        out.update(verdict=DIVERGED, at_step=nonfinite_stop if nonfinite_stop is not None else len(losses))
    elif STALLED in flags:
        out.update(verdict=STALLED, at_step=flags[STALLED]["step"])
    elif final is not None and final < entropy - margin:
        out["verdict"] = TRAINED
    else:
        out["verdict"] = UNDECIDED
    return out


def grad_ratio(norms: Optional[list[float]]) -> Optional[float]:
    """G = first block's gradient norm / last block's (docs/depth.md's measure (a)); None when unknown."""
    if not norms or len(norms) < 2 or not norms[-1] or not all(math.isfinite(x) for x in (norms[0], norms[-1])):
        return None
    return norms[0] / norms[-1]


def _num(x: Optional[float], fmt: str) -> str:
    return "—" if x is None or not math.isfinite(x) else format(x, fmt)


def render(rows: Iterable[dict[str, Any]]) -> str:
    """The markdown table, one line per (shape, rule, lr); rows that failed or were skipped are listed after it."""
    rows = list(rows)
    done = [r for r in rows if "verdict" in r]
    lines = []
    if done:
        r0 = done[0]
        lines += [f"depth study: {r0['tokenizer']} synthetic stories, unigram entropy {r0['unigram_entropy']:.3f} "
                  f"nats; {r0['precision']}, {r0['micro_batch']} x {r0['seq_len']} tokens per step, monitor window "
                  f"{r0['monitor']['window']} from step {r0['monitor']['min_steps']}",
                  "",
                  "| shape | sublayers | rule | lr | verdict | steps | final loss | − entropy | held-out loss "
                  "| G first/last block: init → end | block grad norms at the end: first / mid / last |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in done:
            v = r["verdict"] + (f" at {r['at_step']}" if r.get("at_step") is not None else "")
            if r.get("time_capped"):
                v += " (time cap)"
            n = r.get("block_grad_norm") or []
            norms = " / ".join(_num(x, ".3g") for x in (n[0], n[len(n) // 2], n[-1])) if n else "—"
            g = f"{_num(grad_ratio(r.get('block_grad_norm_init')), '.3g')} → {_num(grad_ratio(n), '.3g')}"
            lines.append(f"| {r['shape_name']} | {r['sublayers']} | {r['rule']} | {r['lr']:.3g} | {v} | "
                         f"{r['steps_done']}/{r['steps']} | {_num(r['final_loss'], '.3f')} | "
                         f"{_num(r['vs_entropy'], '+.3f')} | {_num(r.get('val_loss'), '.3f')} | {g} | {norms} |")
    for r in rows:
        if "verdict" not in r:
            lines.append(f"not run: {r.get('shape_name')} {r.get('rule')} lr={r.get('lr')}: "
                         f"{r.get('error') or 'skipped, ' + str(r.get('skipped'))}")
    return "\n".join(lines)
