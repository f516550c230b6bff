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
        x: batch_size                  # the kind's own options (its spec model in ablate.reports.panels)
        y: latent_dim

A spec is validated like a grid: an unknown kind, key or axis is an error naming the file and the key.
("Dashboard" here is a report spec; Ray's web dashboard is ablate.service.execution.cluster.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Union

from pydantic import BeforeValidator, Discriminator, Field, ValidationInfo, field_validator

from ablate.config import did_you_mean
from ablate.reports.panels import PANELS, PanelSpec, panel_spec
from ablate.service.specs.base import Spec, parse_spec, read_yaml
from ablate.service.specs.grids import Grid, GridError
from ablate.shipped import DASHBOARDS, shipped_dir, shipped_files

__all__ = [
    "DASHBOARD_DIR",
    "Dashboard",
    "DashboardFile",
    "Panel",
    "SpecError",
    "dashboard_for",
    "default_dashboard",
    "known_dashboards",
    "load_dashboard",
    "parse_panel",
]

#: The dashboard specs shipped with ablate (package data), one per grid.
DASHBOARD_DIR = shipped_dir(DASHBOARDS)


class SpecError(GridError):
    """A dashboard spec is invalid; the message names the file, the key and what is allowed."""


def known_dashboards() -> dict[str, Path]:
    """Grid name → dashboard spec for every spec shipped in ablate/dashboards/."""
    return shipped_files(DASHBOARDS)


def _known_kind(raw: Any) -> Any:
    if isinstance(raw, PanelSpec):
        return raw
    if not isinstance(raw, dict):
        raise ValueError(f"expected a mapping with kind and figure, got {raw!r}")
    kind = raw.get("kind")
    if kind not in PANELS:
        raise ValueError(
            f".kind: unknown panel kind {kind!r}{did_you_mean(kind, PANELS)}; allowed: {', '.join(PANELS)}"
        )
    return raw


#: One panel of a dashboard: the spec model of its ``kind`` (:data:`ablate.reports.panels.PANELS`).
Panel = Annotated[
    Union[tuple(kind.spec for kind in PANELS.values())],  # noqa: UP007 - the registered kinds
    Discriminator("kind"),
    BeforeValidator(_known_kind),
]


class DashboardFile(Spec):
    """A dashboard spec file. Validate with ``context={"grid": grid, "axes": [...]}`` to check the grid's name and
    axes (:func:`load_dashboard` does)."""

    grid: str = Field(min_length=1, description="the name of the grid this dashboard belongs to")
    title: str = Field(default="", description="the report's heading")
    description: str = Field(default="", description="text shown under the title")
    panels: list[Panel] = Field(min_length=1, description=f"the panels, in order; kinds: {', '.join(PANELS)}")

    @field_validator("grid")
    @classmethod
    def _same_grid(cls, name: str, info: ValidationInfo) -> str:
        grid = (info.context or {}).get("grid")
        if grid is not None and name != grid.name:
            raise ValueError(f"the spec is for grid {name!r}, not {grid.name!r}")
        return name


class Dashboard(DashboardFile):
    """A validated dashboard spec: which panels a grid's report holds, and the file it came from."""

    path: Path | None = Field(default=None, description="the spec file (None: the default panels)")


def _context(grid: Grid | None) -> dict[str, Any]:
    axes = [a for a in grid.axis_names() if a != "seed"] if grid is not None else None
    return {"grid": grid, "axes": axes}


def parse_panel(raw: dict[str, Any], grid: Grid | None = None, source: str = "panel") -> PanelSpec:
    """One panel (a mapping with ``kind``, ``figure`` and the kind's options), validated by its kind's model and,
    given ``grid``, against the grid's axes; any problem raises :class:`SpecError` naming ``source``."""
    return parse_spec(DashboardFile, {"grid": "-", "panels": [raw]}, source, SpecError, _context(grid)).panels[0]


def load_dashboard(name_or_path: str | Path, grid: Grid | None = None) -> Dashboard:
    """Load and validate a dashboard spec (a grid name or a path); with ``grid``, check axis names too."""
    p = Path(name_or_path)
    if p.suffix not in (".yaml", ".yml"):
        specs = known_dashboards()
        if str(name_or_path) not in specs:
            raise SpecError(f"no dashboard spec for grid {name_or_path!r}; known: {', '.join(specs)}")
        p = specs[str(name_or_path)]
    spec = parse_spec(DashboardFile, read_yaml(p, SpecError), p, SpecError, _context(grid))
    return Dashboard(**dict(spec), path=p)


def default_dashboard(grid_name: str) -> Dashboard:
    """The panels every grid can show, for a grid without its own spec."""
    figure = "(no paper figure: generic view)"
    specs = [panel_spec(kind, figure) for kind in ("r2_curves", "loss_vs_floor", "similarity_histograms")]
    return Dashboard(grid=grid_name, title=f"{grid_name} (default panels)", panels=specs)


def dashboard_for(grid_name: str, grid: Grid | None, dashboard: str | Path | Dashboard | None = None) -> Dashboard:
    """A run's dashboard: the one given, else ablate/dashboards/<grid>.yaml, else the default panels."""
    if isinstance(dashboard, Dashboard):
        return dashboard
    if dashboard is not None:
        return load_dashboard(dashboard, grid)
    if grid_name in known_dashboards():
        return load_dashboard(grid_name, grid)
    return default_dashboard(grid_name)
