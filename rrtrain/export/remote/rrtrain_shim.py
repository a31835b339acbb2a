"""What the copied rrtrain source imports from the parts of rrtrain an export leaves behind: the error type, the
configuration section of the residual knobs (here a plain holder of the values the run recorded) and the
registry (here the one rule the model was trained with)."""

from __future__ import annotations

from typing import Any


class UsageError(Exception):
    """rrtrain's one-line error for bad input."""


class ResidualConfig:
    """`model.residual` as the run recorded it: every knob an attribute."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)

    def values(self) -> dict[str, Any]:
        return dict(self.__dict__)


class ModelConfig:
    """Named by the copied sizing module's signatures only: an export never resolves a shape from a config."""


class residuals:  # noqa: N801 - stands where rrtrain's registry module `residuals` stood
    """The registry, reduced to the exported rule."""

    @staticmethod
    def get(name: str) -> Any:
        from .exported_rule import SPEC

        if name != SPEC.name:
            raise KeyError(f"this export holds residual rule '{SPEC.name}' only, not '{name}'")
        return SPEC

    @staticmethod
    def names() -> list[str]:
        from .exported_rule import SPEC

        return [SPEC.name]
