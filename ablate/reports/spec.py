"""Dashboard specs: which panels a grid's report holds (``ablate/dashboards/<grid>.yaml``), a pydantic model.

A spec holds::

    grid: batch_vs_dim                 # the grid this dashboard belongs to (= the file name)
    title: Batch size × latent dimension
    description: optional text shown under the title
    panels:
      - kind: final_heatmap            # one of ablate.reports.panels.PANELS
        figure: Rusak et al. 2024, Fig. 4A   # the paper figure the panel corresponds to (required)
        title: optional heading
        note: optional text under the heading
        where: {batch_size: max}       # optional filter: axis → value, list of values, min or max
        x: batch_size                  # the kind's own options (see ablate.reports.panels)
        y: latent_dim

A spec is validated like a grid: an unknown kind, key or axis is an error naming the file and the key.
("Dashboard" here is a report spec; Ray's web dashboard is ablate.service.cluster.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from ablate.config import did_you_mean
from ablate.reports.panels import PANELS, PanelSpec
from ablate.service.grids import Grid, GridError
from ablate.service.spec_base import Spec, parse_spec, read_yaml
from ablate.shipped import DASHBOARDS, shipped_dir, shipped_files

__all__ = [
    "DASHBOARD_DIR",
    "Dashboard",
    "DashboardFile",
    "SpecError",
    "check_panel",
    "dashboard_for",
    "default_dashboard",
    "known_dashboards",
    "load_dashboard",
]

#: The dashboard specs shipped with ablate (package data), one per grid.
DASHBOARD_DIR = shipped_dir(DASHBOARDS)
_PANEL_KEYS = {"kind", "figure", "title", "note", "where"}


class SpecError(GridError):
    """A dashboard spec is invalid; the message names the file, the key and what is allowed."""


@dataclass
class Dashboard:
    """A validated dashboard spec: which panels a grid's report holds."""

    grid: str
    path: Path | None
    title: str = ""
    description: str = ""
    panels: list[PanelSpec] = field(default_factory=list)


def known_dashboards() -> dict[str, Path]:
    """Grid name → dashboard spec for every spec shipped in ablate/dashboards/."""
    return shipped_files(DASHBOARDS)


