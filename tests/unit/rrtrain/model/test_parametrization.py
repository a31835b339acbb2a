"""`model.parametrization` (docs/transfer.md): sp is the model it always was; mup and completep pass the coordinate
check on tiny shapes (the last block's mean |h_t - h_0| after 3 steps at a large learning rate is flat in the
width, resp. the depth, where sp's grows); every rule runs a 2-step check under each parametrization it accepts
and is refused in one line under the others; the optimizer's groups, the carry gates' depth-aware start and what
`rrtrain params` shows."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from rrtrain import residuals
from rrtrain.cli.main import main as rrtrain_main
from rrtrain.config import load_config
from rrtrain.core.errors import UsageError
from rrtrain.model.parametrization import SP, Parametrization, carry_start, refusal
from rrtrain.model import transformer
from rrtrain.model.transformer import build_model
from rrtrain.parallel.adamw import no_decay_names, param_groups, parametrization_record, set_lr
from rrtrain.planning.coordcheck import QUANTITIES, Plan, last_layer_series, log_slope, run
from rrtrain.resolve import model_spec

from trainutil import REPO

CONFIG = str(REPO / "configs" / "train" / "tiny.yaml")
LR = 0.03  # large for these shapes: the state grows ~20x in 3 steps
CHECK_LR = 0.01  # the flatness checks: large still (the state grows several-fold), and less chaotic than LR
DOCS = 40  # synthetic stories: ~600 rows of 33 bytes, made once per process


def cfg_of(*overrides: str):  # noqa: ANN201 - a Config
    return load_config(CONFIG, list(overrides))


def last_delta_slope(cfg, plan: Plan) -> float:  # noqa: ANN001
    """The change in log per doubling of the last block's mean |h_t - h_0| after the last step."""
    slope = log_slope(last_layer_series(run(cfg, plan), "h_delta", plan.axis)[plan.steps])
    assert slope is not None
    return slope


# -- sp: the model it was ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", ["standard", "review_convex"])
def test_sp_is_the_model_it_always_was(rule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """sp never reaches the new code: no multiplier set, the init of old, the two weight-decay groups with no
    per-group setting; and the base shape and alpha mean nothing under sp (same weights, same loss after a step).
    (Checked once against the commit before this work by hashing state_dicts and losses: identical.)"""
    def never(*args, **kwargs):  # noqa: ANN002, ANN003
        raise AssertionError("sp reached the parametrized init")

    monkeypatch.setattr(Parametrization, "hidden_std", never)  # the parametrized init's first step
    monkeypatch.setattr(transformer, "matches", never)  # the rule's composition applied to its parameters
    plain = model_spec(cfg_of(f"model.variant={rule}", "model.seq_len=16").model, 300)
    named = model_spec(cfg_of(f"model.variant={rule}", "model.seq_len=16", "model.parametrization=sp",
                              "model.base_d_model=32", "model.alpha=0.5").model, 300)
    assert plain.parametrization is SP and named == plain and "parametrization" not in plain.to_dict()
    idx = torch.randint(0, 300, (2, 17), generator=torch.Generator().manual_seed(0))
    losses = []
    for spec in (plain, named):
        model = build_model(spec, seed=3)
        assert model.logit_mult is None
        assert all(b.branch_mult is None and b.attn.scale is None for b in model.blocks)
        groups = param_groups(model, 0.1, 1e-8)
        skip = no_decay_names(model)
        assert [set(g) for g in groups] == [{"params", "weight_decay"}] * 2
        assert [len(g["params"]) for g in groups] == [sum(n not in skip for n, _ in model.named_parameters()),
                                                      len(skip)]
        opt = torch.optim.AdamW(groups, lr=1.0)
        set_lr(opt, 3e-3)
        assert [g["lr"] for g in opt.param_groups] == [3e-3, 3e-3]
        model(idx[:, :-1], idx[:, 1:]).backward()
        opt.step()
        losses.append((model(idx[:, :-1], idx[:, 1:]).item(), model.state_dict()))
    (loss_a, sd_a), (loss_b, sd_b) = losses
    assert loss_a == loss_b and all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)


