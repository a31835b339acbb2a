"""Registry of residual rules by name. The model asks `get(name)` and never branches on a name."""

from __future__ import annotations

from rrtrain.residuals.base import RuleSpec, Site, SiteInfo, State, Stream, StreamInfo
from rrtrain.residuals.single import (
    HighwayConvexSite,
    HighwaySite,
    LayerScaleSite,
    PreNormSite,
    ReviewConvexSite,
    ReviewSite,
    ReZeroSite,
    SingleStream,
)

_RULES: dict[str, RuleSpec] = {}


def register(spec: RuleSpec) -> RuleSpec:
    if spec.name in _RULES:
        raise ValueError(f"residual rule '{spec.name}' registered twice")
    _RULES[spec.name] = spec
    return spec


def get(name: str) -> RuleSpec:
    try:
        return _RULES[name]
    except KeyError:
        raise KeyError(f"unknown residual rule '{name}'; known: {', '.join(names())}") from None


def names() -> list[str]:
    return list(_RULES)


def _single(name: str, site: type[PreNormSite], summary: str, **kw) -> RuleSpec:
    """Register a single-stream rule: its parameters are the final norm plus one site per sublayer."""

    def params(d: int, n_sublayers: int, cfg) -> int:
        return SingleStream.count(d) + n_sublayers * site.count_for(d, cfg)

    return register(RuleSpec(name=name, site=site, stream=SingleStream, params=params, summary=summary, **kw))


_single("standard", PreNormSite, "h + u (pre-norm residual)")
_single("review", ReviewSite, "h + r*u, r = sigma(W[RMSN(h); RMSN(u)] + b) (Review Residuals, Eq. 1)", gated=True)
_single("review_convex", ReviewConvexSite, "(1-r)*h + r*u with Review's gate (fails beyond ~20 layers)",
        gated=True, convex=True)
_single("highway", HighwaySite, "h + r*u, r = sigma(W RMSN(h) + b) (state-only gate, additive)", gated=True)
_single("highway_convex", HighwayConvexSite, "(1-r)*h + r*u, r = sigma(W RMSN(h) + b), carry bias (classic Highway)",
        gated=True, convex=True)
_single("rezero", ReZeroSite, "h + alpha*u, scalar alpha = 0 at start (ReZero)")
_single("layerscale", LayerScaleSite, "h + lambda*u, per-channel lambda, CaiT depth init (LayerScale)")

# Multi-stream (gr, hc, mhc), depth-aggregating (attnres), post-norm (deepnorm) and normalisation-free (fixup)
# rules: one module each.
from rrtrain.residuals import attnres, deepnorm, fixup, gr, hc, mhc  # noqa: E402  (after the registry exists)

for _spec in (gr.SPEC, hc.SPEC, mhc.SPEC, attnres.SPEC, deepnorm.SPEC, fixup.SPEC):
    register(_spec)

__all__ = ["RuleSpec", "Site", "SiteInfo", "State", "Stream", "StreamInfo", "get", "names", "register"]
