"""Pydantic models of grid files (``ablate/search_spaces/*.yaml``), and the helpers every spec model shares.

Each file is parsed from a path or from text (a run's marker stores the grid's YAML text), validated by a
pydantic model, and every problem becomes one error naming the file, the key path and what is allowed
(:func:`spec_error`). Presets (:mod:`ablate.service.presets`) and the report's dashboard specs
(:mod:`ablate.reports.spec`) use the same helpers.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ablate.config import RunConfig, unknown_setting, yaml_loader
from ablate.files import read_file_text  # re-exported for grids, presets and dashboard specs

__all__ = [
    "DEFAULT_SCALE",
    "SCALES",
    "STOP_KEYS",
    "GridFile",
    "GridScale",
    "OptunaSpec",
    "Spec",
    "parse_spec",
    "read_file_text",
    "read_yaml",
    "spec_error",
    "unknown_settings",
]

#: Every grid's scales: smoke (seconds, the tests), laptop (minutes on 2 CPU cores), paper (the papers' budgets).
SCALES = ("smoke", "laptop", "paper")
#: The RunConfig settings a grid keeps under ``stop:`` (its stop rule) rather than ``base:``.
STOP_KEYS = ("max_steps", "target_r2")
#: The scale a grid runs at unless one is named (``--scale``).
DEFAULT_SCALE = "laptop"
_DISTRIBUTIONS = ("choice", "loguniform", "randint", "uniform")
_TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "string": "a string",
    "list": "a list",
    "dict": "a mapping",
    "bool": "true/false",
    "literal_error": "one of the allowed values",
}


# ------------------------------------------------------------------------------------------ reading and errors
def read_yaml(source: str | os.PathLike, error: type[Exception], *, text: str | None = None) -> dict[str, Any]:
    """Safe-load a YAML mapping from the file ``source`` (or from ``text``, named ``source`` in errors).

    Malformed YAML raises ``error`` naming the file, line and column; a top level that is not a mapping too.
    """
    import yaml

    if text is None:
        text = read_file_text(source, error)
    try:
        data = yaml.load(text, Loader=yaml_loader())  # noqa: S506 (a SafeLoader subclass)
    except yaml.reader.ReaderError as exc:  # a control character: not a text file
        char = exc.character if isinstance(exc.character, int) else ord(exc.character)
        raise error(f"{source}: not a YAML text file (character #x{char:04x} at position {exc.position})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise error(f"{source}: malformed YAML at {where}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise error(f"{source}: the top level must be a mapping of keys")
    return data


def _loc(parts: tuple) -> str:
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif not str(p).startswith(("function-", "model-")):
            out += f".{p}" if out else str(p)
    return out


def spec_error(exc: ValidationError, source: str | os.PathLike, error: type[Exception]) -> Exception:
    """One ``error`` for a pydantic ValidationError: ``<file>: <key path>: <what is wrong and allowed>``.

    Validators address a sub-key by starting their message with ``.key:`` or ``[i]:`` (e.g. ``.batch_size: empty
    axis``).
    """
    parts = []
    for err in exc.errors():
        loc, kind = _loc(err["loc"]), err["type"]
        if kind == "value_error":
            msg = str(err["ctx"]["error"])
        elif kind == "missing":
            msg = "required"
        elif kind == "extra_forbidden":
            msg = "unknown key"
        else:
            word = next((w for k, w in _TYPE_WORDS.items() if kind.startswith(k)), None)
            msg = f"expected {word}, got {err.get('input')!r}" if word else f"{err['msg']} (got {err.get('input')!r})"
            if kind == "literal_error":
                msg = f"{err.get('input')!r} is not allowed; allowed: {err['ctx']['expected']}"
        if msg.startswith((".", "[")):
            parts.append(f"{loc}{msg}" if loc else msg.removeprefix("."))
        else:
            parts.append(f"{loc}: {msg}" if loc else msg)
    return error(f"{source}: " + "; ".join(parts))


class Spec(BaseModel):
    """Base of every spec model: unknown keys are errors that list the allowed ones."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            allowed = sorted(cls.model_fields)
            for key in data:
                if key not in cls.model_fields:
                    raise ValueError(f".{key}: unknown key; allowed: {', '.join(allowed)}")
        return data


