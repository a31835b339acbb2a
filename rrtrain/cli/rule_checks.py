"""The generic checks every residual rule must pass, whoever wrote it (`rrtrain check-rule NAME`).

None of them needs a reference implementation of the rule: they hold the rule to properties any rule has.
    sanity   a tiny model trains a step: finite loss and a finite gradient for every parameter, in fp32 and
             under bf16 autocast; the same seed builds the same weights whatever torch's global generator
             holds (the init draws from the unit's `generator`); `no_decay` names real parameters;
             a gated rule records its gate statistics on a diagnostic step
    params   the spec's analytic count equals the built modules' (at two widths and depths), and
             `sizing.count_params` equals the built model's
    compile  dynamo traces the block (both sites, both sublayers) with fullgraph=True, forward and backward,
             on a plain and a diagnostic step, and the compiled block computes what the eager one does
    resume   8 steps straight equal, bit for bit, 4 steps then a resume to 8 (a real `rrtrain.train`)
    fsdp     2 ranks under FSDP2 (torchrun, gloo on CPU) match one process to 1e-4 over 6 steps
The last two train through `python -m rrtrain.train` in subprocesses on a tiny dataset.
"""

from __future__ import annotations

import math
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import yaml

from rrtrain import residuals, sizing
from rrtrain.config import ModelConfig
from rrtrain.core import files
from rrtrain.core.child_python import child_env, module_argv
from rrtrain.residuals import RuleKnobs, SiteInfo, StreamInfo
from rrtrain.resolve import build_model
from rrtrain.rundir import readers


class CheckFailed(Exception):
    """A property the rule does not have; the message says which, in one line."""


@dataclass(frozen=True)
class RuleUnderCheck:
    name: str
    residual: RuleKnobs  # the rule's knobs, as given with --set (checked and typed)
    data: Path | None  # a dataset written by `rrtrain prep`, for the training checks
    work: Path  # scratch directory for the training checks


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def tiny_model(rule: RuleUnderCheck, n_layers: int = 2, global_seed: int = 0) -> torch.nn.Module:
    """Built from seed 0; `global_seed` sets torch's global generator, which a rule's init must not use."""
    torch.manual_seed(global_seed)
    m = ModelConfig(size="tiny", variant=rule.name, d_model=32, n_layers=n_layers, n_heads=4, d_ff=64, seq_len=16,
                    vocab_size=64, residual=rule.residual.values())
    return build_model(m, seed=0)


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 64, (2, 16), generator=g), torch.randint(0, 64, (2, 16), generator=g)


# ---------------------------------------------------------------------------------------------
# In-process checks


def check_sanity(rule: RuleUnderCheck) -> str:
    spec = residuals.get(rule.name)
    expect(bool(spec.summary), "the spec has no summary")
    for autocast in (False, True):
        model = tiny_model(rule)
        idx, tgt = batch()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(idx, tgt)
        where = " under bf16 autocast" if autocast else ""
        expect(math.isfinite(loss.item()), f"the loss at init is {loss.item()}{where}")
        named = list(model.named_parameters())
        # autograd.grad, not backward: a check reads gradients and steps nothing (training's step is step.py's)
        grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
        for (n, _), grad in zip(named, grads):
            expect(grad is not None, f"parameter {n} gets no gradient{where} (unused parameters break FSDP)")
            expect(bool(torch.isfinite(grad).all()), f"parameter {n} has a non-finite gradient{where}")
    a, b = dict(tiny_model(rule).named_parameters()), dict(tiny_model(rule, global_seed=1).named_parameters())
    for n in a:
        expect(torch.equal(a[n], b[n]), f"two builds from the same seed differ in {n}: its initialisation draws "
                                        f"from torch's global generator, not the `generator` it is given")
    for module in [model.stream, *model.sites()]:
        own = {n for n, _ in module.named_parameters()}
        for name in module.no_decay:  # exact names, as the optimizer reads them (rrtrain/parallel/adamw.py)
            expect(name in own, f"no_decay entry '{name}' is not a parameter name of {type(module).__name__}")
    if spec.gated:
        for site in model.sites():
            site.record = True
        model(*batch())
        expect(all(s.stats for s in model.sites()), "a gated rule recorded no gate statistics on a diagnostic step")
    return f"loss {loss.item():.3f} at init; {sum(p.numel() for p in model.parameters())} parameters"


