"""Pydantic models of grid files (``ablate/search_spaces/*.yaml``), every level typed.

:class:`GridFile` is a file as written (the top level, and one :class:`GridScale` per scale); each value is
checked where it is written, so an error names the key path in the file. :meth:`GridFile.at_scale` merges the
top level, the scale's preset and the scale's overrides into :class:`GridSettings`: what every trial of the grid
at that scale resolves from (:class:`ablate.service.specs.grids.Grid` adds where it came from). The Optuna search is
:class:`ablate.service.specs.optuna.OptunaSpec`. Errors read ``<file>: <key path>: <what is allowed>``
(:func:`ablate.service.specs.base.spec_error`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from ablate.config import RunConfig, unknown_setting
from ablate.service.specs.base import SettingName, Settings, Spec, partial
from ablate.service.specs.optuna import OptunaSpec

__all__ = [
    "DEFAULT_SCALE",
    "SCALES",
    "STOP_KEYS",
    "Axes",
    "ChosenEntry",
    "GridAbout",
    "GridFile",
    "GridScale",
    "GridSettings",
    "PaperValues",
    "Seeds",
    "Settings",
    "StopSpec",
    "VariantSpec",
]

#: Every grid's scales: smoke (seconds, the tests), laptop (minutes on 2 CPU cores), paper (the papers' budgets).
SCALES = ("smoke", "laptop", "paper")
#: The scale a grid runs at unless one is named (``--scale``).
DEFAULT_SCALE = "laptop"
Scale = Literal["smoke", "laptop", "paper"]


def _axis_values(values: list[Any]) -> list[Any]:
    if not values:
        raise ValueError("empty axis: give at least one value")
    return values


#: RunConfig field → the values it takes; the Cartesian product of the axes is the grid.
Axes = dict[SettingName, Annotated[list[Any], AfterValidator(_axis_values)]]
#: The seeds every grid point runs with.
Seeds = Annotated[list[int], Field(min_length=1)]
#: The papers' numbers a grid's claims and report compare with: a number, or names → numbers (two levels deep).
PaperValues = dict[str, float | dict[str, float | dict[str, float]]]


class StopSpec(Spec):
    """When a trial stops: after ``max_steps``, or once R² reaches ``target_r2``."""

    max_steps: int = Field(ge=1, description="the number of training steps per trial")
    target_r2: float | None = Field(default=None, gt=0, le=1, description="stop a trial once its R² reaches it")

    def settings(self) -> dict[str, Any]:
        """The RunConfig settings of this stop rule (those set)."""
        return self.model_dump(exclude_none=True)


#: The RunConfig settings a grid keeps under ``stop:`` (its stop rule) rather than ``base:``.
STOP_KEYS = tuple(StopSpec.model_fields)


class VariantSpec(Spec):
    """One variant of a grid: a name and the RunConfig settings it bundles (``{name: infonce, loss: infonce}``)."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(description="the variant's name, unique in the grid")

    @model_validator(mode="after")
    def _known_settings(self) -> VariantSpec:
        for key in self.model_extra or {}:
            if key not in RunConfig.model_fields:
                raise ValueError(f".{key}: {unknown_setting(key)}")
        return self

    @property
    def settings(self) -> dict[str, Any]:
        """The RunConfig settings this variant sets."""
        return dict(self.model_extra or {})

    def param(self) -> dict[str, Any]:
        """The variant as it travels in a trial's params: its name and settings in one mapping."""
        return {"name": self.name, **self.settings}


def _unique_names(variants: list[VariantSpec]) -> list[VariantSpec]:
    names: set[str] = set()
    for i, v in enumerate(variants):
        if v.name in names:
            raise ValueError(f"[{i}].name: duplicate variant name {v.name!r}")
        names.add(v.name)
    return variants


#: Named bundles of settings: one more axis of the grid.
Variants = Annotated[list[VariantSpec], AfterValidator(_unique_names)]


class ChosenEntry(Spec):
    """A value the papers' text does not give, and why it was chosen."""

    key: str = Field(description="what was chosen, e.g. axes.batch_size (paper scale)")
    value: Any = Field(default=None, description="the chosen value")
    why: str = Field(description="why it was chosen, in one line")

    def as_dict(self) -> dict[str, Any]:
        """The entry as written (``value`` only when given)."""
        return self.model_dump(include={"key", *({"value"} & self.model_fields_set), "why"})


class GridAbout(Spec):
    """What a grid is about: shared by the file and by a loaded grid."""

    name: str = Field(min_length=1, description="the grid's name (= the file name)")
    description: str = Field(default="", description="what the grid studies")
    figure: str = Field(default="", description="the paper figure it reproduces")
    chosen: list[ChosenEntry] = Field(default_factory=list, description="values the papers' text does not give")
    paper_values: PaperValues = Field(default_factory=dict, description="the papers' numbers the report marks")


