"""Panel kinds' shared parts: the spec of one panel, the registry of kinds, and helpers for data and figures.

A panel kind is a spec model and a pair of functions registered in :data:`PANELS` (by the modules of this package):

- ``spec``: a :class:`PanelSpec` subclass with ``kind: Literal[<name>]`` and the kind's own options as typed fields
  (a dashboard YAML is validated against it; the functions read ``spec.x``, ``spec.color`` ...).
- ``data(df, spec, ctx) -> DataFrame``: pure pandas on the table of :func:`ablate.analysis.results.load_results`
  (one row per trial per report) plus the trials' resolved configs in ``ctx``. Tests assert on this.
- ``draw(data, spec, ctx) -> go.Figure``: a Plotly figure of exactly that frame, nothing recomputed.
- ``finals``: whether the kind shows final values. Those read only the trials that finished
  (:func:`ablate.analysis.finished.final_values`) and the report says which trials were left out; a curve over
  steps draws every trial up to its last report and marks where one that stopped before its end (errored,
  interrupted, or stopped early by a search's scheduler) made it (:func:`ended_marks`, a column ``ended``).

Every panel always yields a figure: with no data yet (a run that just started, or a metric the grid
does not report) the figure says so instead of failing, so a report always holds one plot per panel.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import hex_to_rgb, qualitative, sample_colorscale, unlabel_rgb
from plotly.subplots import make_subplots
from pydantic import AfterValidator, BeforeValidator, Field, StringConstraints, ValidationInfo

from ablate.analysis.finished import unfinished_trials
from ablate.analysis.run import RunContext
from ablate.columns import r2_block_lambda, r2_dim_index
from ablate.service.specs.base import Spec
from ablate.service.specs.grids import natural_key

__all__ = [
    "PANELS",
    "X_COLUMNS",
    "AxisList",
    "AxisName",
    "Listed",
    "PanelKind",
    "PanelResult",
    "PanelSpec",
    "StrList",
    "XColumn",
    "apply_where",
    "add_ended_marks",
    "compute_panels",
    "empty_figure",
    "ended_marks",
    "grid_axes",
    "panel_data",
    "panel_figure",
    "panel_spec",
    "register",
]

#: A column a curve may use as its x axis.
XColumn = Literal["step", "samples_seen", "training_iteration", "time_total_s"]
#: Columns a curve may use as its x axis.
X_COLUMNS = get_args(XColumn)
#: Every registered panel kind, by name.
PANELS: dict[str, PanelKind] = {}


# --------------------------------------------------------------------------- specs and context
def grid_axes(info: ValidationInfo) -> list[str] | None:
    """The axes of the grid a dashboard is validated against (``context={"axes": [...]}``), or None: unchecked."""
    return (info.context or {}).get("axes")


def _axis(name: str, info: ValidationInfo) -> str:
    axes = grid_axes(info)
    if axes is not None and name not in axes:
        raise ValueError(f"{name!r} is not an axis of the grid; allowed: {', '.join(axes) or '(the grid has no axes)'}")
    return name


def _listed(value: Any) -> Any:
    return [] if value is None else value if isinstance(value, list) else [value]


#: A value or a list of them (null: none), as a list: ``Annotated[list[X], Listed]``.
Listed = BeforeValidator(_listed)
#: The name of one of the grid's axes (checked when the dashboard is validated against a grid).
AxisName = Annotated[str, AfterValidator(_axis)]
#: One axis name or a list of them (null: none), as a list.
AxisList = Annotated[list[AxisName], Listed]
#: One string or a list of them, as a list.
StrList = Annotated[list[str], Listed]


class PanelSpec(Spec):
    """One panel of a dashboard: its kind, the paper figure it corresponds to, a heading, a note and a filter.
    Each kind's subclass adds its own options."""

    kind: str = Field(description="the panel kind")
    figure: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)] = Field(
        description="the paper figure this panel corresponds to"
    )
    title: str = Field(default="", description="heading; default: the kind's title")
    note: str = Field(default="", description="text under the heading")
    where: dict[AxisName, Any] = Field(
        default_factory=dict, description="filter: axis → value, list of values, min or max"
    )


@dataclass(frozen=True)
class PanelKind:
    """A registered panel kind: its spec model (with its options), and how it computes and draws its data."""

    name: str
    title: str
    describe: str
    data: Callable[[pd.DataFrame, Any, RunContext], pd.DataFrame]
    draw: Callable[[pd.DataFrame, Any, RunContext], go.Figure]
    spec: type[PanelSpec]
    finals: bool = False  # shows final values: of finished trials only


def register(kind: PanelKind) -> PanelKind:
    """Add a panel kind to :data:`PANELS` (a dashboard YAML names it by ``kind.name``)."""
    PANELS[kind.name] = kind
    return kind


def panel_spec(kind: str, figure: str, **options: Any) -> PanelSpec:
    """A panel of ``kind`` with ``options``, validated by the kind's spec model (no grid: axes unchecked)."""
    return PANELS[kind].spec.model_validate({"kind": kind, "figure": figure, **options})