def check_params(rule: RuleUnderCheck) -> str:
    spec = residuals.get(rule.name)
    cfg = rule.residual
    for d, n_sub in ((16, 4), (32, 6)):
        stream = spec.stream(StreamInfo(d, n_sub, 1e-6, cfg))
        sites = [spec.site(SiteInfo(d, i, n_sub, "attn" if i % 2 == 0 else "mlp", 1e-6, cfg)) for i in range(n_sub)]
        built = sum(p.numel() for p in stream.parameters()) + sum(p.numel() for s in sites for p in s.parameters())
        formula = spec.params(d, n_sub, cfg)
        expect(formula == built, f"d={d}, {n_sub} sublayers: the spec counts {formula} parameters, the modules "
                                 f"have {built}")
    model = tiny_model(rule)
    m = ModelConfig(size="tiny", variant=rule.name, d_model=32, n_layers=2, n_heads=4, d_ff=64, seq_len=16,
                    vocab_size=64, residual=cfg.values())
    counted = sizing.count_params(sizing.resolve_shape(m), rule.name, cfg)
    built = sum(p.numel() for p in model.parameters())
    expect(counted == built, f"sizing.count_params says {counted}, the built model has {built}")
    return f"{formula} rule parameters at d=32 with 6 sublayers, as built"


def _as_tuple(state):
    """The state's tensors: a tensor, a tuple of them, or any nest of them (AttnRes: slots and a mask)."""
    return tuple(torch.utils._pytree.tree_leaves(state))


def check_compile(rule: RuleUnderCheck) -> str:
    torch._dynamo.reset()
    model = tiny_model(rule, n_layers=1)
    block = model.blocks[0]
    compiled = torch.compile(block, fullgraph=True, backend="eager")
    idx, _ = batch()
    for record in (False, True):
        for site in model.sites():
            site.record = record
        state = model.stream.expand(model.tok_emb(idx))
        want = _as_tuple(block(state))
        try:
            got = _as_tuple(compiled(state))
            torch.autograd.grad(sum(g.float().sum() for g in got if g.requires_grad), list(block.parameters()),
                                allow_unused=True)
        except Exception as err:  # dynamo's graph-break errors are long: their first line says where
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise CheckFailed(f"dynamo cannot trace the block in one graph (diagnostic step: {record}): "
                              f"{first}") from None
        for w, g in zip(want, got):
            expect(torch.allclose(g, w, rtol=1e-5, atol=1e-6),
                   f"the compiled block differs from the eager one (diagnostic step: {record})")
    return "one graph, forward and backward, plain and diagnostic steps"


# ---------------------------------------------------------------------------------------------
# Checks that train through `python -m rrtrain.train`


def _env() -> dict[str, str]:
    """On CPU whatever the machine has: the parity and resume figures are CPU's (gloo), and two ranks on one GPU
    would not start."""
    env = child_env()  # nothing imported from the current directory (rrtrain.core.child_python)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_config(rule: RuleUnderCheck, run_dir: Path, **train: object) -> Path:
    """A tiny run's config file: 2 blocks, a constant learning rate after warm-up (so a shorter run follows
    the same trajectory as a longer one), no evaluation until the end, no compile."""
    data = {
        "run": {"dir": str(run_dir)},
        "model": {"size": "tiny", "variant": rule.name, "n_layers": 2,
                  "residual": rule.residual.values()},
        "data": {"path": str(rule.data), "eval_batches": 1},
        "train": {"seed": 0, "max_steps": 8, "global_batch": 8, "micro_batch": 8, "lr": 0.003, "warmup_steps": 2,
                  "min_lr_ratio": 1.0, "log_every": 1, "eval_every": 0, "ckpt_every": 0, "compile": False, **train},
        "parallel": {"backend": "none", "precision": "fp32"},
    }
    path = run_dir.with_suffix(".yaml")
    files.atomic_write_file(path, yaml.safe_dump(data, sort_keys=False))
    return path


