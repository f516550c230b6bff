"""Grids: load and validate `ablate/search_spaces/*.yaml` (models in ablate.service.specs.grid), expand a scale into trials and a Ray param_space.

A grid file holds::

    name: batch_vs_dim                # must match the file name
    description: ...
    figure: Rusak et al. 2024, Fig. 4A and 9A
    base: {RunConfig fields fixed for every trial}
    axes: {RunConfig field: [values, ...]}   # the Cartesian product is the grid
    variants: [{name: ..., <RunConfig overrides>}, ...]   # optional: one more axis of bundled settings
    seeds: [0, 1, 2]
    stop: {max_steps: N, target_r2: optional}
    search: grid | optuna            # optuna: see `optuna:` below
    optuna: {space: {field: {loguniform|uniform: [lo, hi]} | {choice: [...]} | {randint: [lo, hi]}},
             num_samples: N, metric: r2, mode: max, grace_period: 2, reduction_factor: 2,
             time_budget_s: optional}  # with it, ASHA's rungs (and grace_period) are seconds of training
                                       # (time_total_s), so settings compete at equal wall time; without it,
                                       # rungs count reports
    scales:                          # each overrides any of base/axes/variants/seeds/stop/optuna, and may
                                     # name a preset to start from (preset: fast; under its own base/stop)
      smoke: {...}                   # seconds: the test suite runs it
      laptop: {...}                  # the default: minutes on 2 CPU cores
      paper: {...}                   # the paper's values and budgets
    chosen: [{key: ..., value: ..., why: ...}]   # values the papers' text does not give

Every error names the file, the key path, the bad value and what is allowed. Nothing here starts Ray.
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from ablate.config import ConfigError, RunConfig, did_you_mean, quote, unknown_setting
from ablate.files import read_file_text
from ablate.service.specs.base import parse_spec, read_yaml
from ablate.service.specs.costs import costliest_first
from ablate.service.specs.grid import DEFAULT_SCALE, SCALES, STOP_KEYS, GridAbout, GridFile, GridSettings, StopSpec
from ablate.service.specs.params import JSON_CHOICES, PACK_KEY, config_from_params
from ablate.service.specs.presets import scale_presets
from ablate.shipped import SEARCH_SPACES, shipped_files

__all__ = [
    "Grid",
    "GridError",
    "axis_text",
    "Trial",
    "expand",
    "known_grids",
    "grid_from_text",
    "load_grid",
]


class GridError(ValueError):
    """A grid file is invalid; the message names the file, the key path and what is allowed."""


@dataclass(frozen=True)
class Trial:
    """One grid point: its axis values (by YAML name), the variant name, the seed and its RunConfig."""

    point: dict[str, Any]
    variant: str | None
    seed: int
    config: RunConfig

    @property
    def label(self) -> str:
        """Short human name, e.g. ``batch_size=512,latent_dim=10,seed=0``."""
        parts = [f"{k}={axis_text(v)}" for k, v in self.point.items()]
        if self.variant:
            parts.insert(0, self.variant)
        parts.append(f"seed={self.seed}")
        return ",".join(parts)


def natural_key(v: Any) -> tuple:
    """Sort key of an axis value in its natural order: numbers numerically (16 after 4), Λ patterns ('5/25',
    linspace) by their numbers, ``k=v, …`` labels by their values, other text last; missing values at the end."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return (4, ())
    if isinstance(v, bool):
        return (2, (str(v),))
    if isinstance(v, int | float):
        return (0, (float(v),))
    if isinstance(v, dict | list):
        v = axis_text(v)
    text = str(v)
    if "=" in text:  # a facet or legend label such as "latent_dim=16, seed=0"
        return (3, tuple(natural_key(part.split("=", 1)[1].strip()) for part in text.split(",") if "=" in part))
    try:
        return (0, (float(text),))
    except ValueError:
        pass
    numbers = text.removeprefix("linspace ").replace("..", "/").split("/")
    try:
        return (1, tuple(float(p) for p in numbers))
    except ValueError:
        return (2, (text,))


def axis_text(v: Any) -> str:
    """Short text of an axis value: a variant's name, a Λ pattern (``linspace 5..50``, ``5/25``), a list."""
    if isinstance(v, dict):
        if "name" in v:
            return str(v["name"])
        if set(v) == {"linspace"}:
            return "linspace " + "..".join(f"{x:g}" for x in v["linspace"])
        return "/".join(f"{x:g}" if isinstance(x, float) else str(x) for vals in v.values() for x in vals)
    if isinstance(v, list):
        return "[" + ",".join(axis_text(x) for x in v) + "]"
    return f"{v:g}" if isinstance(v, float) else str(v)


