"""`model.parametrization`: how the initialisation, the forward multipliers and the optimizer's per-group
settings scale with the width and the depth (docs/transfer.md). Pure arithmetic on a shape; the model
(transformer.py) and the optimizer's groups (rrtrain/parallel/adamw.py) read it.

    sp         GPT-2 as always: N(0, std) everywhere, output projections N(0, std/sqrt(2L)); one learning rate
    mup        width (Tensor Programs V, EleutherAI's nanoGPT-mup): m_w = d / base_d;
               hidden matrices N(0, std^2 / m_w), Adam LR x 1/m_w; logits x 1/m_w (the tied head's input);
               attention scale 1/d_head; Adam eps x 1/m_w; output projections keep GPT-2's 1/sqrt(2L) (a depth
               factor: the depth is fixed when the width is transferred)
    completep  width and depth (CompleteP, arXiv 2505.01618; nanoGPT-mup's completep branch): mup's rules, and
               m_L = n_layers / base_n_layers; every residual branch x m_L^-alpha; no 1/sqrt(2L) on the output
               projections; in the blocks LR x m_L^(alpha-1) (hidden matrices: x 1/m_w too; a rule's carry
               scalars x 1/m_L), Adam eps x m_w^-1 m_L^-alpha; weight decay on hidden matrices x m_w (so lr x wd
               keeps its base value)

A rule's own parameters follow its declared composition (`RuleSpec.composition`, rrtrain/residuals/composition.py);
a rule without one is refused under mup and completep (`refusal`). Nothing here imports torch or the rules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Optional

PARAMETRIZATIONS = ("sp", "mup", "completep")


@dataclass(frozen=True)
class Parametrization:
    name: str = "sp"
    base_d_model: int = 64  # the tiny preset's (configs/sizes/tiny.yaml)
    base_n_layers: int = 4
    alpha: float = 1.0  # completep's depth exponent; 0.5: depth-muP

    def __post_init__(self) -> None:
        if self.name not in PARAMETRIZATIONS:
            raise ValueError(f"model.parametrization must be one of {', '.join(PARAMETRIZATIONS)}, got {self.name!r}")
        if self.base_d_model < 1 or self.base_n_layers < 1:
            raise ValueError(f"model.base_d_model and model.base_n_layers must be at least 1, got "
                             f"{self.base_d_model} and {self.base_n_layers}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"model.alpha must lie in [0, 1] (1: CompleteP, 0.5: depth-muP), got {self.alpha}")

    @property
    def is_sp(self) -> bool:
        return self.name == "sp"

    @property
    def depth(self) -> bool:
        return self.name == "completep"

    def width_mult(self, shape: Any) -> float:
        """m_w = d_model / base_d_model (1 under sp)."""
        return 1.0 if self.is_sp else shape.d_model / self.base_d_model

    def depth_mult(self, shape: Any) -> float:
        """m_L = n_layers / base_n_layers under completep, else 1."""
        return shape.n_layers / self.base_n_layers if self.depth else 1.0

    def branch_multiplier(self, shape: Any) -> Optional[float]:
        """m_L^-alpha on every residual branch under completep; None otherwise (nothing is multiplied)."""
        return self.depth_mult(shape) ** -self.alpha if self.depth else None

    def logit_multiplier(self, shape: Any) -> Optional[float]:
        """1/m_w on the tied head's input under mup and completep; None under sp."""
        return None if self.is_sp else 1.0 / self.width_mult(shape)

    def attention_scale(self, shape: Any) -> Optional[float]:
        """1/d_head under mup and completep; None (scaled_dot_product_attention's 1/sqrt(d_head)) under sp."""
        return None if self.is_sp else 1.0 / shape.head_dim

    def hidden_std(self, std: float, shape: Any) -> float:
        """The standard deviation of a hidden matrix drawn at `std` under sp: std / sqrt(m_w)."""
        return std if self.is_sp else std / math.sqrt(self.width_mult(shape))

    def output_depth_scaled(self, rule_default: bool) -> bool:
        """Whether the output projections keep GPT-2's 1/sqrt(2L): never under completep (the branch
        multiplier counts the depth)."""
        return rule_default and not self.depth

    def lr_scales(self, shape: Any) -> dict[str, float]:
        """Adam learning-rate multiplier per role (see `role_of`)."""
        m_w, m_l = self.width_mult(shape), self.depth_mult(shape)
        depth = m_l ** (self.alpha - 1.0) if self.depth else 1.0
        carry = 1.0 / m_l if self.depth else 1.0  # a rule's carry scalars: their product spans the stack
        return {"embedding": 1.0, "hidden_matrix": depth / m_w, "hidden_vector": depth, "carry_scalar": carry,
                "end_matrix": 1.0 / m_w, "end_vector": 1.0}

    def eps_scales(self, shape: Any) -> dict[str, float]:
        """Adam epsilon multiplier per role: 1/m_w, and m_L^-alpha inside the blocks under completep."""
        m_w, m_l = self.width_mult(shape), self.depth_mult(shape)
        hidden = (m_l ** -self.alpha if self.depth else 1.0) / m_w
        return {"embedding": 1.0 / m_w, "hidden_matrix": hidden, "hidden_vector": hidden, "carry_scalar": hidden,
                "end_matrix": 1.0 / m_w, "end_vector": 1.0 / m_w}

    def wd_scales(self, shape: Any) -> dict[str, float]:
        """Weight-decay multiplier per role (on parameters that decay at all): m_w on matrices under completep."""
        m_w = self.width_mult(shape) if self.depth else 1.0
        return {"embedding": 1.0, "hidden_matrix": m_w, "hidden_vector": 1.0, "carry_scalar": 1.0, "end_matrix": m_w,
                "end_vector": 1.0}

    def to_dict(self) -> dict[str, Any]:
        return {"parametrization": self.name, "base_d_model": self.base_d_model,
                "base_n_layers": self.base_n_layers, "alpha": self.alpha}

    def multipliers(self, shape: Any) -> dict[str, Any]:
        """Every multiplier at `shape`: what a run records and `rrtrain params` shows."""
        return {**self.to_dict(), "width_mult": self.width_mult(shape), "depth_mult": self.depth_mult(shape),
                "branch_multiplier": self.branch_multiplier(shape), "logit_multiplier": self.logit_multiplier(shape),
                "attention_scale": self.attention_scale(shape) or 1.0 / math.sqrt(shape.head_dim),
                "hidden_init_std_factor": self.hidden_std(1.0, shape),
                "output_projection_depth_scaling": not self.depth,
                "lr_scale": self.lr_scales(shape), "eps_scale": self.eps_scales(shape),
                "weight_decay_scale": self.wd_scales(shape)}