def parse_spec(
    model: type[BaseModel],
    data: dict[str, Any],
    source: str | os.PathLike,
    error: type[Exception],
    context: dict[str, Any] | None = None,
):
    """Validate ``data`` with ``model`` (``context`` reaches its validators); any problem raises ``error``
    naming ``source`` and the key."""
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise spec_error(exc, source, error) from None


def unknown_settings(mapping: dict[str, Any], where: str = "") -> None:
    """Raise (for a validator) when a key of ``mapping`` is not a RunConfig field; ``where`` prefixes the key."""
    for key in mapping:
        if key not in RunConfig.model_fields:
            raise ValueError(f"{where}.{key}: {unknown_setting(key)}")


# ------------------------------------------------------------------------------------------ grids
class OptunaSpec(Spec):
    """The Optuna (TPE) + ASHA search of a grid with ``search: optuna``."""

    space: dict[str, dict[str, Any]] = Field(
        description="setting → {uniform|loguniform|randint: [lo, hi]} or {choice: [...]}"
    )
    num_samples: int = Field(default=8, ge=1, description="trials Optuna proposes")
    metric: str = Field(default="r2", description="the reported metric to optimise")
    mode: Literal["max", "min"] = Field(default="max", description="maximise or minimise the metric")
    grace_period: int = Field(default=2, description="ASHA's first rung (reports, or seconds with time_budget_s)")
    reduction_factor: int = Field(default=2, description="ASHA's reduction factor")
    max_concurrent: int | None = Field(default=None, description="trials running at once (default 2)")
    time_budget_s: float | None = Field(default=None, description="with it, ASHA's rungs are seconds of training")

    @field_validator("num_samples", mode="before")
    @classmethod
    def _samples(cls, n: Any) -> Any:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"must be an integer >= 1, got {n!r}")
        return n

    @field_validator("mode", mode="before")
    @classmethod
    def _mode(cls, mode: Any) -> Any:
        if mode not in ("max", "min"):
            raise ValueError(f"must be max or min, got {mode!r}")
        return mode

    @field_validator("space", mode="before")
    @classmethod
    def _space(cls, space: Any) -> Any:
        if not isinstance(space, dict) or not space:
            raise ValueError("required: at least one setting to search")
        unknown_settings(space)
        for key, dist in space.items():
            if not isinstance(dist, dict) or len(dist) != 1 or next(iter(dist)) not in _DISTRIBUTIONS:
                raise ValueError(f".{key}: expected one of {{{', '.join(_DISTRIBUTIONS)}: ...}}, got {dist!r}")
            ((kind, args),) = dist.items()
            if kind == "choice":
                if not isinstance(args, list) or not args:
                    raise ValueError(f".{key}: choice needs a non-empty list, got {args!r}")
                continue
            if not (isinstance(args, list) and len(args) == 2 and all(isinstance(a, int | float) for a in args)):
                raise ValueError(f".{key}: {kind} needs [low, high], got {args!r}")
            lo, hi = args
            if not lo < hi:
                raise ValueError(f".{key}: {kind}({lo}, {hi}) is an empty or reversed range: need low < high")
            if kind == "loguniform" and lo <= 0:
                raise ValueError(f".{key}: loguniform needs low > 0, got {lo}")
        return space

    @field_validator("time_budget_s", mode="before")
    @classmethod
    def _budget(cls, budget: Any) -> Any:
        if budget is not None and (not isinstance(budget, int | float) or isinstance(budget, bool) or budget <= 0):
            raise ValueError(f"must be a number of seconds > 0, got {budget!r}")
        return budget

    @model_validator(mode="after")
    def _grace(self) -> OptunaSpec:
        if self.time_budget_s is not None and not 0 < self.grace_period < self.time_budget_s:
            raise ValueError(
                f".grace_period: with time_budget_s it is in seconds and must lie in "
                f"(0, {self.time_budget_s:g}), got {self.grace_period}"
            )
        return self

    def as_dict(self) -> dict[str, Any]:
        """The plain dict the runner and the report read (optional keys only when set)."""
        return self.model_dump(exclude_none=True)