def _type_ok(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in types
    if isinstance(value, int) and float in types:
        return True
    return isinstance(value, types)


def _type_names(types: tuple[type, ...]) -> str:
    names = {str: "a string", list: "a list", int: "an integer", float: "a number", bool: "true/false"}
    return " or ".join(names.get(t, t.__name__) for t in types)


def check_panel(i: int, raw: Any, axes: list[str] | None) -> PanelSpec:
    """Validate the ``i``-th panel of a spec against its kind's options (and, given ``axes``, the grid's axes)."""
    where = f"[{i}]"
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping with kind and figure, got {raw!r}")
    kind = raw.get("kind")
    if kind not in PANELS:
        raise ValueError(
            f"{where}.kind: unknown panel kind {kind!r}{did_you_mean(kind, PANELS)}; allowed: {', '.join(PANELS)}"
        )
    where = f"{where} ({kind})"
    options = PANELS[kind].options
    for key in raw:
        if key not in _PANEL_KEYS and key not in options:
            allowed = sorted(_PANEL_KEYS | set(options))
            raise ValueError(f"{where}.{key}: unknown key for {kind}; allowed: {', '.join(allowed)}")
    figure = raw.get("figure")
    if not isinstance(figure, str) or not figure.strip():
        raise ValueError(f"{where}.figure: required: the paper figure this panel corresponds to")
    for key in ("title", "note"):
        if key in raw and not isinstance(raw[key], str):
            raise ValueError(f"{where}.{key}: expected a string, got {raw[key]!r}")
    filt = raw.get("where") or {}
    if not isinstance(filt, dict):
        raise ValueError(f"{where}.where: expected a mapping axis → value, list of values, min or max")
    if axes is not None:
        for axis in filt:
            if axis not in axes:
                raise ValueError(f"{where}.where.{axis}: not an axis of the grid; axes: {', '.join(axes)}")
    values: dict[str, Any] = {}
    for key, opt in options.items():
        if key not in raw:
            if opt.required:
                raise ValueError(f"{where}.{key}: required ({opt.help})")
            continue
        value = raw[key]
        if value is None:
            values[key] = None
            continue
        if not _type_ok(value, opt.types):
            raise ValueError(f"{where}.{key}: expected {_type_names(opt.types)} ({opt.help}), got {value!r}")
        if opt.choices is not None and value not in opt.choices:
            raise ValueError(f"{where}.{key}: {value!r} is not allowed; allowed: {', '.join(map(str, opt.choices))}")
        if key == "targets":
            items = value if isinstance(value, list) else [value]
            if not items or not all(_type_ok(t, (float,)) and 0 < t <= 1 for t in items):
                raise ValueError(f"{where}.targets: expected numbers in (0, 1], got {value!r}")
        if opt.axis or (key == "x" and kind == "iterations_to_target"):
            names = value if isinstance(value, list) else [value]
            allowed = list(axes or []) + (["target"] if kind == "iterations_to_target" and key == "x" else [])
            for name in names:
                if not isinstance(name, str):
                    raise ValueError(f"{where}.{key}: expected axis names, got {value!r}")
                if axes is not None and name not in allowed:
                    raise ValueError(
                        f"{where}.{key}: {name!r} is not an axis of the grid; "
                        f"allowed: {', '.join(allowed) or '(the grid has no axes)'}"
                    )
        values[key] = value
    if kind == "final_heatmap" and values.get("x") == values.get("y"):
        raise ValueError(f"{where}.y: must differ from x ({values.get('x')!r})")
    return PanelSpec(
        kind=kind,
        figure=figure.strip(),
        title=str(raw.get("title", "")),
        note=str(raw.get("note", "")),
        where=dict(filt),
        options=values,
    )


class DashboardFile(Spec):
    """A dashboard spec file. Validate with ``context={"grid": Grid | None}`` to check the grid's name and axes."""

    grid: str = Field(description="the name of the grid this dashboard belongs to")
    title: str = Field(default="", description="the report's heading")
    description: str = Field(default="", description="text shown under the title")
    panels: list[Any] = Field(description="the panels, in order (each a mapping with kind and figure)")

    @field_validator("grid", mode="before")
    @classmethod
    def _grid(cls, name: Any, info: ValidationInfo) -> Any:
        if not isinstance(name, str) or not name:
            raise ValueError("required: the name of the grid this dashboard belongs to")
        grid = (info.context or {}).get("grid")
        if grid is not None and name != grid.name:
            raise ValueError(f"the spec is for grid {name!r}, not {grid.name!r}")
        return name

    @field_validator("panels", mode="before")
    @classmethod
    def _panels(cls, panels: Any, info: ValidationInfo) -> Any:
        if not isinstance(panels, list) or not panels:
            raise ValueError(f"required: a non-empty list of panels (kinds: {', '.join(PANELS)})")
        grid = (info.context or {}).get("grid")
        axes = [a for a in grid.axis_names() if a != "seed"] if grid is not None else None
        return [check_panel(i, raw, axes) for i, raw in enumerate(panels)]


def load_dashboard(name_or_path: str | Path, grid: Grid | None = None) -> Dashboard:
    """Load and validate a dashboard spec (a grid name or a path); with ``grid``, check axis names too."""
    p = Path(name_or_path)
    if p.suffix not in (".yaml", ".yml"):
        specs = known_dashboards()
        if str(name_or_path) not in specs:
            raise SpecError(f"no dashboard spec for grid {name_or_path!r}; known: {', '.join(specs)}")
        p = specs[str(name_or_path)]
    data = read_yaml(p, SpecError)
    if "grid" not in data:
        raise SpecError(f"{p}: grid: required: the name of the grid this dashboard belongs to")
    spec = parse_spec(DashboardFile, data, p, SpecError, context={"grid": grid})
    return Dashboard(grid=spec.grid, path=p, title=spec.title, description=spec.description, panels=spec.panels)


def default_dashboard(grid_name: str) -> Dashboard:
    """The panels every grid can show, for a grid without its own spec."""
    specs = [
        PanelSpec("r2_curves", "(no paper figure: generic view)"),
        PanelSpec("loss_vs_floor", "(no paper figure: generic view)"),
        PanelSpec("similarity_histograms", "(no paper figure: generic view)"),
    ]
    return Dashboard(grid=grid_name, path=None, title=f"{grid_name} (default panels)", panels=specs)


def dashboard_for(grid_name: str, grid: Grid | None, dashboard: str | Path | Dashboard | None = None) -> Dashboard:
    """A run's dashboard: the one given, else ablate/dashboards/<grid>.yaml, else the default panels."""
    if isinstance(dashboard, Dashboard):
        return dashboard
    if dashboard is not None:
        return load_dashboard(dashboard, grid)
    if grid_name in known_dashboards():
        return load_dashboard(grid_name, grid)
    return default_dashboard(grid_name)