class Grid(GridSettings, GridAbout):
    """A validated grid at one scale: its settings (:class:`GridSettings`), what it is about (:class:`GridAbout`),
    where it came from and what a run changed. Code reads its typed parts: ``grid.stop.max_steps``,
    ``grid.optuna.space``, ``grid.variants[0].name``."""

    path: Path = Field(description="the grid file")
    scale: str = Field(description="the scale it was resolved at")
    preset: str | None = Field(default=None, description="the named preset applied on top (--preset)")
    scale_preset: str | None = Field(default=None, description="the preset the scale starts from, under its base")
    text: str = Field(default="", description="the YAML text the grid was read from (stored in the run marker)")
    overrides: dict[str, Any] = Field(default_factory=dict, description="the --set settings (in the run marker)")
    replaced: dict[str, list[Any]] = Field(default_factory=dict, description="axes a --set replaced: former values")

    def apply_settings(self, settings: dict[str, Any], source: str, *, axes_win: bool) -> list[str]:
        """Set RunConfig ``settings`` for every trial; return the keys left to the grid's axes.

        ``max_steps`` and ``target_r2`` go to ``stop``, the rest to ``base``. With ``axes_win`` (a preset) an
        axis, Optuna dimension or variant of the same name keeps its values; without it (``--set``) the
        setting replaces the axis (recorded in ``replaced``), while variants and Optuna dimensions that set it
        keep their values (returned). The trials are validated again, so a bad value fails here.
        """
        kept = []
        for key, value in settings.items():
            if key == "seeds":  # the grid's own list: every point runs with each (more seeds extend a run)
                self.seeds = _seed_list(value, source, self.seeds)
                self.overrides[key] = list(self.seeds)
                continue
            if key == "seed":
                raise GridError(
                    f"{source} seed: a grid runs every point with each of its seeds ({self.seeds}), so one seed "
                    "would be ignored; give the list: --set seeds=[0,1,2]"
                )
            if key not in RunConfig.model_fields:
                raise GridError(f"{source} {key}: {unknown_setting(key)}")
            space = self.optuna.space if self.optuna else {}
            varied = key in self.axes or key in space or any(key in v.settings for v in self.variants)
            if varied and axes_win:
                kept.append(key)
                continue
            if key in self.axes:
                self.replaced[key] = self.axes.pop(key)
            elif varied:
                kept.append(key)
            if not axes_win:
                self.overrides[key] = copy.deepcopy(value)
            if key in STOP_KEYS:  # checked as --set values are: what pydantic can convert
                stop = {**self.stop.settings(), key: copy.deepcopy(value)}
                self.stop = parse_spec(StopSpec, stop, f"{source} {key}", GridError, strict=False)
            else:
                self.base[key] = copy.deepcopy(value)
        self.trials  # noqa: B018 - re-validate every trial with the new settings
        return kept

    def select_variants(self, names: list[str], source: str) -> None:
        """Keep only the variants called ``names`` (in the grid's order): a subset of a grid, e.g. to re-run
        two of its losses for longer. An unknown name fails here, before any compute."""
        known = [v.name for v in self.variants]
        if not known:
            raise GridError(f"{source}: grid {self.name} has no variants to choose from")
        for name in names:
            if name not in known:
                raise GridError(
                    f"{source}: unknown variant {name!r} of grid {self.name}{did_you_mean(name, known)}; "
                    f"allowed: {', '.join(known)}"
                )
        self.variants = [v for v in self.variants if v.name in names]

    @property
    def trials(self) -> list[Trial]:
        """Every grid point × variant × seed, validated (for Optuna grids: the base point per seed)."""
        return expand(self)

    @property
    def n_trials(self) -> int:
        """Number of trials (Optuna: num_samples)."""
        if self.optuna is not None:
            return self.optuna.num_samples
        n = len(self.seeds) * max(len(self.variants), 1)
        for values in self.axes.values():
            n *= len(values)
        return n

    def cost_steps(self, trials: list[Trial] | None = None) -> int:
        """Upper bound on training steps × batch size summed over trials (trial-samples); ``trials``: the grid's
        trials when already expanded."""
        return (
            sum(t.config.max_steps * t.config.batch_size for t in (self.trials if trials is None else trials))
            if self.search == "grid"
            else (self.n_trials * self.stop.max_steps * int(self.base.get("batch_size", 1000)))
        )

    def param_space(self, pack: int = 1) -> dict[str, Any]:
        """The Ray Tune param_space: base settings plus grid_search axes (or Optuna distributions).

        With ``pack`` > 1 (grid search only) one grid_search value is a pack: up to ``pack`` grid points that share
        every shape and code path (:func:`ablate.core.pack_fields.pack_groups`), under :data:`PACK_KEY`.
        """
        from ray import tune

        space: dict[str, Any] = {"grid": self.name, "scale": self.scale}
        space.update(copy.deepcopy(self.base))
        space.update(self.stop.settings())
        if self.optuna is not None:
            space["seed"] = self.seeds[0]
            encoded = []
            for key, dist in self.optuna.space.items():
                space[key], as_json = dist.domain()
                if as_json:
                    encoded.append(key)
            if encoded:
                space[JSON_CHOICES] = encoded
            return space
        # One grid_search over whole grid points, costliest first: Ray keeps the order of a single axis, while
        # several axes are nested in the alphabetical order of their names (batch_size, the costliest, fastest)
        trials = self.trials
        points = [self.point_params(t) for t in trials]
        order = costliest_first([t.config for t in trials])
        if pack > 1:
            from ablate.core.pack_fields import pack_groups

            groups = pack_groups([trials[i].config for i in order], pack)
            space[PACK_KEY] = tune.grid_search([[copy.deepcopy(points[order[j]]) for j in g] for g in groups])
            return space
        space["point"] = tune.grid_search([copy.deepcopy(points[i]) for i in order])
        return space

    def point_params(self, trial: Trial) -> dict[str, Any]:
        """A trial's grid point as it travels in Ray's params: its axis values, seed and whole variant."""
        variant = next((v.param() for v in self.variants if v.name == trial.variant), None)
        return {**trial.point, "seed": trial.seed} | ({"variant": variant} if variant else {})

    def optuna_dict(self) -> dict[str, Any]:
        """The Optuna search as a plain mapping (empty for a grid search), as the run marker records it."""
        return self.optuna.as_dict() if self.optuna is not None else {}

    def axis_names(self) -> list[str]:
        """Names of what varies across trials (axes, then 'variant' and 'seed')."""
        names = list(self.optuna.space) if self.optuna is not None else list(self.axes)
        if self.variants:
            names.append("variant")
        return names + ["seed"]