PartialStop = partial(StopSpec)
PartialOptuna = partial(OptunaSpec)


class GridScale(Spec):
    """What one scale (smoke, laptop, paper) overrides of the grid's top level."""

    preset: str | None = Field(
        default=None, description="a preset (ablate/presets/) under the scale's base and stop and the grid's axes"
    )
    base: Settings | None = Field(default=None, description="RunConfig settings merged over the grid's base")
    axes: Axes | None = Field(default=None, description="axes merged over the grid's axes")
    variants: Variants | None = Field(default=None, description="replaces the grid's variants")
    seeds: Seeds | None = Field(default=None, description="replaces the grid's seeds")
    stop: PartialStop | None = Field(default=None, description="merged over the grid's stop rule")
    optuna: PartialOptuna | None = Field(default=None, description="merged over the grid's Optuna search")
    description: str | None = Field(default=None, description="replaces the grid's description")


def _every_scale(scales: dict[str, GridScale | None]) -> dict[str, GridScale | None]:
    missing = [s for s in SCALES if s not in scales]
    if missing:
        raise ValueError(f"every grid needs the scales {', '.join(SCALES)}; missing {', '.join(missing)}")
    return scales


class GridFile(GridAbout):
    """A grid file as written: the top level, and one :class:`GridScale` per scale."""

    base: Settings | None = Field(default=None, description="RunConfig settings of every trial")
    axes: Axes | None = Field(default=None, description="RunConfig field → values; the product is the grid")
    variants: Variants | None = Field(default=None, description="one more axis of named bundles of settings")
    seeds: Seeds | None = Field(default=None, description="the seeds every point runs with")
    stop: PartialStop | None = Field(default=None, description="max_steps (required) and target_r2")
    search: Literal["grid", "optuna"] = Field(default="grid", description="grid search, or Optuna + ASHA")
    optuna: PartialOptuna | None = Field(default=None, description="the Optuna search (search: optuna only)")
    scales: Annotated[dict[Scale, GridScale | None], AfterValidator(_every_scale)] = Field(
        description="smoke, laptop and paper overrides (all three required)"
    )

    def at_scale(self, scale: str, preset: dict[str, Any] | None = None) -> dict[str, Any]:
        """The grid's settings at ``scale`` (to validate as :class:`GridSettings`): over the top level, the
        settings of the scale's ``preset``, then the scale's overrides; as with ``--preset``, what the grid varies
        (axes, variants, Optuna) keeps its values."""
        over = self.scales[scale] or GridScale()
        optuna = {**_given(self.optuna), **_given(over.optuna)}
        axes = {**(self.axes or {}), **(over.axes or {})}
        variants = over.variants if over.variants is not None else (self.variants or [])
        varied = {*axes, *(optuna.get("space") or {})} | {k for v in variants for k in v.settings}
        start = {k: v for k, v in (preset or {}).items() if k not in varied}
        stop = {k: start.pop(k) for k in STOP_KEYS if k in start}
        return {
            "description": over.description if over.description is not None else self.description,
            "base": {**(self.base or {}), **start, **(over.base or {})},
            "axes": axes,
            "variants": variants,
            "seeds": over.seeds if over.seeds is not None else (self.seeds if self.seeds is not None else [0]),
            "stop": {**_given(self.stop), **stop, **_given(over.stop)},
            "search": self.search,
            "optuna": optuna if optuna or self.search == "optuna" else None,
        }


def _given(spec: Spec | None) -> dict[str, Any]:
    return spec.model_dump(exclude_unset=True) if spec is not None else {}


class GridSettings(Spec):
    """A grid's settings at one scale, after merging: every value checked, trials not yet expanded."""

    description: str = Field(default="", description="what the grid studies")
    base: Settings = Field(default_factory=dict, description="RunConfig settings of every trial")
    axes: Axes = Field(default_factory=dict, description="RunConfig field → values; the product is the grid")
    variants: Variants = Field(default_factory=list, description="one more axis of named bundles of settings")
    seeds: Seeds = Field(default_factory=lambda: [0], description="the seeds every point runs with")
    stop: StopSpec = Field(description="max_steps (required) and target_r2")
    search: Literal["grid", "optuna"] = Field(default="grid", description="grid search, or Optuna + ASHA")
    optuna: OptunaSpec | None = Field(default=None, description="the Optuna search (search: optuna only)")

    @model_validator(mode="before")
    @classmethod
    def _optuna_only_with_optuna(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("search", "grid") != "optuna" and data.get("optuna"):
            raise ValueError(".optuna: only used with search: optuna")
        return data
