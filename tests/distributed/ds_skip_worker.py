"""The DeepSpeed engines' `skip()` on finite gradients, and the refusal of a checkpoint written by another number of
ranks: run on each of 2 ranks (`python -m tests.distributed.ds_skip_worker`, an env:// launch:
tests/distributed/rankutil.py) by tests/distributed/test_deepspeed.py::test_skip_discards_finite_gradients, which
reads the line `RESULT {json}` rank 0 prints."""

import json, torch
from rrtrain.core import dist
from rrtrain.config import load_config
from rrtrain.resolve import build_model
from rrtrain.parallel import build_engine

info = dist.setup(120)
ACCUM, MICRO = 2, 2
gen = torch.Generator().manual_seed(1)
batches = [torch.randint(0, 64, (ACCUM * MICRO * info.world_size, 17), generator=gen) for _ in range(3)]

def engine(stage, precision):
    cfg = load_config(None, ["model.size=tiny", "model.vocab_size=64", "model.seq_len=16", "model.n_layers=2",
                             "train.global_batch=8", "train.micro_batch=2", "train.compile=false",
                             "parallel.backend=deepspeed",
                             f"parallel.zero_stage={stage}", f"parallel.precision={precision}"])
    return build_engine(build_model(cfg.model, device="meta"), cfg, info)  # as training builds it

def train_step(eng, batch, skip):
    mine = batch.view(info.world_size, ACCUM, MICRO, -1)[info.rank]
    for a in range(ACCUM):
        loss = eng.forward(mine[a, :, :-1], mine[a, :, 1:])
        eng.backward(loss / ACCUM, last_micro=a == ACCUM - 1)
    norm = float(eng.clip_grad_norm(1.0))
    eng.skip() if skip else eng.step(1e-2)
    return norm

def loss_on(eng, batch):
    with torch.no_grad():
        return float(eng.forward(batch[:, :-1], batch[:, 1:]))

def adam_steps(eng):
    return sorted({float(s["step"]) for s in eng.base_opt.state.values() if "step" in s})

out = {}
for stage, precision in ((1, "fp32"), (2, "fp32"), (3, "fp32"), (1, "bf16"), (3, "bf16")):
    a, b = engine(stage, precision), engine(stage, precision)
    before = loss_on(a, batches[2])
    norm = train_step(a, batches[0], skip=True)      # finite gradients, discarded by the loop's decision
    r = {"norm": norm, "after_skip": loss_on(a, batches[2]), "before": before,
         "counters_after_skip": a.counters(), "adam_steps_after_skip": adam_steps(a)}
    train_step(a, batches[1], skip=False)
    train_step(b, batches[1], skip=False)            # b never saw batches[0]
    r.update(a_final=loss_on(a, batches[2]), b_final=loss_on(b, batches[2]), counters_final=a.counters(),
             adam_steps_a=adam_steps(a), adam_steps_b=adam_steps(b))
    out[f"ZeRO-{stage} {precision}"] = r

# a checkpoint written by another number of ranks is refused with a usage error (exit status 2), not a crash
import pathlib, tempfile
from rrtrain.core.errors import UsageError
state = pathlib.Path(tempfile.mkdtemp()) / "step_00000005" / "state"
(state / "zero").mkdir(parents=True)
for r in range(3):
    (state / "zero" / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt").touch()
try:
    a.load(state)
    refused = None
except UsageError as err:
    refused = str(err)
if info.is_main:
    print("RESULT " + json.dumps({"engines": out, "refused": refused}))
dist.exit_process(0)