def expand(grid: Grid) -> list[Trial]:
    """All trials of a grid (validated RunConfigs). Optuna grids expand to their base point per seed."""
    trials = []
    keys = list(grid.axes) if grid.search == "grid" else []
    combos = itertools.product(*(grid.axes[k] for k in keys)) if keys else [()]
    variants = [v.param() for v in grid.variants] or [None]
    for combo in combos:
        point = dict(zip(keys, combo))
        for variant in variants:
            for seed in grid.seeds:
                params = {**grid.base, **grid.stop.settings(), **point, "seed": seed}
                if variant is not None:
                    params["variant"] = variant
                where = f"{grid.path}: scale {grid.scale}, point {quote(point)}" + (
                    f", variant {variant['name']}" if variant else ""
                )
                trials.append(
                    Trial(point, variant["name"] if variant else None, seed, config_from_params(params, where))
                )
    return trials


def known_grids() -> dict[str, Path]:
    """Grid name → YAML path for every grid shipped in ablate/search_spaces/."""
    return shipped_files(SEARCH_SPACES)


def resolve_grid_path(name_or_path: str) -> Path:
    """A shipped grid's name, or a path to a YAML file; unknown names list the known ones."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.is_file():
            raise GridError(f"{p}: no such grid file")
        return p
    grids = known_grids()
    if name_or_path not in grids:
        raise GridError(
            f"unknown grid {name_or_path!r}{did_you_mean(name_or_path, grids)}; known grids: {', '.join(grids)} "
            "(or give a path to a .yaml file)"
        )
    return grids[name_or_path]


def _seed_list(value: Any, source: str, current: list[int]) -> list[int]:
    """``--set seeds=…``: a non-empty list of distinct whole numbers, else :class:`GridError`."""
    seeds = value if isinstance(value, list) else None
    if not seeds or any(isinstance(v, bool) or not isinstance(v, int) for v in seeds) or len(set(seeds)) < len(seeds):
        raise GridError(
            f"{source} seeds: expected a list of distinct whole numbers, e.g. [0, 1, 2], got {quote(value)} "
            f"(the grid's: {current})"
        )
    return list(seeds)


def load_grid(name_or_path: str, scale: str = DEFAULT_SCALE) -> Grid:
    """Load, validate and resolve one grid at ``scale``. Raises :class:`GridError` on any bad value."""
    path = resolve_grid_path(name_or_path)
    return grid_from_text(read_text(path), scale, path)


def read_text(path: Path) -> str:
    """A grid file's text; an unreadable or binary file is a :class:`GridError` naming it."""
    return read_file_text(path, GridError)


def grid_from_text(text: str, scale: str, path: str | Path) -> Grid:
    """Validate a grid's YAML ``text`` (named ``path`` in errors) and resolve it at ``scale``."""
    path = Path(path)
    data = read_yaml(path, GridError, text=text)
    if scale not in SCALES:
        raise GridError(f"{path}: scales: unknown scale {scale!r}; allowed: {', '.join(SCALES)}")
    spec = parse_spec(GridFile, data, path, GridError)
    preset = scale_presets(spec.scales, path, GridError).get(scale)
    at = parse_spec(GridSettings, spec.at_scale(scale, preset.settings if preset else None), path, GridError)
    about = {key: getattr(spec, key) for key in GridAbout.model_fields if key not in GridSettings.model_fields}
    scale_preset = preset.name if preset else None
    grid = Grid(**dict(at), **about, path=path, scale=scale, scale_preset=scale_preset, text=text)
    try:
        expand(grid)  # validates every trial's RunConfig
    except ConfigError as exc:
        raise GridError(str(exc)) from None
    return grid


def n_reports(config: RunConfig) -> int:
    """Reports (Ray iterations) a trial makes before hitting max_steps."""
    return math.ceil(config.max_steps / config.report_every)
