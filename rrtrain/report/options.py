"""What the user asked for (`rrtrain report` flags), as one typed object; imports nothing heavy."""

from __future__ import annotations

from dataclasses import dataclass, field

from rrtrain.core.errors import UsageError

DEFAULT_REFERENCE = "review"


@dataclass
class Options:
    reference: str | None = None  # None: `review` if present, else the first variant alphabetically
    baselines: list[str] | None = None  # None: every other variant present
    alpha: float = 0.05  # significance level of the Welch tests
    power: float = 0.8  # target power of the seed counts
    effect: float | None = None  # nats; None: plan for the observed difference
    extrapolate: list[float] = field(default_factory=list)  # parameter counts
    include_flagged: bool = False  # keep flagged runs (that have a final val loss) in the means
    # a sweep with a grid (`rrtrain.report.grid`): seeds below this choose each variant's point, the rest are tested
    select_seeds: int = 1
    shared: str | None = None  # the shared point, `train.lr=3e-3,...`; None: the middle of each grid key
    lr_for: list[tuple[str, float]] = field(default_factory=list)  # (name, params) to suggest a learning rate for


def choose_variants(present: list[str], reference: str | None, baselines: list[str] | None) -> tuple[str, list[str]]:
    """Resolve --reference / --baselines against the variants present (UsageError if one is absent).

    Defaults: the reference is `review` when any run is a review run, otherwise the first variant
    alphabetically; the baselines are every other variant present, alphabetically.
    """
    if not present:
        raise UsageError("no run names its variant (final.json 'variant' or config.yaml model.variant)")
    if reference is None:
        reference = DEFAULT_REFERENCE if DEFAULT_REFERENCE in present else sorted(present)[0]
    elif reference not in present:
        raise UsageError(f"--reference {reference!r} has no runs; variants present: {', '.join(sorted(present))}")
    if baselines is None:
        baselines = sorted(v for v in present if v != reference)
    else:
        missing = [b for b in baselines if b not in present]
        if missing:
            raise UsageError(
                f"--baselines {', '.join(missing)}: no runs; variants present: {', '.join(sorted(present))}"
            )
        if reference in baselines:
            raise UsageError(f"--baselines includes the reference {reference!r}")
    return reference, list(baselines)