class GridScale(Spec):
    """What one scale (smoke, laptop, paper) overrides of the grid's top level."""

    preset: str | None = Field(
        default=None, description="a preset (ablate/presets/) under the scale's base and stop and the grid's axes"
    )
    base: dict[str, Any] | None = Field(default=None, description="RunConfig settings merged over the grid's base")
    axes: dict[str, Any] | None = Field(default=None, description="axes merged over the grid's axes")
    variants: list[Any] | None = Field(default=None, description="replaces the grid's variants")
    seeds: Any = Field(default=None, description="replaces the grid's seeds")
    stop: dict[str, Any] | None = Field(default=None, description="merged over the grid's stop rule")
    optuna: dict[str, Any] | None = Field(default=None, description="merged over the grid's Optuna search")
    description: str | None = Field(default=None, description="replaces the grid's description")


class GridFile(Spec):
    """A grid file as written: the top level, and one :class:`GridScale` per scale."""

    name: str = Field(min_length=1, description="the grid's name (= the file name)")
    description: str = Field(default="", description="what the grid studies")
    figure: str = Field(default="", description="the paper figure it reproduces")
    base: dict[str, Any] | None = Field(default=None, description="RunConfig settings of every trial")
    axes: dict[str, Any] | None = Field(default=None, description="RunConfig field → values; the product is the grid")
    variants: list[Any] | None = Field(default=None, description="one more axis of named bundles of settings")
    seeds: Any = Field(default=None, description="the seeds every point runs with")
    stop: dict[str, Any] | None = Field(default=None, description="max_steps (required) and target_r2")
    search: Literal["grid", "optuna"] = Field(default="grid", description="grid search, or Optuna + ASHA")
    optuna: dict[str, Any] | None = Field(default=None, description="the Optuna search (search: optuna only)")
    scales: dict[str, GridScale] = Field(description="smoke, laptop and paper overrides (all three required)")
    chosen: list[dict[str, Any]] | None = Field(default=None, description="values the papers' text does not give")
    paper_values: dict[str, Any] | None = Field(default=None, description="the papers' numbers the report marks")

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, name: Any) -> Any:
        if not isinstance(name, str) or not name:
            raise ValueError("required: a non-empty string")
        return name

    @field_validator("search", mode="before")
    @classmethod
    def _search(cls, search: Any) -> Any:
        if search not in ("grid", "optuna"):
            raise ValueError(f"unknown search {search!r}; allowed: grid, optuna")
        return search

    @field_validator("scales", mode="before")
    @classmethod
    def _scales(cls, scales: Any) -> Any:
        if scales is None:
            scales = {}
        if not isinstance(scales, dict):
            raise ValueError(f"expected a mapping, got {type(scales).__name__} {scales!r}")
        for s in scales:
            if s not in SCALES:
                raise ValueError(f".{s}: unknown scale; allowed: {', '.join(SCALES)}")
        missing = [s for s in SCALES if s not in scales]
        if missing:
            raise ValueError(f"every grid needs the scales {', '.join(SCALES)}; missing {', '.join(missing)}")
        return {k: v or {} for k, v in scales.items()}

    @model_validator(mode="before")
    @classmethod
    def _name_first(cls, data: Any) -> Any:
        if isinstance(data, dict) and "name" not in data:
            raise ValueError(".name: required: a non-empty string")
        return data

    def at_scale(self, scale: str, preset: dict[str, Any] | None = None) -> GridScaleResolved:
        """The grid's settings at ``scale``, validated: over the top level, the settings of the scale's ``preset``,
        then the scale's overrides; as with ``--preset``, what the grid varies (axes, variants, Optuna) keeps its
        values."""
        over = self.scales[scale]
        merged: dict[str, Any] = {}
        for key in ("axes", "optuna"):
            merged[key] = {**(getattr(self, key) or {}), **(getattr(over, key) or {})}
        merged["variants"] = over.variants if over.variants is not None else (self.variants or [])
        space = merged["optuna"].get("space")
        varied = {*merged["axes"], *(space if isinstance(space, dict) else {})}
        varied |= {k for v in merged["variants"] if isinstance(v, dict) for k in v}
        start = {k: v for k, v in (preset or {}).items() if k not in varied}
        stop = {k: start.pop(k) for k in STOP_KEYS if k in start}
        merged["base"] = {**(self.base or {}), **start, **(over.base or {})}
        merged["stop"] = {**(self.stop or {}), **stop, **(over.stop or {})}
        merged["seeds"] = over.seeds if over.seeds is not None else (self.seeds if self.seeds is not None else [0])
        merged["search"] = self.search
        merged["description"] = over.description if over.description is not None else self.description
        return GridScaleResolved.model_validate(merged)