def _train(rule: RuleUnderCheck, run_dir: Path, *overrides: str, nproc: int = 1, **train: object) -> dict[int, float]:
    """Train to the end; the training loss per step from metrics.jsonl."""
    config = _run_config(rule, run_dir, **train)
    cmd = module_argv("rrtrain.train", str(config), *overrides)
    if nproc > 1:
        cmd = module_argv("torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
                          f"--master_port={_free_port()}", "-m", "rrtrain.train", str(config), *overrides)
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["(no output)"]
        raise CheckFailed(f"training exited {proc.returncode}: {tail[0]}")
    out: dict[int, float] = {}
    for record in readers.records(readers.metrics_path(run_dir)):
        if record is not None and "loss" in record:
            out[record["step"]] = record["loss"]
    return out


def _need_data(rule: RuleUnderCheck) -> None:
    expect(rule.data is not None, "no dataset (give --data DIR, a directory written by `rrtrain prep`)")


_STRAIGHT: dict[Path, dict[int, float]] = {}


def _straight(rule: RuleUnderCheck) -> dict[int, float]:
    """The one-process run of 8 steps, trained once for both checks that compare against it: the learning rate is
    constant after warm-up, so its first 6 steps are what a 6-step run logs."""
    if rule.work not in _STRAIGHT:
        _STRAIGHT[rule.work] = _train(rule, rule.work / "one_process")
    return _STRAIGHT[rule.work]


def check_resume(rule: RuleUnderCheck) -> str:
    _need_data(rule)
    straight = _straight(rule)
    run = rule.work / "resume_split"
    _train(rule, run, max_steps=4)
    split = _train(rule, run, "train.allow_config_change=true")  # max_steps 4 -> 8: accepted with consent
    expect(sorted(split) == sorted(straight) == list(range(1, 9)), f"steps logged: {sorted(split)}")
    differ = [s for s in straight if straight[s] != split[s]]
    if differ:
        first = differ[0]
        raise CheckFailed(f"after a resume at step 4 the loss differs at steps {differ} (step {first}: "
                          f"{straight[first]!r} straight, {split[first]!r} resumed)")
    return "steps 1-8 equal bit for bit across a resume at step 4"


def check_fsdp(rule: RuleUnderCheck) -> str:
    _need_data(rule)
    one = {step: loss for step, loss in _straight(rule).items() if step <= 6}
    two = _train(rule, rule.work / "fsdp_two", "parallel.backend=fsdp", nproc=2, max_steps=6, micro_batch=4)
    expect(sorted(one) == sorted(two), f"steps logged: one process {sorted(one)}, two ranks {sorted(two)}")
    worst = max(abs(one[s] - two[s]) / abs(one[s]) for s in one)
    expect(worst < 1e-4, f"2 FSDP ranks differ from one process by {worst:.2e} (relative) in the loss")
    return f"max relative loss difference {worst:.1e} over 6 steps"


CHECKS: dict[str, Callable[[RuleUnderCheck], str]] = {
    "sanity": check_sanity, "params": check_params, "compile": check_compile,
    "resume": check_resume, "fsdp": check_fsdp,
}


@dataclass(frozen=True)
class Outcome:
    check: str
    ok: bool
    detail: str
    seconds: float


def run_check(name: str, rule: RuleUnderCheck) -> Outcome:
    start = time.perf_counter()
    try:
        detail, ok = CHECKS[name](rule), True
    except CheckFailed as err:
        detail, ok = str(err), False
    except Exception as err:  # the rule's own code raised: a failed check, said in one line
        detail, ok = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}", False
    return Outcome(name, ok, detail, round(time.perf_counter() - start, 2))
