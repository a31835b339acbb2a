"""What a model is built from, on the model's side: its shape, its residual rule with that rule's knobs, and
the norm, initialisation and RoPE settings. rrtrain.resolve makes one from a run's config; an exported model
(rrtrain/export/) makes one from its config.json. Nothing here knows the run config, so this package stands
alone (and loads without torch: `rrtrain status` reads shapes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from .parametrization import SP, Parametrization


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
    # document masking (rrtrain/model/transformer.py, `document_attend`): attention block-diagonal by document
    # within each packed row, documents ending at `eod_id`; positions restart per document ("restart") or run on
    # over the whole row ("continue"). Off: the model is what it always was.
    doc_mask: bool = False
    doc_positions: str = "restart"
    eod_id: Optional[int] = None
    # width/depth parametrization (rrtrain/model/parametrization.py, docs/transfer.md); SP: GPT-2's, as always
    parametrization: Parametrization = SP

    @property
    def variant(self) -> str:
        return self.rule.name

    def to_dict(self) -> dict[str, Any]:
        """Plain data (an export's config.json `rrtrain` section): the rule by name, its knobs' values (the
        document-masking keys only when `doc_mask` is on, so that other models' sections are as they were)."""
        data = {"variant": self.rule.name, "shape": dataclasses.asdict(self.shape), "residual": self.knobs.values(),
                "norm_eps": self.norm_eps, "init_std": self.init_std, "rope_base": self.rope_base}
        if self.doc_mask:
            data.update(doc_mask=True, doc_positions=self.doc_positions, eod_id=self.eod_id)
        if not self.parametrization.is_sp:  # likewise: an sp model's section is as it was
            data["parametrization"] = self.parametrization.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], rules: Iterable[Any]) -> "ModelSpec":
        """The spec `to_dict` wrote, its rule found by name among `rules`."""
        name = data["variant"]
        rule = next((r for r in rules if r.name == name), None)
        if rule is None:
            raise ValueError(f"residual rule {name!r} is not among the rules at hand")
        return cls(shape=ModelShape(**data["shape"]), rule=rule, knobs=rule.make_knobs(**data["residual"]),
                   norm_eps=data["norm_eps"], init_std=data["init_std"], rope_base=data["rope_base"],
                   doc_mask=bool(data.get("doc_mask", False)), doc_positions=data.get("doc_positions", "restart"),
                   eod_id=data.get("eod_id"), parametrization=_parametrization(data.get("parametrization")))


def _parametrization(data: Optional[dict[str, Any]]) -> Parametrization:
    if not data:
        return SP
    return Parametrization(name=data["parametrization"], base_d_model=data["base_d_model"],
                           base_n_layers=data["base_n_layers"], alpha=data["alpha"])