# --------------------------------------------------------------------------- small helpers
def as_list(v: Any) -> list[Any]:
    """A value as a list (None → [], a scalar → [it])."""
    if v is None:
        return []
    return list(v) if isinstance(v, list | tuple) else [v]


def as_number(v: Any) -> float | None:
    """A number as float, or None for booleans and what is not a number."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float | np.integer | np.floating):
        return float(v)
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def sort_key(v: Any) -> tuple:
    """Natural order of axis values and of ``k=v`` labels (:func:`ablate.service.specs.grids.natural_key`)."""
    return natural_key(v)


def sorted_unique(values: Iterable[Any]) -> list[Any]:
    """The distinct values (NaN left out) in natural order (:func:`sort_key`)."""
    seen: dict[Any, None] = {}
    for v in values:
        if not (isinstance(v, float) and math.isnan(v)):
            seen.setdefault(v, None)
    return sorted(seen, key=sort_key)


def fmt(v: Any) -> str:
    """Short text of a value for labels (a missing value, e.g. an axis value null, reads 'null')."""
    if v is None or (isinstance(v, float | np.floating) and math.isnan(v)):
        return "null"
    if isinstance(v, float | np.floating):
        return f"{v:.4g}"
    return str(v)


def metric_label(name: str) -> str:
    """Reader-facing name of a reported metric: r2_lambda_25 → 'R² (Λ = 25 block)'."""
    if (lam := r2_block_lambda(name)) is not None:
        return f"R² (Λ = {lam:g} block)"
    if (dim := r2_dim_index(name)) is not None:
        return f"R² (dim {dim})"
    return {"r2": "R²", "mcc": "MCC", "eval_loss": "loss (fresh batch)", "loss": "loss (training)"}.get(name, name)


def trace_mode(n_points: int) -> str:
    """Plotly's trace mode: markers on short curves, plain lines on long ones."""
    return "lines+markers" if n_points <= 30 else "lines"


def point_label(values: dict[str, Any]) -> str:
    """``batch_size=16, latent_dim=3`` (or 'all trials' for a grid with no axes)."""
    return ", ".join(f"{k}={fmt(v)}" for k, v in values.items()) or "all trials"


def axes_in(df: pd.DataFrame, ctx: RunContext) -> list[str]:
    """The run's axes that are columns of ``df``."""
    return [a for a in ctx.axes if a in df.columns]


def apply_where(df: pd.DataFrame, where: dict[str, Any]) -> pd.DataFrame:
    """Keep rows whose axis values match ``where`` (a value, a list of values, or 'min' / 'max')."""
    for axis, want in where.items():
        if axis not in df.columns or df.empty:
            continue
        values = sorted_unique(df[axis])
        if want in ("min", "max"):
            keep = [values[0] if want == "min" else values[-1]] if values else []
        else:
            keep = [None] if want is None else as_list(want)  # null selects trials whose axis value is null
        keep_keys = {sort_key(v) for v in keep}
        df = df[df[axis].map(lambda v, kk=keep_keys: sort_key(v) in kk)]
    return df


def metric_columns(df: pd.DataFrame, patterns: list[str]) -> list[str]:
    """Columns matching the names or glob patterns (e.g. ``r2_lambda_*``), in natural order."""
    out: list[str] = []
    for pat in patterns:
        hits = [c for c in df.columns if fnmatch.fnmatchcase(c, pat)]
        hits.sort(key=lambda c: sort_key(c.rsplit("_", 1)[-1]))
        out += [h for h in hits if h not in out and pd.api.types.is_numeric_dtype(df[h])]
    return out


def group_key(row: pd.Series | dict, cols: list[str]) -> str:
    """The ``k=v, …`` label of a row's values in ``cols`` (empty without columns)."""
    if not cols:
        return ""
    return point_label({c: row[c] for c in cols})


# --------------------------------------------------------------------------- trials that stopped before their end
#: Colour and legend entry of the mark at a stopped trial's last report.
ENDED_COLOR = "#b00"
ENDED_NAME = "✕ did not finish: its last report"


def ended_marks(df: pd.DataFrame, metric: str, x: str) -> pd.DataFrame:
    """Where each trial that stopped before its end (errored, interrupted or stopped early by its scheduler:
    :func:`unfinished_trials`; a trial still running is left to draw on) made its last report with a finite
    ``metric``: that row of the table, with ``ended`` (``trial_id: errored at step 20``). Empty when every trial
    finished."""
    if df.empty or metric not in df.columns or x not in df.columns:
        return df.iloc[0:0].assign(ended=pd.Series(dtype=object))
    stopped = unfinished_trials(df[df["status"].astype(str) != "RUNNING"] if "status" in df.columns else df)
    rows = df[df["trial_id"].astype(str).isin(list(stopped)) & df[metric].notna()]
    rows = rows.sort_values("training_iteration").drop_duplicates("trial_id", keep="last")
    return rows.assign(ended=rows["trial_id"].astype(str).map(lambda t: f"{t}: {stopped[t]}"))


