"""What a model is built from, on the model's side: its shape, its residual rule with that rule's knobs, and
the norm, initialisation and RoPE settings. rrtrain.resolve makes one from a run's config; an exported model
(rrtrain/export/) makes one from its config.json. Nothing here knows the run config, so this package stands
alone (and loads without torch: `rrtrain status` reads shapes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable


@dataclass(frozen=True)
class ModelShape:
    """Everything that fixes a model's parameter count, resolved from a preset plus overrides."""

    d_model: int
    n_layers: int  # blocks
    n_heads: int
    d_ff: int
    seq_len: int
    vocab_size: int
    pos: str = "learned"

    @property
    def n_sublayers(self) -> int:
        return 2 * self.n_layers

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@dataclass(frozen=True)
class ModelSpec:
    """One model: `rule` is a residual rule's spec (rrtrain.residuals.RuleSpec), `knobs` that rule's values
    (`rule.make_knobs(...)`, a RuleKnobs)."""

    shape: ModelShape
    rule: Any  # RuleSpec: not imported, so that this module needs neither torch nor the rules
    knobs: Any  # RuleKnobs of `rule`
    norm_eps: float = 1e-6
    init_std: float = 0.02
    rope_base: float = 10000.0

    @property
    def variant(self) -> str:
        return self.rule.name

    def to_dict(self) -> dict[str, Any]:
        """Plain data (an export's config.json `rrtrain` section): the rule by name, its knobs' values."""
        return {"variant": self.rule.name, "shape": dataclasses.asdict(self.shape), "residual": self.knobs.values(),
                "norm_eps": self.norm_eps, "init_std": self.init_std, "rope_base": self.rope_base}

    @classmethod
    def from_dict(cls, data: dict[str, Any], rules: Iterable[Any]) -> "ModelSpec":
        """The spec `to_dict` wrote, its rule found by name among `rules`."""
        name = data["variant"]
        rule = next((r for r in rules if r.name == name), None)
        if rule is None:
            raise ValueError(f"residual rule {name!r} is not among the rules at hand")
        return cls(shape=ModelShape(**data["shape"]), rule=rule, knobs=rule.make_knobs(**data["residual"]),
                   norm_eps=data["norm_eps"], init_std=data["init_std"], rope_base=data["rope_base"])
