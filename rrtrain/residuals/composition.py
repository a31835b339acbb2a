"""How a residual rule composes with the width and depth parametrizations (`model.parametrization`: mup,
completep; docs/transfer.md): a field of its spec (`RuleSpec.composition`), so that a rule from another package
declares its own. A rule that declares none is refused under mup and completep in one line.

    branch        where the branch multiplier m_L^-alpha (completep) applies: "update", the sublayer's output u
                  before the site's write (the model multiplies it; the rule sees nothing), or "write", what the
                  rule writes into the state (the site reads `info.branch_multiplier` and applies it itself: a
                  rule whose write normalises u, say). Never the carry path: the state's own share is untouched.
    branch_switch the rule's boolean knob that turns the multiplier on, in either place (AttnRes's
                  `attnres_branch_multiplier`, the convex gates' `convex_branch_multiplier`); None: always on
    matrices      parameter names (fnmatch patterns, relative to the Site or the Stream) that act as hidden
                  matrices: a fan-in over the width, so Adam's learning rate is scaled by 1/m_w (and by
                  m_L^(alpha-1) in a site under completep) and, under completep, weight decay by m_w
    vectors       gains, biases, gates' biases and scalars: learning rate x m_L^(alpha-1) in a site under
                  completep (1 in the stream), initialisation unchanged
    scaled_init   of `matrices`: drawn by the rule at a fixed standard deviation, so the model multiplies their
                  start by m_w^-1/2 (a zero start, or one already drawn with 1/fan_in variance, is left alone)
    carry_gates   of `vectors`: the logit b of a convex gate r = sigma(b + ...), whose state keeps (1 - r);
                  under completep its start becomes logit(1 - (1 - r_0)^(1/m_L)), so the carry product over the
                  stack, prod (1 - r), is the base depth's whatever the depth (the 0.5^L of docs/depth.md)
    carry_scalars scalars that multiply or mix the carried state itself (LAuReL's beta, layer scalars' lambda,
                  DenseFormer's alpha): their effects compound over the stack (a product of m_L times as many
                  factors), so under completep their learning rate is x 1/m_L whatever alpha (the change of the
                  product per step stays the base depth's); initialisation unchanged, no multiplier on them
    depth         None: accepted under completep; else why the rule is not (a depth scheme of its own), refused
                  in one line with this reason

Every parameter of a rule's sites and stream must match `matrices`, `vectors` or `carry_scalars`: an undeclared one
is refused when the optimizer's groups are built, naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

BRANCH_PLACES = ("update", "write")


@dataclass(frozen=True)
class Composition:
    branch: str = "update"
    branch_switch: Optional[str] = None
    matrices: tuple[str, ...] = ()
    vectors: tuple[str, ...] = ()
    scaled_init: tuple[str, ...] = ()
    carry_gates: tuple[str, ...] = ()
    carry_scalars: tuple[str, ...] = ()
    depth: Optional[str] = None

    def __post_init__(self) -> None:
        if self.branch not in BRANCH_PLACES:
            raise ValueError(f"Composition.branch must be one of {', '.join(BRANCH_PLACES)}, got {self.branch!r}")
        for name in ("matrices", "vectors", "scaled_init", "carry_gates", "carry_scalars"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    def applies_branch(self, knobs: object) -> bool:
        """Whether the branch multiplier applies with these knobs (the rule's `branch_switch`, where it has one)."""
        return self.branch_switch is None or bool(getattr(knobs, self.branch_switch))

    def table_row(self) -> dict:
        """Plain data: what `rrtrain params` and a run's parametrization.json show."""
        return {"branch": self.branch, "matrices": list(self.matrices), "vectors": list(self.vectors),
                "scaled_init": list(self.scaled_init), "carry_gates": list(self.carry_gates),
                "carry_scalars": list(self.carry_scalars),
                "completep": "refused: " + self.depth if self.depth else "accepted"}