class GridScaleResolved(Spec):
    """A grid's settings at one scale, after merging: every value checked, trials not yet expanded."""

    description: str = ""
    base: dict[str, Any]
    axes: dict[str, list[Any]]
    variants: list[dict[str, Any]]
    seeds: list[int]
    stop: dict[str, Any]
    search: Literal["grid", "optuna"]
    optuna: dict[str, Any]

    @field_validator("base", mode="before")
    @classmethod
    def _base(cls, base: Any) -> Any:
        unknown_settings(base)
        return base

    @field_validator("axes", mode="before")
    @classmethod
    def _axes(cls, axes: Any) -> Any:
        unknown_settings(axes)
        for k, values in axes.items():
            if not isinstance(values, list):
                raise ValueError(f".{k}: expected a list of values, got {values!r}")
            if not values:
                raise ValueError(f".{k}: empty axis: give at least one value")
        return axes

    @field_validator("variants", mode="before")
    @classmethod
    def _variants(cls, variants: Any) -> Any:
        if not isinstance(variants, list):
            raise ValueError("expected a list of mappings with a 'name'")
        names: set[str] = set()
        for i, v in enumerate(variants):
            if not isinstance(v, dict) or not isinstance(v.get("name"), str):
                raise ValueError(f"[{i}]: expected a mapping with a string 'name', got {v!r}")
            if v["name"] in names:
                raise ValueError(f"[{i}].name: duplicate variant name {v['name']!r}")
            names.add(v["name"])
            unknown_settings({k: x for k, x in v.items() if k != "name"}, f"[{i}]")
        return variants

    @field_validator("seeds", mode="before")
    @classmethod
    def _seeds(cls, seeds: Any) -> Any:
        if (
            not isinstance(seeds, list)
            or not seeds
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
        ):
            raise ValueError(f"expected a non-empty list of integers, got {seeds!r}")
        return seeds

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, stop: Any) -> Any:
        for k in stop:
            if k not in STOP_KEYS:
                raise ValueError(f".{k}: unknown key; allowed: {', '.join(STOP_KEYS)}")
        if "max_steps" not in stop:
            raise ValueError(".max_steps: required: the number of training steps per trial")
        ms = stop["max_steps"]
        if not isinstance(ms, int) or isinstance(ms, bool) or ms < 1:
            raise ValueError(f".max_steps: must be an integer >= 1, got {ms!r}")
        return stop

    @model_validator(mode="after")
    def _optuna(self) -> GridScaleResolved:
        if self.search == "optuna":
            try:
                self.optuna = OptunaSpec.model_validate(self.optuna).as_dict()
            except ValidationError as exc:
                raise ValueError(_nested(exc, "optuna")) from None
        elif self.optuna:
            raise ValueError(".optuna: only used with search: optuna")
        return self


def _nested(exc: ValidationError, key: str) -> str:
    """A nested model's ValidationError as one message addressed to ``.key``."""
    text = str(spec_error(exc, "", ValueError))[2:]  # drop the empty source's ": "
    return f".{key}.{text}" if not text.startswith(("[", ".")) else f".{key}{text}"
