"""The Optuna (TPE) + ASHA search of a grid with ``search: optuna``, typed: :class:`OptunaSpec`, whose ``space``
maps RunConfig settings to distributions (:data:`Distribution`: one of :class:`Uniform`, :class:`LogUniform`,
:class:`RandInt`, :class:`Choice`, written ``{uniform: [low, high]}``, ``{choice: [a, b, ...]}``, ...)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag, model_validator

from ablate.service.specs.base import SettingName, Spec

__all__ = ["DISTRIBUTIONS", "Choice", "Distribution", "LogUniform", "OptunaSpec", "RandInt", "Uniform"]


class _Distribution(Spec):
    """One dimension of the search: a mapping with one key, the distribution's name."""

    @property
    def kind(self) -> str:
        """The distribution's name (its one key)."""
        return next(iter(type(self).model_fields))

    @property
    def args(self) -> list[Any]:
        """What follows the name: ``[low, high]`` or the choices."""
        return getattr(self, self.kind)

    def domain(self) -> tuple[Any, bool]:
        """Ray Tune's search domain, and whether its values travel as JSON text (see :class:`Choice`)."""
        raise NotImplementedError


class _Range(_Distribution):
    @model_validator(mode="after")
    def _ordered(self) -> _Range:
        low, high = self.args
        if not low < high:
            raise ValueError(f"{self.kind}({low:g}, {high:g}) is an empty or reversed range: need low < high")
        return self


_RANGE = Field(min_length=2, max_length=2, description="[low, high]")


class Uniform(_Range):
    """A number drawn uniformly from ``[low, high]``."""

    uniform: Annotated[list[float], _RANGE]

    def domain(self) -> tuple[Any, bool]:
        from ray import tune

        return tune.uniform(*self.uniform), False


class LogUniform(_Range):
    """A number drawn uniformly on a log scale from ``[low, high]``, low > 0."""

    loguniform: Annotated[list[float], _RANGE]

    @model_validator(mode="after")
    def _positive(self) -> LogUniform:
        if self.loguniform[0] <= 0:
            raise ValueError(f"loguniform needs low > 0, got {self.loguniform[0]:g}")
        return self

    def domain(self) -> tuple[Any, bool]:
        from ray import tune

        return tune.loguniform(*self.loguniform), False


class RandInt(_Range):
    """An integer drawn uniformly from ``[low, high]``, both included."""

    randint: Annotated[list[int], Field(min_length=2, max_length=2, description="[low, high], both included")]

    def domain(self) -> tuple[Any, bool]:
        from ray import tune

        return tune.randint(self.randint[0], self.randint[1] + 1), False


class Choice(_Distribution):
    """One of the listed values. Optuna stores only None, bool, int, float and str choices, so lists and mappings
    (e.g. encoder widths) travel as their JSON text (:data:`ablate.service.specs.params.JSON_CHOICES`)."""

    choice: list[Any] = Field(min_length=1, description="the values to choose from")

    def domain(self) -> tuple[Any, bool]:
        from ray import tune

        if any(isinstance(v, list | dict) for v in self.choice):
            return tune.choice([json.dumps(v, separators=(",", ":")) for v in self.choice]), True
        return tune.choice(list(self.choice)), False


_KINDS = {"choice": Choice, "loguniform": LogUniform, "randint": RandInt, "uniform": Uniform}
#: The distributions a search space may name.
DISTRIBUTIONS = tuple(_KINDS)


def _kind(value: Any) -> str | None:
    if isinstance(value, _Distribution):
        return value.kind
    return next(iter(value)) if isinstance(value, dict) and len(value) == 1 else None


#: One dimension of a search space, by the name of its one key.
Distribution = Annotated[
    Union[tuple(Annotated[model, Tag(name)] for name, model in _KINDS.items())],  # noqa: UP007
    Discriminator(
        _kind,
        custom_error_type="distribution",
        custom_error_message="expected one of {choice: [values]}, {loguniform: [low, high]}, "
        "{randint: [low, high]}, {uniform: [low, high]}",
    ),
]


class OptunaSpec(Spec):
    """The Optuna (TPE) + ASHA search of a grid with ``search: optuna``."""

    space: dict[SettingName, Distribution] = Field(
        min_length=1, description="setting → {uniform|loguniform|randint: [low, high]} or {choice: [...]}"
    )
    num_samples: int = Field(default=8, ge=1, description="trials Optuna proposes")
    metric: str = Field(default="r2", description="the reported metric to optimise")
    mode: Literal["max", "min"] = Field(default="max", description="maximise or minimise the metric")
    grace_period: int = Field(default=2, ge=1, description="ASHA's first rung (reports, or seconds)")
    reduction_factor: int = Field(default=2, ge=1, description="ASHA's reduction factor")
    max_concurrent: int | None = Field(default=None, ge=1, description="trials running at once (default 2)")
    time_budget_s: float | None = Field(
        default=None, gt=0, description="with it, ASHA's rungs are seconds", json_schema_extra={"unit": "seconds"}
    )

    @model_validator(mode="after")
    def _grace(self) -> OptunaSpec:
        if self.time_budget_s is not None and not 0 < self.grace_period < self.time_budget_s:
            raise ValueError(
                f".grace_period: with time_budget_s it is in seconds and must lie in "
                f"(0, {self.time_budget_s:g}), got {self.grace_period}"
            )
        return self

    def as_dict(self) -> dict[str, Any]:
        """The search as a plain mapping, as the run marker records it (optional keys only when set)."""
        return self.model_dump(exclude_none=True)
