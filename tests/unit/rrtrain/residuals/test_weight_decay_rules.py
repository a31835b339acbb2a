"""Weight decay per residual rule, read from the optimizer that training builds (issue 37).

Every registered rule is built through `build_training_engine` (meta, materialise, AdamW's groups), and each
parameter's group is compared with an oracle that does not ask the optimizer's own rule: the weights of
`nn.Linear` / `nn.Embedding` are decayed; everything else a rule holds — norm gains of any shape, biases,
scalar gates, mixing coefficients — is not, except the raw matrices listed in DECAYED_RAW_MATRICES. GR's (n, d)
branch-norm gains were decayed before: a < 2-D rule alone does not see a 2-D gain. Runtime: about 5 s.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from rrtrain import residuals
from rrtrain.config import Config, ModelConfig
from rrtrain.core.dist import DistInfo
from rrtrain.core.errors import UsageError
from rrtrain.resolve import build_model
from rrtrain.parallel import build_training_engine
from rrtrain.parallel.adamw import check_decay_groups, no_decay_names
from rrtrain.residuals.gr import GRSite, GRStream
from rrtrain.resolve import resolve

#: raw 2-D parameters (not an nn.Linear's) that are matmul weights and decayed like one, by rule: mHC's Φ and
#: its head's projection. A new rule's raw matrix fails the test until it is declared here or in `no_decay`.
DECAYED_RAW_MATRICES = {"mhc": re.compile(r"(^|\.)(phi|head_fn)$")}
#: a name component that says what the parameter is, whatever its shape
NOT_A_MATRIX = re.compile(r"(^|_)(norm|gain|bias)(_|$)")
#: wrappers that activation checkpointing and compile put into names
WRAPPERS = re.compile(r"(_checkpoint_wrapped_module|_orig_mod)\.")


def tiny_config(variant: str) -> Config:
    cfg = Config()
    cfg.model = ModelConfig(size="tiny", variant=variant, d_model=32, n_layers=2, n_heads=2, d_ff=64, seq_len=8,
                            vocab_size=64)
    cfg.train.compile = False
    return cfg


def decay_by_name(variant: str) -> tuple[dict[str, float], dict[str, nn.Module], dict[str, torch.Size]]:
    """{parameter name: its group's weight_decay} from the optimizer training builds; its module; its shape."""
    cfg = tiny_config(variant)
    run = resolve(cfg)
    torch.manual_seed(0)
    engine = build_training_engine(cfg, run.shape, DistInfo(0, 1, 0, torch.device("cpu")), rule=run.rule)
    group_of = {id(p): g["weight_decay"] for g in engine.optimizer.param_groups for p in g["params"]}
    named = list(engine.inner.named_parameters())
    assert sum(len(g["params"]) for g in engine.optimizer.param_groups) == len(named)  # each in one group
    owners = dict(engine.inner.named_modules())
    decay = {WRAPPERS.sub("", n): group_of[id(p)] for n, p in named}
    modules = {WRAPPERS.sub("", n): owners[n.rpartition(".")[0]] for n, _ in named}
    return decay, modules, {WRAPPERS.sub("", n): p.shape for n, p in named}


def expected_decayed(variant: str, name: str, module: nn.Module, shape: torch.Size) -> bool:
    if isinstance(module, (nn.Linear, nn.Embedding)) and name.endswith(".weight"):
        return True
    if len(shape) < 2 or any(NOT_A_MATRIX.search(part) for part in name.split(".")):
        return False
    raw = DECAYED_RAW_MATRICES.get(variant)
    return bool(raw and raw.search(name))


@pytest.mark.parametrize("variant", residuals.names())
def test_every_rule_decays_its_matrices_and_nothing_else(variant):
    decay, modules, shapes = decay_by_name(variant)
    wrong = []
    for name, wd in decay.items():
        if (wd > 0) != expected_decayed(variant, name, modules[name], shapes[name]):
            wrong.append(f"{name} {tuple(shapes[name])}: {'decayed' if wd > 0 else 'not decayed'}")
    assert not wrong, f"{variant}: " + "; ".join(wrong)
    assert any(wd > 0 for wd in decay.values()) and any(wd == 0 for wd in decay.values())


def test_gr_branch_norm_gains_are_two_dimensional_and_not_decayed():
    """The defect itself: the gains are (n, d), every site's and the readout's, and none is decayed."""
    decay, _, shapes = decay_by_name("gr")
    gains = [n for n in decay if n.endswith("norm_weight")]
    assert "stream.mixer.norm_weight" in gains and "blocks.1.mlp_site.ctrl.norm_weight" in gains
    assert len(gains) == 1 + 2 * 2  # the readout and every site of 2 blocks
    assert all(len(shapes[n]) == 2 and decay[n] == 0.0 for n in gains)
    assert decay["blocks.0.attn_site.ctrl.down.weight"] > 0  # the controllers' matrices are


def test_a_declared_name_that_is_no_parameter_is_refused():
    """A misspelt `no_decay` entry would decay the parameter it meant to spare; the optimizer build refuses it."""
    cfg = tiny_config("gr")
    model = build_model(cfg.model, shape=resolve(cfg).shape, device="meta")
    site = model.blocks[0].attn_site
    site.no_decay = ("ctrl.norm_wieght",)  # on the instance: the class keeps its declaration
    with pytest.raises(UsageError, match="GRSite.no_decay names 'ctrl.norm_wieght'"):
        no_decay_names(model)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_checkpoint_grouped_otherwise_is_refused_in_one_line(tmp_path, monkeypatch):
    """A GR checkpoint from before the declaration (gains decayed) stops the resume with a UsageError naming it,
    not torch's KeyError from inside AdamW's first step; a checkpoint grouped as now loads."""
    cfg = tiny_config("gr")
    run, info = resolve(cfg), DistInfo(0, 1, 0, torch.device("cpu"))

    def engine():
        torch.manual_seed(0)
        return build_training_engine(cfg, run.shape, info, rule=run.rule)

    with monkeypatch.context() as m:  # the rule as it was: nothing declared, so the (n, d) gains were decayed
        m.setattr(GRSite, "no_decay", ())
        m.setattr(GRStream, "no_decay", ())
        engine().save(tmp_path / "step_00000002" / "state")
    with pytest.raises(UsageError, match=r"^checkpoint step_00000002: .* \(29 there, 24\+5 here; e\.g\. "
                                         r"blocks\.0\.attn_site\.ctrl\.norm_weight\)"):
        engine().load(tmp_path / "step_00000002" / "state")
    engine().save(tmp_path / "step_00000004" / "state")
    engine().load(tmp_path / "step_00000004" / "state")


def test_decay_groups_compare_membership_not_order_or_empty_groups():
    same = [{"a", "b"}, {"c"}]
    check_decay_groups([{"c"}, {"b", "a"}], same, "step_1")  # groups in another order
    check_decay_groups([{"a", "b"}, set(), {"c"}], same, "step_1")  # DeepSpeed records no empty group
    with pytest.raises(UsageError, match=r"\(3 there, 2\+1 here; e\.g\. c\)"):
        check_decay_groups([{"a", "b", "c"}], same, "step_1")


def test_deepspeed_checkpoints_give_their_groups_from_param_shapes(tmp_path):
    """DeepSpeed records each optimizer group's parameter names in `param_shapes` (checked on a real resume in
    tests/distributed/test_deepspeed.py's runs); anything else there is no record, and DeepSpeed's load decides."""
    from collections import OrderedDict

    from rrtrain.parallel.deepspeed import saved_groups

    f = tmp_path / "mp_rank_00_model_states.pt"
    torch.save({"module": {}, "param_shapes": [OrderedDict(a=torch.Size([2, 2]), b=torch.Size([2]))]}, f)
    assert saved_groups(f) == [{"a", "b"}]
    torch.save({"module": {}}, f)
    assert saved_groups(f) is None
    assert saved_groups(tmp_path / "missing.pt") is None