SP = Parametrization()

#: the roles of a model's parameters; each gets its own optimizer settings (`Parametrization.lr_scales`, ...)
ROLES = ("embedding", "hidden_matrix", "hidden_vector", "carry_scalar", "end_matrix", "end_vector")

#: the model's own hidden matrices (name suffixes inside a block)
MODEL_MATRICES = ("attn.qkv.weight", "attn.proj.weight", "mlp.fc.weight", "mlp.proj.weight")


def refusal(p: Parametrization, rule: Any) -> Optional[str]:
    """Why `rule` (a RuleSpec) cannot run under `p`, in one line; None when it can."""
    if p.is_sp:
        return None
    comp = getattr(rule, "composition", None)
    if comp is None:
        return (f"model.parametrization={p.name}: residual rule '{rule.name}' declares no composition "
                "(RuleSpec.composition: where the branch multiplier applies, update or write; which parameters are "
                "matrices and which gains/scalars; any scaled_init and carry_gates; docs/transfer.md); declare one "
                "or run it with parametrization=sp")
    if p.depth and comp.depth:
        return f"model.parametrization=completep refuses residual rule '{rule.name}': {comp.depth}"
    return None


def matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatchcase(name, pat) for pat in patterns)


def role_of(name: str, local: Optional[str], in_stream: bool, comp: Any) -> str:
    """The role of parameter `name` (the model's full name); `local` is its name inside its Site or Stream (None
    for the model's own parameters). ValueError, naming it, for a rule's parameter its composition misses."""
    if local is None:
        if name in ("tok_emb.weight", "pos_emb.weight"):
            return "embedding"
        if name.startswith("blocks.") and name.endswith(MODEL_MATRICES):
            return "hidden_matrix"
        raise ValueError(f"parameter '{name}' has no parametrization role (a model parameter rrtrain does not know)")
    where = "end" if in_stream else "hidden"
    if matches(local, comp.matrices):
        return f"{where}_matrix"
    if not in_stream and matches(local, comp.carry_scalars):
        return "carry_scalar"
    if matches(local, comp.vectors) or matches(local, comp.carry_scalars):
        return f"{where}_vector"
    raise ValueError(f"parameter '{name}' ('{local}' of the rule's {'stream' if in_stream else 'site'}) is in none of "
                     "Composition.matrices, .vectors or .carry_scalars of its rule: declare it")


def carry_start(logit: float, depth_mult: float) -> float:
    """A convex gate's depth-aware start: r_0 = sigma(logit) at the base depth becomes 1 - (1 - r_0)^(1/m_L), so
    that prod (1 - r) over m_L times as many sublayers is the base's. Returned as a logit."""
    r0 = 1.0 / (1.0 + math.exp(-logit))
    r = 1.0 - (1.0 - r0) ** (1.0 / depth_mult)
    r = min(max(r, 1e-12), 1.0 - 1e-12)
    return math.log(r / (1.0 - r))
