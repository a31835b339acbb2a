"""The built-in rules, in the order `rrtrain params` and the docs list them: single-stream (7 rules in one
module), multi-stream (gr, hc, mhc), depth-aggregating (attnres), post-norm (deepnorm) and
normalisation-free (fixup); then the rules of issue 49: peri_ln, ln_scaling, layer_scalars, laurel, denseformer,
value_residual, frac, ngpt, mudd.

Apart from the registry (`__init__.py`, which also finds other packages' rules): an exported model
(rrtrain/export/) carries this module and finds its rule here, with no registry and no entry points.
"""

from __future__ import annotations

from .attnres import SPEC as ATTNRES
from .base import RuleSpec
from .deepnorm import SPEC as DEEPNORM
from .denseformer import SPEC as DENSEFORMER
from .fixup import SPEC as FIXUP
from .frac import SPEC as FRAC
from .gr import SPEC as GR
from .hc import SPEC as HC
from .laurel import SPEC as LAUREL
from .layerscalars import SPEC as LAYER_SCALARS
from .lnscaling import SPEC as LN_SCALING
from .mhc import SPEC as MHC
from .mudd import SPEC as MUDD
from .ngpt import SPEC as NGPT
from .periln import SPEC as PERI_LN
from .single import SPECS as SINGLE
from .valueresidual import SPEC as VALUE_RESIDUAL

SPECS: tuple[RuleSpec, ...] = (*SINGLE, GR, HC, MHC, ATTNRES, DEEPNORM, FIXUP, PERI_LN, LN_SCALING, LAYER_SCALARS,
                               LAUREL, DENSEFORMER, VALUE_RESIDUAL, FRAC, NGPT, MUDD)


def rule_named(name: str) -> RuleSpec:
    """The built-in rule called `name`; KeyError naming the known ones otherwise."""
    for spec in SPECS:
        if spec.name == name:
            return spec
    raise KeyError(f"no built-in residual rule '{name}'; known: {', '.join(s.name for s in SPECS)}")