def add_ended_marks(fig: go.Figure, marks: pd.DataFrame, where: dict[Any, tuple[int, int]]) -> None:
    """Draw the rows of a curve panel's data whose ``ended`` is set as a red ✕ at the trial's last report (one
    legend entry, :data:`ENDED_NAME`); hovering names the trial and why it did not finish."""
    shown = False
    for facet, g in marks.groupby("facet", sort=False):
        row, col = where[facet]
        fig.add_trace(
            go.Scatter(
                x=g["x"],
                y=g["mean"],
                mode="markers",
                name=ENDED_NAME,
                legendgroup="ended",
                showlegend=not shown,
                marker={"symbol": "x", "size": 11, "color": ENDED_COLOR, "line": {"width": 1, "color": "white"}},
                hovertext=g["ended"],
                hovertemplate="%{hovertext}<br>x=%{x}<br>y=%{y:.4f}<extra></extra>",
            ),
            row=row,
            col=col,
        )
        shown = True


# --------------------------------------------------------------------------- colours and layout
def palette(values: list[Any]) -> dict[Any, str]:
    """A colour per value: Viridis by rank for numbers, Plotly's qualitative colours otherwise."""
    if not values:
        return {}
    if len(values) > 2 and all(as_number(v) is not None for v in values):
        cols = sample_colorscale("Viridis", [i / (len(values) - 1) * 0.9 for i in range(len(values))])
        return dict(zip(values, cols))
    base = qualitative.Plotly + qualitative.D3
    return {v: base[i % len(base)] for i, v in enumerate(values)}


def rgba(color: str, alpha: float) -> str:
    """A hex or ``rgb(...)`` colour with opacity ``alpha``."""
    rgb = hex_to_rgb(color) if color.startswith("#") else unlabel_rgb(color)
    return f"rgba({int(rgb[0])}, {int(rgb[1])}, {int(rgb[2])}, {alpha})"


def make_facets(names: list[str], cols: int = 3, **kwargs) -> tuple[go.Figure, dict[str, tuple[int, int]]]:
    """A grid of subplots, one per name (at most ``cols`` per row), and where each name sits."""
    names = names or [""]
    ncols = min(cols, len(names))
    nrows = math.ceil(len(names) / ncols)
    fig = make_subplots(
        rows=nrows,
        cols=ncols,
        subplot_titles=[str(n) for n in names] if names != [""] else None,
        horizontal_spacing=0.08,
        vertical_spacing=min(0.12, 0.35 / max(nrows - 1, 1)),
        **kwargs,
    )
    where = {n: (i // ncols + 1, i % ncols + 1) for i, n in enumerate(names)}
    fig.update_layout(height=140 + 300 * nrows)
    return fig, where


def finish(
    fig: go.Figure, spec: PanelSpec, *, x: str = "", y: str = "", log_x: bool = False, log_y: bool = False
) -> go.Figure:
    """The common layout of a panel's figure: title, margins, axis titles and log scales."""
    fig.update_layout(
        template="plotly_white",
        title=spec.title or PANELS[spec.kind].title,
        margin={"l": 60, "r": 30, "t": 80, "b": 50},
        legend={"font": {"size": 11}},
    )
    if x:
        fig.update_xaxes(title_text=x)
    if y:
        fig.update_yaxes(title_text=y)
    if log_x:
        fig.update_xaxes(type="log")
    if log_y:
        fig.update_yaxes(type="log")
    return fig


def empty_figure(spec: PanelSpec, message: str) -> go.Figure:
    """A figure that says why there is nothing to show yet."""
    fig = go.Figure()
    fig.add_annotation(
        text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font={"size": 14, "color": "#666"}
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(height=260)
    return finish(fig, spec)


def natural_col(s: pd.Series) -> pd.Series:
    """Sort key of a column: numbers as they are, labels by the natural order of their first value."""
    if pd.api.types.is_numeric_dtype(s):
        return s
    return s.map(sort_key)


def label_value(label: Any) -> Any:
    """The first value in a ``k=v, ...`` label (for natural ordering of facets and legends)."""
    if isinstance(label, str) and "=" in label:
        return label.split("=", 1)[1].split(",", 1)[0]
    return label


@dataclass
class PanelResult:
    """One panel: its spec, its data and its figure."""

    spec: PanelSpec
    data: pd.DataFrame
    figure: go.Figure


def compute_panels(df: pd.DataFrame, specs: list[PanelSpec], ctx: RunContext) -> list[PanelResult]:
    """Every panel's DataFrame, then its figure."""
    out = []
    for spec in specs:
        data = panel_data(df, spec, ctx)
        out.append(PanelResult(spec, data, panel_figure(data, spec, ctx)))
    return out


def panel_data(df: pd.DataFrame, spec: PanelSpec, ctx: RunContext) -> pd.DataFrame:
    """The tidy DataFrame a panel draws (after its ``where`` filter)."""
    return PANELS[spec.kind].data(apply_where(df, spec.where), spec, ctx)


def panel_figure(data: pd.DataFrame, spec: PanelSpec, ctx: RunContext) -> go.Figure:
    """Draw a panel's data."""
    return PANELS[spec.kind].draw(data, spec, ctx)