# -- the coordinate checks ----------------------------------------------------------------------------------------


@pytest.mark.slow  # widths to 512 on CPU: ~20 s
def test_mup_is_flat_in_width_where_sp_grows() -> None:
    cfg = cfg_of("model.variant=standard", "model.n_layers=2")
    plan = Plan("mup", "width", (64, 128, 256, 512), steps=3, seeds=1, lr=CHECK_LR, batch=4, seq_len=32, docs=DOCS)
    assert abs(last_delta_slope(cfg, plan)) < 0.1
    assert last_delta_slope(cfg, dataclasses.replace(plan, parametrization="sp")) > 0.3


@pytest.mark.parametrize("rule", ["standard", "review", pytest.param("peri_ln", marks=pytest.mark.slow),  # ~2 s each
                                  pytest.param("layer_scalars", marks=pytest.mark.slow)])
def test_completep_is_flat_in_depth_where_sp_grows(rule: str) -> None:
    """Depths 4-32 blocks at d_model 32 (the base width: m_w = 1). sp's growth is checked for `standard` alone
    (review's, peri_ln's and layer_scalars' sp curves climb alike, slopes ~0.6; left out for the suite's time).
    peri_ln takes the multiplier after its output norm, layer_scalars on u and on the x0 injection."""
    cfg = cfg_of(f"model.variant={rule}", "model.d_model=32", "model.n_heads=2", "model.base_d_model=32")
    plan = Plan("completep", "depth", (4, 8, 16, 32), steps=3, seeds=1, lr=CHECK_LR, batch=4, seq_len=32,
                docs=DOCS)
    assert abs(last_delta_slope(cfg, plan)) < 0.1
    if rule == "standard":
        assert last_delta_slope(cfg, dataclasses.replace(plan, parametrization="sp")) > 0.3


# -- every rule, every parametrization -------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", residuals.names())
def test_every_rule_runs_or_is_refused_in_one_line(rule: str) -> None:
    spec = residuals.get(rule)
    cfg = cfg_of(f"model.variant={rule}", "model.d_model=32", "model.n_heads=2", "model.n_layers=2",
                 "model.base_d_model=16", "model.base_n_layers=1")
    for name in ("sp", "mup", "completep"):
        plan = Plan(name, "width", (32,), steps=2, seeds=1, lr=LR, batch=1, seq_len=32, docs=DOCS)
        why = refusal(Parametrization(name), spec)
        if why:
            with pytest.raises(UsageError) as err:
                run(cfg, plan)
            assert "\n" not in str(err.value) and rule in str(err.value)
            continue
        records = run(cfg, plan)
        assert {r["quantity"] for r in records} >= {"h_abs", "h_delta", "attn_logits", "output_logits"}
        assert all(r["value"] is not None and math.isfinite(r["value"]) for r in records), (rule, name)
    assert refusal(Parametrization("sp"), spec) is None
    if spec.composition is None:  # an undeclared rule: refused under both, naming what to declare
        assert "declares no composition" in refusal(Parametrization("mup"), spec)
    if rule in ("deepnorm", "fixup", "ln_scaling"):
        assert "depth scheme of its own" in refusal(Parametrization("completep"), spec)
        assert refusal(Parametrization("mup"), spec) is None


def test_the_cli_writes_records_and_plots_or_refuses(tmp_path, capsys, monkeypatch) -> None:  # noqa: ANN001
    out = tmp_path / "cc"
    argv = ["coordcheck", CONFIG, "model.variant=review_convex", "model.d_model=32", "model.n_heads=2",
            "--parametrization", "completep", "--depths", "1,2", "--steps", "2", "--seeds", "2", "--batch", "1",
            "--seq-len", "32", "--lr", str(LR), "--out", str(out)]
    assert rrtrain_main(argv) == 0
    records = json.loads((out / "coordcheck.json").read_text())
    assert {tuple(sorted(r)) for r in records} == {("depth", "layer", "parametrization", "quantity", "seed", "step",
                                                    "value", "width")}
    assert {(r["depth"], r["seed"], r["step"]) for r in records} == {(d, s, t) for d in (1, 2) for s in (0, 1)
                                                                     for t in range(3)}
    assert {p.name for p in out.glob("*.png")} == {f"{q}.png" for q in QUANTITIES}
    last = [r["value"] for r in records if r["quantity"] == "h_delta" and r["step"] == 2 and r["depth"] == 1]
    printed = capsys.readouterr().out  # the headline: the last block's |h_t - h_0| per depth (mean over seeds)
    assert f"h_delta (completep, last block, step 2): 1: {sum(last) / 2:.4g}, 2: " in printed
    assert "change in log per doubling" in printed
    undeclared = dataclasses.replace(residuals.get("standard"), name="undeclared_rule", composition=None)
    monkeypatch.setitem(residuals._RULES, undeclared.name, undeclared)
    capsys.readouterr()
    assert rrtrain_main(["coordcheck", CONFIG, "model.variant=undeclared_rule", "--parametrization", "mup",
                         "--widths", "32", "--out", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "undeclared_rule" in err and "RuleSpec.composition" in err
    assert not (tmp_path / "no").exists()


# -- groups, multipliers, carry gates, `rrtrain params` ---------------------------------------------------------------


def test_completep_groups_and_multipliers() -> None:
    cfg = cfg_of("model.variant=review_convex", "model.parametrization=completep", "model.d_model=128",
                 "model.n_layers=16", "model.seq_len=16", "model.alpha=0.5", "train.weight_decay=0.1",
                 "train.adam_eps=1e-8", "model.residual.convex_branch_multiplier=true")
    model = build_model(model_spec(cfg.model, 300), device="meta")
    m_w, m_l = 2.0, 4.0
    rec = parametrization_record(model, cfg.train)
    assert (rec["width_mult"], rec["depth_mult"], rec["branch_multiplier"]) == (m_w, m_l, m_l ** -0.5)
    assert rec["logit_multiplier"] == 1 / m_w and rec["attention_scale"] == 1 / 32
    assert all(b.branch_mult == m_l ** -0.5 and b.attn.scale == 1 / 32 for b in model.blocks)
    groups = {(g["role"], g["weight_decay"] > 0): g for g in rec["groups"]}
    hidden = groups[("hidden_matrix", True)]
    assert hidden["lr_scale"] == pytest.approx(m_l ** -0.5 / m_w)
    assert hidden["eps"] == pytest.approx(1e-8 / m_w * m_l ** -0.5)
    assert hidden["weight_decay"] == pytest.approx(0.1 * m_w)
    assert groups[("hidden_vector", False)]["lr_scale"] == pytest.approx(m_l ** -0.5)
    assert groups[("embedding", True)]["lr_scale"] == 1.0 and groups[("embedding", True)]["eps"] == 1e-8 / m_w
    assert sum(g["params"] for g in rec["groups"]) == sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(param_groups(build_model(model_spec(cfg.model, 300)), 0.1, 1e-8), lr=1.0)
    set_lr(opt, 1e-3)
    assert sorted({round(g["lr"] / 1e-3, 6) for g in opt.param_groups}) == sorted(
        {round(s, 6) for s in (1.0, m_l ** -0.5 / m_w, m_l ** -0.5)})


def test_where_the_2025_rules_take_the_multiplier_and_their_carry_scalars() -> None:
    """At 4x the base depth under completep (m = 1/4): a rule that declares branch="write" gets m in its sites and
    the block multiplies nothing; peri_ln applies it after its output norm; a carry scalar's learning rate is x 1/m_L
    (the block's other scalars keep m_L^(alpha-1) = 1); AttnRes's sources are unscaled unless
    attnres_branch_multiplier=true."""
    def built(rule: str, *extra: str):  # noqa: ANN202
        cfg = cfg_of(f"model.variant={rule}", "model.parametrization=completep", "model.n_layers=16",
                     "model.seq_len=16", *extra)
        return build_model(model_spec(cfg.model, 300), device="meta"), cfg

    for rule in ("peri_ln", "layer_scalars", "laurel", "attnres"):
        model, _ = built(rule, *(["model.residual.attnres_branch_multiplier=true"] if rule == "attnres" else []))
        assert model.rule.composition.branch == "write"
        assert all(b.branch_mult is None for b in model.blocks)
        assert {s.info.branch_multiplier for s in model.sites()} == {0.25}
    for rule in ("denseformer", "frac", "value_residual"):
        model, _ = built(rule)
        assert {b.branch_mult for b in model.blocks} == {0.25}
    model, cfg = built("layer_scalars")
    roles = {(g["role"], g["lr_scale"]) for g in parametrization_record(model, cfg.train)["groups"]}
    assert ("carry_scalar", 0.25) in roles and ("hidden_vector", 1.0) in roles
    groups = {id(p): g["role"] for g in param_groups(model, 0.1) for p in g["params"]}
    site = model.blocks[0].attn_site
    assert (groups[id(site.resid_lambda)], groups[id(site.x0_lambda)]) == ("carry_scalar", "hidden_vector")
    laurel, _ = built("laurel", "model.residual.laurel_form=rw")
    groups = {id(p): g["role"] for g in param_groups(laurel, 0.1) for p in g["params"]}
    assert groups[id(laurel.blocks[0].mlp_site.beta)] == "carry_scalar"
    on, _ = built("attnres", "model.residual.attnres_branch_multiplier=true")
    assert {s.mult for s in on.sites()} == {0.25} and {s.mult for s in built("attnres")[0].sites()} == {1.0}
    peri = residuals.get("peri_ln").make_site(4, 1, 32, "mlp", 1e-6, residuals.get("peri_ln").make_knobs(),
                                               branch_multiplier=0.25)
    h, y = torch.randn(2, 3, 4), 10 * torch.randn(2, 3, 4)
    assert torch.allclose(peri.write(h, y, None), h + 0.25 * peri.out_norm(y))


def test_convex_gates_keep_the_base_carry_product() -> None:
    """review_convex under completep at 4x the base depth: prod (1 - r) over the stack at init is the base's."""
    def carry(n_layers: int, name: str) -> float:
        cfg = cfg_of("model.variant=review_convex", f"model.parametrization={name}", f"model.n_layers={n_layers}",
                     "model.seq_len=16")
        model = build_model(model_spec(cfg.model, 300))
        return math.prod(float((1 - torch.sigmoid(s.gate.bias.detach())).mean()) for s in model.sites())

    base = carry(4, "completep")
    assert base == pytest.approx(0.5 ** 8)
    assert carry(16, "completep") == pytest.approx(base, rel=1e-4)  # fp32 biases
    assert carry(16, "sp") == pytest.approx(0.5 ** 32)
    assert carry_start(0.0, 1.0) == pytest.approx(0.0, abs=1e-12)
    # the gate alone scales depth by default; convex_branch_multiplier=true multiplies the update by m_L^-alpha too
    for rule in ("review_convex", "highway_convex"):
        for on, mult in (("false", None), ("true", 0.25)):
            cfg = cfg_of(f"model.variant={rule}", "model.parametrization=completep", "model.n_layers=16",
                         "model.seq_len=16", f"model.residual.convex_branch_multiplier={on}")
            model = build_model(model_spec(cfg.model, 300), device="meta")
            assert {b.branch_mult for b in model.blocks} == {mult}, (rule, on)
            assert (parametrization_record(model, cfg.train)["branch_multiplier"] is None) == (mult is None)


def test_params_shows_groups_and_refusals(capsys) -> None:  # noqa: ANN001
    assert rrtrain_main(["params", "--size", "tiny", "--variants", "standard,fixup", "--set",
                         "parametrization=completep", "--set", "n_layers=8"]) == 0
    out = capsys.readouterr().out
    assert "hidden_matrix" in out and "m_L 2" in out and "refuses residual rule 'fixup'" in out
