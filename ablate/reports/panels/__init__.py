"""Report panels: each kind computes a tidy DataFrame from the results table first, then draws it.

A panel kind is a pair of functions registered in :data:`PANELS`:

- ``data(df, spec, ctx) -> DataFrame``: pure pandas on the table of :func:`ablate.analysis.results.load_results`
  (one row per trial per report) plus the trials' resolved configs in ``ctx``. Tests assert on this.
- ``draw(data, spec, ctx) -> go.Figure``: a Plotly figure of exactly that frame, nothing recomputed.

Every panel always yields a figure: with no data yet (a run that just started, or a metric the grid
does not report) the figure says so instead of failing, so a report always holds one plot per panel.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import hex_to_rgb, qualitative, sample_colorscale, unlabel_rgb
from plotly.subplots import make_subplots

from ablate.config import RunConfig
from ablate.core.metrics import iterations_to_target

__all__ = [
    "PANELS",
    "Option",
    "PanelKind",
    "PanelSpec",
    "RunContext",
    "final_rows",
    "panel_data",
    "panel_figure",
]

#: Columns a curve may use as its x axis.
X_COLUMNS = ("step", "samples_seen", "training_iteration", "time_total_s")
_LAMBDA_HAT = re.compile(r"^lambda_hat_(?:(\d+)_)?(\d+)$")


# --------------------------------------------------------------------------- specs and context
@dataclass(frozen=True)
class Option:
    """One setting a panel kind accepts in a dashboard YAML."""

    types: tuple[type, ...]
    default: Any = None
    help: str = ""
    axis: bool = False  # the value (or each value of a list) names a grid axis
    required: bool = False
    choices: tuple[Any, ...] | None = None


@dataclass
class PanelSpec:
    """One panel of a dashboard: its kind, the paper figure it corresponds to and its options."""

    kind: str
    figure: str
    title: str = ""
    note: str = ""
    where: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str) -> Any:
        """An option's value, or the kind's default."""
        if key in self.options:
            return self.options[key]
        return PANELS[self.kind].options[key].default


@dataclass
class RunContext:
    """What panels need beyond the table: the grid's axes, each trial's config and the paper's values."""

    grid: str = ""
    axes: list[str] = field(default_factory=list)
    configs: dict[str, RunConfig] = field(default_factory=dict)
    paper_values: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PanelKind:
    """A registered panel kind."""

    name: str
    title: str
    describe: str
    data: Callable[[pd.DataFrame, PanelSpec, RunContext], pd.DataFrame]
    draw: Callable[[pd.DataFrame, PanelSpec, RunContext], go.Figure]
    options: dict[str, Option]


# --------------------------------------------------------------------------- small helpers
def _as_list(v: Any) -> list[Any]:
    if v is None:
        return []
    return list(v) if isinstance(v, list | tuple) else [v]


def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float | np.integer | np.floating):
        return float(v)
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def sort_key(v: Any) -> tuple:
    """Natural order of axis values: numbers numerically, 'a/b' patterns by their numbers, then text."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return (3, ())
    x = _num(v)
    if x is not None:
        return (0, (x,))
    if isinstance(v, str):
        try:
            return (1, tuple(float(p) for p in v.split("/")))
        except ValueError:
            pass
    return (2, (str(v),))


def _sorted_unique(values: Iterable[Any]) -> list[Any]:
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
    if name.startswith("r2_lambda_"):
        return f"R² (Λ = {name.removeprefix('r2_lambda_')} block)"
    if name.startswith("r2_dim_"):
        return f"R² (dim {name.removeprefix('r2_dim_')})"
    return {"r2": "R²", "mcc": "MCC", "eval_loss": "loss (fresh batch)", "loss": "loss (training)"}.get(name, name)


def _mode(n_points: int) -> str:
    return "lines+markers" if n_points <= 30 else "lines"


def point_label(values: dict[str, Any]) -> str:
    """``batch_size=16, latent_dim=3`` (or 'all trials' for a grid with no axes)."""
    return ", ".join(f"{k}={fmt(v)}" for k, v in values.items()) or "all trials"


def final_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The last report of each trial."""
    if df.empty:
        return df
    idx = df.groupby("trial_id", sort=False)["training_iteration"].idxmax()
    return df.loc[idx.values].reset_index(drop=True)


def _axes_in(df: pd.DataFrame, ctx: RunContext) -> list[str]:
    return [a for a in ctx.axes if a in df.columns]


def apply_where(df: pd.DataFrame, where: dict[str, Any]) -> pd.DataFrame:
    """Keep rows whose axis values match ``where`` (a value, a list of values, or 'min' / 'max')."""
    for axis, want in where.items():
        if axis not in df.columns or df.empty:
            continue
        values = _sorted_unique(df[axis])
        if want in ("min", "max"):
            keep = [values[0] if want == "min" else values[-1]] if values else []
        else:
            keep = [None] if want is None else _as_list(want)  # null selects trials whose axis value is null
        keep_keys = {sort_key(v) for v in keep}
        df = df[df[axis].map(lambda v, kk=keep_keys: sort_key(v) in kk)]
    return df


def _metrics(df: pd.DataFrame, patterns: list[str]) -> list[str]:
    """Columns matching the names or glob patterns (e.g. ``r2_lambda_*``), in natural order."""
    out: list[str] = []
    for pat in patterns:
        hits = [c for c in df.columns if fnmatch.fnmatchcase(c, pat)]
        hits.sort(key=lambda c: sort_key(c.rsplit("_", 1)[-1]))
        out += [h for h in hits if h not in out and pd.api.types.is_numeric_dtype(df[h])]
    return out


def _group_key(row: pd.Series | dict, cols: list[str]) -> str:
    if not cols:
        return ""
    return point_label({c: row[c] for c in cols})


def _seed_stats(df: pd.DataFrame, keys: list[str], value: str) -> pd.DataFrame:
    """Mean, min, max and count of ``value`` over seeds (rows sharing ``keys``)."""
    g = df.groupby(keys, dropna=False, sort=False)[value]
    out = g.agg(mean="mean", lo="min", hi="max", n_seeds="count").reset_index()
    return out


# --------------------------------------------------------------------------- colours and layout
def _palette(values: list[Any]) -> dict[Any, str]:
    """A colour per value: Viridis by rank for numbers, Plotly's qualitative colours otherwise."""
    if not values:
        return {}
    if len(values) > 2 and all(_num(v) is not None for v in values):
        cols = sample_colorscale("Viridis", [i / (len(values) - 1) * 0.9 for i in range(len(values))])
        return dict(zip(values, cols))
    base = qualitative.Plotly + qualitative.D3
    return {v: base[i % len(base)] for i, v in enumerate(values)}


def _rgba(color: str, alpha: float) -> str:
    rgb = hex_to_rgb(color) if color.startswith("#") else unlabel_rgb(color)
    return f"rgba({int(rgb[0])}, {int(rgb[1])}, {int(rgb[2])}, {alpha})"


def _facets(names: list[str], cols: int = 3, **kwargs) -> tuple[go.Figure, dict[str, tuple[int, int]]]:
    names = names or [""]
    ncols = min(cols, len(names))
    nrows = math.ceil(len(names) / ncols)
    fig = make_subplots(rows=nrows, cols=ncols, subplot_titles=[str(n) for n in names] if names != [""] else None,
                        horizontal_spacing=0.08, vertical_spacing=min(0.12, 0.35 / max(nrows - 1, 1)), **kwargs)
    where = {n: (i // ncols + 1, i % ncols + 1) for i, n in enumerate(names)}
    fig.update_layout(height=140 + 300 * nrows)
    return fig, where


def _finish(fig: go.Figure, spec: PanelSpec, *, x: str = "", y: str = "", log_x: bool = False,
            log_y: bool = False) -> go.Figure:
    fig.update_layout(template="plotly_white", title=spec.title or PANELS[spec.kind].title,
                      margin={"l": 60, "r": 30, "t": 80, "b": 50}, legend={"font": {"size": 11}})
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
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font={"size": 14, "color": "#666"})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(height=260)
    return _finish(fig, spec)


# --------------------------------------------------------------------------- r2_curves
def _r2_curves_data(df: pd.DataFrame, spec: PanelSpec, ctx: RunContext) -> pd.DataFrame:
    cols = ["facet", "color", "series", "metric", "x", "mean", "lo", "hi", "n_seeds"]
    x = spec.get("x")
    metrics = _metrics(df, _as_list(spec.get("y")))
    if df.empty or not metrics or x not in df.columns:
        return pd.DataFrame(columns=cols)
    axes = _axes_in(df, ctx)
    color_axes = [a for a in _as_list(spec.get("color")) if a in axes]
    facet_axes = [a for a in _as_list(spec.get("facet")) if a in axes]
    frames = []
    for metric in metrics:
        sub = df[df[metric].notna()]
        if sub.empty:
            continue
        stats = _seed_stats(sub, [*axes, x], metric).rename(columns={x: "x"})
        stats["metric"] = metric
        stats["series"] = stats.apply(lambda r: point_label({a: r[a] for a in axes}), axis=1)
        if len(metrics) > 1:
            label = metric_label(metric)
            stats["series"] = stats["series"].map(lambda s, m=label: f"{s} · {m}" if s != "all trials" else m)
        stats["color"] = stats.apply(lambda r: _group_key(r, color_axes), axis=1) if color_axes else (
            metric_label(metric) if len(metrics) > 1 else stats["series"])
        stats["facet"] = stats.apply(lambda r: _group_key(r, facet_axes), axis=1) if facet_axes else ""
        frames.append(stats[cols])
    if not frames:
        return pd.DataFrame(columns=cols)
    out = pd.concat(frames, ignore_index=True)
    return out.sort_values(["facet", "series", "x"], key=_natural_col, kind="stable").reset_index(drop=True)


def _natural_col(s: pd.Series) -> pd.Series:
    if pd.api.types.is_numeric_dtype(s):
        return s
    return s.map(lambda v: sort_key(_label_value(v)))


def _label_value(label: Any) -> Any:
    """The first value in a ``k=v, ...`` label (for natural ordering of facets and legends)."""
    if isinstance(label, str) and "=" in label:
        return label.split("=", 1)[1].split(",", 1)[0]
    return label


def _draw_curves(data: pd.DataFrame, spec: PanelSpec, *, x_title: str, y_title: str, log_x=False, log_y=False,
                 y_range: list[float] | None = None) -> go.Figure:
    facets = _sorted_unique(data["facet"]) if not data.empty else [""]
    fig, where = _facets([f for f in facets], shared_yaxes=True)
    colors = _palette(sorted(_sorted_unique(data["color"]), key=lambda v: sort_key(_label_value(v))))
    shown: set[str] = set()
    for (facet, series), g in data.groupby(["facet", "series"], sort=False):
        row, col = where[facet]
        c = colors.get(g["color"].iloc[0], "#444")
        legend = str(g["color"].iloc[0])
        if int(g["n_seeds"].max()) > 1:
            xs = list(g["x"])
            fig.add_trace(go.Scatter(x=xs + xs[::-1], y=list(g["hi"]) + list(g["lo"])[::-1], fill="toself",
                                     fillcolor=_rgba(c, 0.18), line={"width": 0}, hoverinfo="skip",
                                     showlegend=False, legendgroup=legend), row=row, col=col)
        fig.add_trace(go.Scatter(x=g["x"], y=g["mean"], mode=_mode(len(g)), marker={"size": 5},
                                 line={"color": c, "width": 2}, name=legend, legendgroup=legend,
                                 showlegend=legend not in shown, hovertext=series,
                                 hovertemplate="%{hovertext}<br>x=%{x}<br>y=%{y:.4f}<extra></extra>"),
                      row=row, col=col)
        shown.add(legend)
    fig = _finish(fig, spec, x=x_title, y=y_title, log_x=log_x, log_y=log_y)
    if y_range:
        fig.update_yaxes(range=y_range)
    return fig


def _r2_curves_draw(data: pd.DataFrame, spec: PanelSpec, ctx: RunContext) -> go.Figure:
    if data.empty:
        return empty_figure(spec, f"no {', '.join(_as_list(spec.get('y')))} reported yet")
    metrics = _sorted_unique(data["metric"])
    metric_names = metric_label(metrics[0]) if len(metrics) == 1 else "value (legend: metric)"
    y_range = [-0.05, 1.05] if all(str(m).startswith(("r2", "mcc")) for m in data["metric"].unique()) else None
    return _draw_curves(data, spec, x_title=spec.get("x"), y_title=metric_names + " (mean over seeds; band: min–max)",
                        log_x=bool(spec.get("log_x")), y_range=y_range)


# --------------------------------------------------------------------------- final_heatmap
def _final_heatmap_data(df: pd.DataFrame, spec: PanelSpec, ctx: RunContext) -> pd.DataFrame:
    cols = ["facet", "x", "y", "value", "std", "n_seeds"]
    x, y, metric = spec.get("x"), spec.get("y"), spec.get("metric")
    if df.empty or x not in df.columns or y not in df.columns or metric not in df.columns:
        return pd.DataFrame(columns=cols)
    fin = final_rows(df)
    facet_axes = [a for a in _as_list(spec.get("facet")) if a in fin.columns]
    fin = fin.assign(facet=fin.apply(lambda r: _group_key(r, facet_axes), axis=1) if facet_axes else "")
    g = fin.groupby(["facet", x, y], dropna=False, sort=False)[metric]
    out = g.agg(value="mean", std="std", n_seeds="count").reset_index().rename(columns={x: "x", y: "y"})
    return out[cols].sort_values(["facet", "y", "x"], key=_natural_col, kind="stable").reset_index(drop=True)


def _final_heatmap_draw(data: pd.DataFrame, spec: PanelSpec, ctx: RunContext) -> go.Figure:
    metric = spec.get("metric")
    if data.empty:
        return empty_figure(spec, f"no final {metric} yet")
    facets = _sorted_unique(data["facet"])
    fig, where = _facets(facets, cols=2)
    r2_like = str(metric).startswith(("r2", "mcc"))
    for facet in facets:
        sub = data[data["facet"] == facet]
        xs, ys = _sorted_unique(sub["x"]), _sorted_unique(sub["y"])
        z = [[None] * len(xs) for _ in ys]
        text = [[""] * len(xs) for _ in ys]
        for _, r in sub.iterrows():
            i, j = ys.index(r["y"]), xs.index(r["x"])
            z[i][j] = r["value"]
            text[i][j] = f"{r['value']:.3f}" + (f"<br>n={int(r['n_seeds'])}" if r["n_seeds"] > 1 else "")
        row, col = where[facet]
        fig.add_trace(go.Heatmap(x=[fmt(v) for v in xs], y=[fmt(v) for v in ys], z=z, text=text,
                                 texttemplate="%{text}", colorscale="Viridis", zmin=0 if r2_like else None,
                                 zmax=1 if r2_like else None, colorbar={"title": {"text": metric}},
                                 hovertemplate=f"{spec.get('x')}=%{{x}}<br>{spec.get('y')}=%{{y}}<br>"
                                               f"{metric}=%{{z:.4f}}<extra></extra>"),
                      row=row, col=col)
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category")
    return _finish(fig, spec, x=spec.get("x"), y=spec.get("y"))


# --------------------------------------------------------------------------- r2_blocks_vs_lambda (Fig. 2A)
def _blocks_data(df: pd.DataFrame, spec: PanelSpec, ctx: RunContext) -> pd.DataFrame:
    cols = ["color", "x", "block", "block_lambda", "mean", "lo", "hi", "n_seeds"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    fin = final_rows(df)
    color_axes = [a for a in _as_list(spec.get("color")) if a in fin.columns]
    rows = []
    for _, r in fin.iterrows():
        cfg = ctx.configs.get(r["trial_id"])
        if cfg is None:
            continue
        lam = cfg.lambda_true
        first, last = lam[0], lam[-1]
        for block, value in (("Λ₁ block", first), ("Λ₂ block", last)):
            col = f"r2_lambda_{value:g}"
            if col not in fin.columns or pd.isna(r[col]):
                continue
            rows.append({"color": _group_key(r, color_axes) if color_axes else "", "x": last, "block": block,
                         "block_lambda": value, "r2": float(r[col])})
    if not rows:
        return pd.DataFrame(columns=cols)
    raw = pd.DataFrame(rows)
    out = _seed_stats(raw, ["color", "x", "block", "block_lambda"], "r2")
    return out[cols].sort_values(["color", "block", "x"], key=_natural_col, kind="stable").reset_index(drop=True)


def _blocks_draw(data: pd.DataFrame, spec: PanelSpec, ctx: RunContext) -> go.Figure:
    if data.empty:
        return empty_figure(spec, "no per-block R² yet (needs r2_lambda_<Λ> columns)")
    fig = go.Figure()
    colors = _palette(_sorted_unique(data["color"]))
    for (color, block), g in data.groupby(["color", "block"], sort=False):
        name = f"{color} · {block}" if color else block
        c = colors.get(color, "#444")
        err = {"type": "data", "symmetric": False, "array": g["hi"] - g["mean"], "arrayminus": g["mean"] - g["lo"],
               "visible": bool((g["n_seeds"] > 1).any())}
        fig.add_trace(go.Scatter(x=g["x"], y=g["mean"], mode="lines+markers", name=name, error_y=err,
                                 line={"color": c, "dash": "solid" if block == "Λ₁ block" else "dot"},
                                 marker={"symbol": "circle" if block == "Λ₁ block" else "square", "size": 8}))
    fig = _finish(fig, spec, x="Λ₂ (concentration of the varied block)", y="final R² of the block",
                  log_x=bool(spec.get("log_x")))
    fig.update_yaxes(range=[-0.05, 1.05])
    fig.update_layout(height=420)
    return fig


# --------------------------------------------------------------------------- lambda_hat_curves (Fig. 2D, 3C/D, 11B/C)
def _truth(cfg: RunConfig, member: int) -> tuple[list[float], str]:
    if cfg.loss == "tricl":
        return [], ""
    lams = cfg.lambda_ensemble
    true = lams[member] if member < len(lams) else lams[0]
    if cfg.lambda_negative is not None:
        return [p - n for p, n in zip(true, cfg.lambda_negative)], "Λ⁺ − Λ⁻"
    return list(true), "Λ" if len(lams) == 1 else f"Λ{member + 1}"


def _lambda_hat_data(df: pd.DataFrame, spec: PanelSpec, ctx: RunContext) -> pd.DataFrame:
    cols = ["facet", "trial_id", "member", "dim", "kind", "truth", "x", "value"]
    hat_cols = [c for c in df.columns if _LAMBDA_HAT.match(c)]
    if df.empty or not hat_cols:
        return pd.DataFrame(columns=cols)
    axes = _axes_in(df, ctx)
    facet_axes = [a for a in _as_list(spec.get("facet")) if a in axes] or axes
    # one trial per facet (the lowest seed): Λ̂ of different seeds would not be comparable dimension by dimension
    fin = final_rows(df).sort_values("seed", key=_natural_col, kind="stable")
    fin = fin.assign(facet=fin.apply(lambda r: _group_key(r, facet_axes), axis=1))
    chosen = fin.drop_duplicates("facet")
    chosen = chosen.sort_values("facet", key=_natural_col, kind="stable").head(int(spec.get("max_facets")))
    x = spec.get("x")
    rows = []
    for _, trial in chosen.iterrows():
        tdf = df[df["trial_id"] == trial["trial_id"]]
        members: set[int] = set()
        for c in hat_cols:
            k, i = _LAMBDA_HAT.match(c).groups()
            member = int(k) if k is not None else 0
            sub = tdf[["trial_id", x, c]].dropna()
            if sub.empty:
                continue
            members.add(member)
            for xv, v in zip(sub[x], sub[c]):
                rows.append({"facet": trial["facet"], "trial_id": trial["trial_id"], "member": member, "dim": int(i),
                             "kind": "learned", "truth": "", "x": xv, "value": float(v)})
        cfg = ctx.configs.get(trial["trial_id"])
        if cfg is None or tdf.empty:
            continue
        for member in sorted(members):
            values, what = _truth(cfg, member)
            for v in sorted(set(values)):
                for xv in (tdf[x].min(), tdf[x].max()):
                    rows.append({"facet": trial["facet"], "trial_id": trial["trial_id"], "member": member,
                                 "dim": -1, "kind": "true", "truth": what, "x": xv, "value": float(v)})
    if not rows:
        return pd.DataFrame(columns=cols)
    return pd.DataFrame(rows, columns=cols)


def _lambda_hat_draw(data: pd.DataFrame, spec: PanelSpec, ctx: RunContext) -> go.Figure:
    if data.empty:
        return empty_figure(spec, "no learned Λ̂ reported (fixed or absent for this loss)")
    facets = list(dict.fromkeys(data["facet"]))
    fig, where = _facets(facets)
    dims = _sorted_unique(data.loc[data["kind"] == "learned", "dim"])
    colors = _palette([f"dim {d}" for d in dims] if len(dims) <= 2 else dims)
    dash_by_member = ["solid", "dash", "dot", "dashdot"]
    shown: set[str] = set()
    for (facet, member, dim, kind), g in data.groupby(["facet", "member", "dim", "kind"], sort=False):
        row, col = where[facet]
        if kind == "true":
            for v, gv in g.groupby("value"):
                name = f"true {gv['truth'].iloc[0]}"
                fig.add_trace(go.Scatter(x=gv["x"], y=gv["value"], mode="lines", name=name, legendgroup="true",
                                         showlegend=name not in shown, line={"color": "black", "dash": "dash",
                                                                             "width": 1.5},
                                         hovertemplate=f"{name} = {v:g}<extra></extra>"), row=row, col=col)
                shown.add(name)
            continue
        key = dim if len(dims) > 2 else f"dim {dim}"
        name = f"Λ̂{member + 1 if data['member'].max() > 0 else ''} dim {dim}"
        fig.add_trace(go.Scatter(x=g["x"], y=g["value"], mode=_mode(len(g)), name=name, legendgroup=name,
                                 showlegend=name not in shown,
                                 line={"color": colors.get(key, "#444"), "dash": dash_by_member[member % 4]}),
                      row=row, col=col)
        shown.add(name)
    return _finish(fig, spec, x=spec.get("x"), y="Λ̂ (learned concentration)", log_y=bool(spec.get("log_y")))


# --------------------------------------------------------------------------- loss_vs_floor (Fig. 2C)
def _loss_floor_data(df: pd.DataFrame, spec: PanelSpec, ctx: RunContext) -> pd.DataFrame:
    cols = ["facet", "color", "series", "kind", "x", "mean", "lo", "hi", "n_seeds"]
    loss, x = spec.get("loss"), spec.get("x")
    if df.empty or loss not in df.columns or x not in df.columns:
        return pd.DataFrame(columns=cols)
    axes = _axes_in(df, ctx)
    facet_axes = [a for a in _as_list(spec.get("facet")) if a in axes]
    color_axes = [a for a in _as_list(spec.get("color")) if a in axes]
    frames = []
    for kind, column in (("loss", loss), ("floor", "loss_floor")):
        if column not in df.columns:
            continue
        sub = df[df[column].notna()]
        if sub.empty:
            continue
        stats = _seed_stats(sub, [*axes, x], column).rename(columns={x: "x"})
        stats["kind"] = kind
        stats["series"] = stats.apply(lambda r: point_label({a: r[a] for a in axes}), axis=1)
        stats["color"] = stats.apply(lambda r: _group_key(r, color_axes), axis=1) if color_axes else stats["series"]
        stats["facet"] = stats.apply(lambda r: _group_key(r, facet_axes), axis=1) if facet_axes else ""
        frames.append(stats[cols])
    if not frames:
        return pd.DataFrame(columns=cols)
    out = pd.concat(frames, ignore_index=True)
    return out.sort_values(["facet", "series", "kind", "x"], key=_natural_col, kind="stable").reset_index(drop=True)


def _loss_floor_draw(data: pd.DataFrame, spec: PanelSpec, ctx: RunContext) -> go.Figure:
    if data.empty:
        return empty_figure(spec, f"no {spec.get('loss')} reported yet")
    facets = _sorted_unique(data["facet"])
    fig, where = _facets(facets, shared_yaxes=True)
    colors = _palette(sorted(_sorted_unique(data["color"]), key=lambda v: sort_key(_label_value(v))))
    shown: set[str] = set()
    for (facet, series, kind), g in data.groupby(["facet", "series", "kind"], sort=False):
        row, col = where[facet]
        color = str(g["color"].iloc[0])
        name = f"{color} · {'loss' if kind == 'loss' else 'floor (ẑ = z, Λ̂ = Λ)'}"
        fig.add_trace(go.Scatter(x=g["x"], y=g["mean"], mode=_mode(len(g)), name=name, legendgroup=name,
                                 showlegend=name not in shown, hovertext=series,
                                 line={"color": colors.get(color, "#444"), "dash": "solid" if kind == "loss" else "dash"},
                                 hovertemplate="%{hovertext}<br>x=%{x}<br>%{y:.4f}<extra></extra>"),
                      row=row, col=col)
        shown.add(name)
    return _finish(fig, spec, x=spec.get("x"), y=f"{spec.get('loss')} (solid) and its floor (dashed)",
                   log_y=bool(spec.get("log_y")))


# --------------------------------------------------------------------------- iterations_to_target (Fig. 8B, 9B)
def _itt_data(df: pd.DataFrame, spec: PanelSpec, ctx: RunContext) -> pd.DataFrame:
    cols = ["x", "color", "target", "iterations", "lo", "hi", "n_reached", "n_seeds"]
    x = spec.get("x")
    targets = [float(t) for t in _as_list(spec.get("targets"))]
    if df.empty or "r2" not in df.columns or (x != "target" and x not in df.columns):
        return pd.DataFrame(columns=cols)
    axes = _axes_in(df, ctx)
    color_axes = [a for a in _as_list(spec.get("color")) if a in axes]
    rows = []
    for trial_id, t in df.sort_values("step").groupby("trial_id", sort=False):
        first = t.iloc[0]
        reached = iterations_to_target(list(t["step"]), list(t["r2"]), targets)
        for target, it in reached.items():
            rows.append({**{a: first[a] for a in axes}, "trial_id": trial_id, "target": target,
                         "iterations": float("nan") if it is None else float(it)})
    raw = pd.DataFrame(rows)
    raw["x"] = raw["target"] if x == "target" else raw[x]
    if color_axes:
        raw["color"] = raw.apply(lambda r: _group_key(r, color_axes), axis=1)
    else:
        raw["color"] = raw["target"].map(lambda t: f"R² ≥ {t:g}") if x != "target" else ""
    keys = [k for k in dict.fromkeys(["x", "color", "target"])]
    g = raw.groupby(keys, dropna=False, sort=False)["iterations"]
    out = g.agg(iterations="mean", lo="min", hi="max", n_reached="count", n_seeds="size").reset_index()
    return out[cols].sort_values(["color", "target", "x"], key=_natural_col, kind="stable").reset_index(drop=True)


def _itt_draw(data: pd.DataFrame, spec: PanelSpec, ctx: RunContext) -> go.Figure:
    if data.empty:
        return empty_figure(spec, "no R² reported yet")
    fig = go.Figure()
    lines = ["color"] if spec.get("x") == "target" else ["color", "target"]
    colors = _palette(list(dict.fromkeys(data["color"])))
    symbols = ["circle", "square", "diamond", "triangle-up", "x", "star"]
    targets = _sorted_unique(data["target"])
    for key, g in data.groupby(lines, sort=False):
        color = key[0] if isinstance(key, tuple) else key
        target = key[1] if isinstance(key, tuple) and len(key) > 1 else None
        name = str(color) if target is None or str(color).startswith("R²") else f"{color} · R² ≥ {target:g}"
        hover = [f"reached by {int(n)}/{int(s)} seeds" for n, s in zip(g["n_reached"], g["n_seeds"])]
        fig.add_trace(go.Scatter(x=g["x"], y=g["iterations"], mode="lines+markers", name=name or "iterations",
                                 line={"color": colors.get(color, "#444")}, hovertext=hover,
                                 marker={"size": 9, "symbol": symbols[targets.index(target) % 6] if target is not None
                                         else "circle"},
                                 hovertemplate="x=%{x}<br>iterations=%{y}<br>%{hovertext}<extra></extra>"))
    missing = data[data["n_reached"] == 0]
    note = f"{len(missing)} of {len(data)} points never reached their target" if len(missing) else ""
    fig = _finish(fig, spec, x="target R²" if spec.get("x") == "target" else spec.get("x"),
                  y="iterations to target R² (mean over seeds that reached it)", log_y=bool(spec.get("log_y")))
    if note:
        fig.add_annotation(text=note, showarrow=False, x=1, y=1.02, xref="paper", yref="paper", xanchor="right",
                           yanchor="bottom", font={"size": 11, "color": "#a00"})
    if not data["iterations"].notna().any():
        fig.add_annotation(text="no trial reached any target R² yet", showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper", font={"size": 14, "color": "#666"})
    fig.update_layout(height=420)
    return fig


# --------------------------------------------------------------------------- loss_vs_fixed_lambda (Fig. 10A)
def _scalar(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, list):
        return float(v[0]) if v and len(set(v)) == 1 else None
    return float(v)


def _fixed_lambda_data(df: pd.DataFrame, spec: PanelSpec, ctx: RunContext) -> pd.DataFrame:
    cols = ["color", "fixed_lambda", "mean", "lo", "hi", "n_seeds", "optimum", "optimum_label"]
    metric = spec.get("metric")
    if df.empty or metric not in df.columns:
        return pd.DataFrame(columns=cols)
    fin = final_rows(df)
    color_axes = [a for a in _as_list(spec.get("color")) if a in fin.columns]
    rows = []
    for _, r in fin.iterrows():
        cfg = ctx.configs.get(r["trial_id"])
        if cfg is None or cfg.fixed_lambda_hat is None or pd.isna(r[metric]):
            continue
        fixed = _scalar(cfg.fixed_lambda_hat)
        if fixed is None:
            continue
        pos = cfg.lambda_true
        neg = cfg.lambda_negative
        hard = neg is not None and cfg.n_hard_negatives > 0
        optimum = np.mean(pos) - np.mean(neg) if hard else np.mean(pos)  # Cor. B.1 (isotropic Λ̂)
        rows.append({"color": _group_key(r, color_axes) if color_axes else "", "fixed_lambda": fixed,
                     "value": float(r[metric]), "optimum": float(optimum),
                     "optimum_label": "Λ⁺ − Λ⁻" if hard else "Λ⁺ (no hard negatives)"})
    if not rows:
        return pd.DataFrame(columns=cols)
    raw = pd.DataFrame(rows)
    out = _seed_stats(raw, ["color", "fixed_lambda", "optimum", "optimum_label"], "value")
    return out[cols].sort_values(["color", "fixed_lambda"], key=_natural_col, kind="stable").reset_index(drop=True)


def _fixed_lambda_draw(data: pd.DataFrame, spec: PanelSpec, ctx: RunContext) -> go.Figure:
    if data.empty:
        return empty_figure(spec, "no trial with a fixed Λ̂ (fixed_lambda_hat) has reported yet")
    fig = go.Figure()
    colors = _palette(_sorted_unique(data["color"]))
    for color, g in data.groupby("color", sort=False):
        c = colors.get(color, "#444")
        fig.add_trace(go.Scatter(x=g["fixed_lambda"], y=g["mean"], mode="lines+markers", name=str(color) or "loss",
                                 line={"color": c}, marker={"size": 8}))
        best = g.loc[g["mean"].idxmin()]
        fig.add_trace(go.Scatter(x=[best["fixed_lambda"]], y=[best["mean"]], mode="markers", showlegend=False,
                                 marker={"symbol": "star", "size": 14, "color": c, "line": {"width": 1, "color": "black"}},
                                 hovertemplate="lowest loss at Λ̂ = %{x:g}<extra></extra>"))
    marks = data[["optimum", "optimum_label"]].drop_duplicates().sort_values("optimum")
    for i, (opt, label) in enumerate(marks.itertuples(index=False)):
        fig.add_vline(x=opt, line_dash="dash", line_color="black", annotation_text=f"{label} = {opt:g}",
                      annotation_position="top" if i % 2 == 0 else "bottom")
    fig = _finish(fig, spec, x="fixed Λ̂", y=f"final {spec.get('metric')}", log_x=bool(spec.get("log_x")))
    fig.update_layout(height=420)
    return fig


# --------------------------------------------------------------------------- similarity_histograms (Fig. 8C/F)
def _hist_data(df: pd.DataFrame, spec: PanelSpec, ctx: RunContext) -> pd.DataFrame:
    cols = ["facet", "kind", "bin_center", "density", "overlap", "n_seeds"]
    if df.empty or "sim_pos_hist" not in df.columns:
        return pd.DataFrame(columns=cols)
    fin = final_rows(df)
    fin = fin[fin["sim_pos_hist"].map(lambda v: isinstance(v, list | np.ndarray) and len(v) > 0)]
    if fin.empty:
        return pd.DataFrame(columns=cols)
    axes = _axes_in(fin, ctx)
    facet_axes = [a for a in _as_list(spec.get("facet")) if a in axes] or axes
    fin = fin.assign(facet=fin.apply(lambda r: _group_key(r, facet_axes), axis=1))
    facets = sorted(fin["facet"].unique(), key=lambda v: sort_key(_label_value(v)))[: int(spec.get("max_facets"))]
    rows = []
    for facet in facets:
        g = fin[fin["facet"] == facet]
        overlap = float(g["sim_overlap"].mean()) if "sim_overlap" in g else float("nan")
        for kind, column in (("positive", "sim_pos_hist"), ("negative", "sim_neg_hist")):
            hists = np.array([np.asarray(h, dtype=float) for h in g[column]])
            mean = hists.mean(axis=0)
            edges = np.linspace(-1.0, 1.0, len(mean) + 1)
            centers = (edges[:-1] + edges[1:]) / 2
            for c, d in zip(centers, mean):
                rows.append({"facet": facet, "kind": kind, "bin_center": float(c), "density": float(d),
                             "overlap": overlap, "n_seeds": len(g)})
    return pd.DataFrame(rows, columns=cols)


def _hist_draw(data: pd.DataFrame, spec: PanelSpec, ctx: RunContext) -> go.Figure:
    if data.empty:
        return empty_figure(spec, "no similarity histograms reported yet")
    facets = list(dict.fromkeys(data["facet"]))
    titles = [f"{f}<br>overlap {data.loc[data['facet'] == f, 'overlap'].iloc[0]:.2f}" for f in facets]
    fig, where = _facets(titles)
    colors = {"positive": "#1f77b4", "negative": "#d62728"}
    for facet, title in zip(facets, titles):
        row, col = where[title]
        for kind in ("positive", "negative"):
            g = data[(data["facet"] == facet) & (data["kind"] == kind)]
            fig.add_trace(go.Bar(x=g["bin_center"], y=g["density"], name=f"{kind} pairs", legendgroup=kind,
                                 showlegend=facet == facets[0], marker={"color": colors[kind]}, opacity=0.6,
                                 width=2.0 / max(len(g), 1)), row=row, col=col)
    fig.update_layout(barmode="overlay")
    fig.update_annotations(font_size=11)
    return _finish(fig, spec, x="cosine similarity of encodings", y="fraction of pairs")


# --------------------------------------------------------------------------- ensemble_bars (Fig. 11A + table)
def _paper_value(paper: Any, key: Any, scale: float = 1.0) -> float | None:
    """The paper's value for bar ``key``: a number, or a mapping with 'mean' (or 'r2'), times ``scale``."""
    if isinstance(paper, dict):
        for k, v in paper.items():
            if str(k) == str(key):
                x = _num(v.get("mean", v.get("r2"))) if isinstance(v, dict) else _num(v)
                return None if x is None else x * scale
    return None


def _bars_data(df: pd.DataFrame, spec: PanelSpec, ctx: RunContext) -> pd.DataFrame:
    cols = ["facet", "x", "mean", "std", "n_seeds", "paper"]
    x, metric = spec.get("x"), spec.get("metric")
    if df.empty or x not in df.columns or metric not in df.columns:
        return pd.DataFrame(columns=cols)
    fin = final_rows(df)
    facet_axes = [a for a in _as_list(spec.get("facet")) if a in fin.columns]
    fin = fin.assign(facet=fin.apply(lambda r: _group_key(r, facet_axes), axis=1) if facet_axes else "")
    g = fin.groupby(["facet", x], dropna=False, sort=False)[metric]
    out = g.agg(mean="mean", std="std", n_seeds="count").reset_index().rename(columns={x: "x"})
    paper = ctx.paper_values
    if spec.get("paper_key"):
        paper = paper.get(spec.get("paper_key"), {}) if isinstance(paper, dict) else {}
    out["paper"] = out["x"].map(lambda v: _paper_value(paper, v, float(spec.get("paper_scale"))))
    order = {v: i for i, v in enumerate(_as_list(spec.get("order")))}
    out = out.sort_values(["facet", "x"], key=lambda s: s.map(lambda v: (order.get(v, len(order)), sort_key(v)))
                          if s.name == "x" else _natural_col(s), kind="stable")
    return out[cols].reset_index(drop=True)


def _bars_draw(data: pd.DataFrame, spec: PanelSpec, ctx: RunContext) -> go.Figure:
    if data.empty:
        return empty_figure(spec, f"no final {spec.get('metric')} yet")
    facets = list(dict.fromkeys(data["facet"]))
    fig, where = _facets(facets, shared_yaxes=True)
    colors = _palette(list(dict.fromkeys(data["x"])))
    for i, facet in enumerate(facets):
        g = data[data["facet"] == facet]
        row, col = where[facet]
        fig.add_trace(go.Bar(x=[fmt(v) for v in g["x"]], y=g["mean"], name="this run (mean over seeds)",
                             marker={"color": [colors[v] for v in g["x"]]}, showlegend=i == 0,
                             error_y={"type": "data", "array": g["std"].fillna(0), "visible": True},
                             text=[f"{v:.3f}" for v in g["mean"]], textposition="outside"), row=row, col=col)
        p = g[g["paper"].notna()]
        if not p.empty:
            fig.add_trace(go.Scatter(x=[fmt(v) for v in p["x"]], y=p["paper"], mode="markers+text", name="paper",
                                     showlegend=i == 0, text=[f"paper {v:.2f}" for v in p["paper"]],
                                     textposition="middle right",
                                     marker={"symbol": "line-ew-open", "size": 40, "color": "black",
                                             "line": {"width": 3}}), row=row, col=col)
    fig = _finish(fig, spec, x=spec.get("x"), y=f"final {spec.get('metric')}")
    fig.update_yaxes(range=[0, 1.12])
    fig.update_layout(height=max(fig.layout.height or 0, 420))
    return fig


# --------------------------------------------------------------------------- registry
_COMMON_FACETS = (str, list)
PANELS: dict[str, PanelKind] = {
    "r2_curves": PanelKind(
        "r2_curves", "R² during training",
        "R² (or another reported metric) against iterations: one line per grid point, the mean over seeds with a "
        "min–max band, coloured and faceted by grid axes.",
        _r2_curves_data, _r2_curves_draw,
        {"y": Option((str, list), "r2", "metric column(s) or glob pattern(s), e.g. r2_lambda_*"),
         "x": Option((str,), "step", "x axis", choices=X_COLUMNS),
         "color": Option(_COMMON_FACETS, None, "axis (or axes) giving the line colour", axis=True),
         "facet": Option(_COMMON_FACETS, None, "axis (or axes) giving one subplot per value", axis=True),
         "log_x": Option((bool,), False, "log-scale x axis")}),
    "final_heatmap": PanelKind(
        "final_heatmap", "Final R² over two axes",
        "The final value of a metric (default R²) over two grid axes, mean over seeds.",
        _final_heatmap_data, _final_heatmap_draw,
        {"x": Option((str,), None, "axis on x", axis=True, required=True),
         "y": Option((str,), None, "axis on y", axis=True, required=True),
         "metric": Option((str,), "r2", "metric column"),
         "facet": Option(_COMMON_FACETS, None, "axis (or axes) giving one heatmap per value", axis=True)}),
    "r2_blocks_vs_lambda": PanelKind(
        "r2_blocks_vs_lambda", "R² per Λ block against Λ₂",
        "Final R² of the fixed block (Λ₁, first dimensions) and the varied block (Λ₂, last dimensions) against "
        "Λ₂, one pair of lines per loss.",
        _blocks_data, _blocks_draw,
        {"color": Option(_COMMON_FACETS, None, "axis separating the losses (e.g. variant)", axis=True),
         "log_x": Option((bool,), True, "log-scale Λ₂ axis")}),
    "lambda_hat_curves": PanelKind(
        "lambda_hat_curves", "Learned Λ̂ during training",
        "Each learned concentration Λ̂ᵢ against iterations for one seed of each grid point, with the true Λ "
        "(or Λ⁺ − Λ⁻ with hard negatives) dashed.",
        _lambda_hat_data, _lambda_hat_draw,
        {"x": Option((str,), "step", "x axis", choices=X_COLUMNS),
         "facet": Option(_COMMON_FACETS, None, "axes giving one subplot per value (default: every axis)", axis=True),
         "max_facets": Option((int,), 9, "at most this many subplots"),
         "log_y": Option((bool,), False, "log-scale Λ̂ axis")}),
    "loss_vs_floor": PanelKind(
        "loss_vs_floor", "Loss against its floor",
        "The loss on fresh batches against the floor reached by the true latents with the true Λ (the global "
        "minimum), mean over seeds.",
        _loss_floor_data, _loss_floor_draw,
        {"loss": Option((str,), "eval_loss", "loss column", choices=("eval_loss", "loss")),
         "x": Option((str,), "step", "x axis", choices=X_COLUMNS),
         "color": Option(_COMMON_FACETS, None, "axis (or axes) giving the line colour", axis=True),
         "facet": Option(_COMMON_FACETS, None, "axis (or axes) giving one subplot per value", axis=True),
         "log_y": Option((bool,), False, "log-scale loss axis")}),
    "iterations_to_target": PanelKind(
        "iterations_to_target", "Iterations to a target R²",
        "The first iteration at which R² reached each target, mean over the seeds that reached it, against an "
        "axis (or against the target itself), log scale.",
        _itt_data, _itt_draw,
        {"x": Option((str,), None, "axis on x, or 'target'", required=True),
         "targets": Option((list, float), None, "target R² values", required=True),
         "color": Option(_COMMON_FACETS, None, "axis (or axes) giving one line per value", axis=True),
         "log_y": Option((bool,), True, "log-scale iterations axis")}),
    "loss_vs_fixed_lambda": PanelKind(
        "loss_vs_fixed_lambda", "Loss against a fixed Λ̂",
        "The final loss of runs trained with Λ̂ held fixed, against that Λ̂, with Λ⁺ − Λ⁻ (Cor. B.1) marked.",
        _fixed_lambda_data, _fixed_lambda_draw,
        {"metric": Option((str,), "eval_loss", "loss column", choices=("eval_loss", "loss")),
         "color": Option(_COMMON_FACETS, None, "axis (or axes) giving one line per value", axis=True),
         "log_x": Option((bool,), False, "log-scale Λ̂ axis")}),
    "similarity_histograms": PanelKind(
        "similarity_histograms", "Similarities of positive and negative pairs",
        "Histograms of the cosine similarity of positive pairs and of negative pairs at the last report, "
        "mean over seeds, with their overlap.",
        _hist_data, _hist_draw,
        {"facet": Option(_COMMON_FACETS, None, "axes giving one subplot per value (default: every axis)", axis=True),
         "max_facets": Option((int,), 9, "at most this many subplots")}),
    "ensemble_bars": PanelKind(
        "ensemble_bars", "Final R² per variant against the paper",
        "Final R² per variant (mean ± std over seeds) with the paper's reported values marked.",
        _bars_data, _bars_draw,
        {"x": Option((str,), "variant", "axis giving the bars", axis=True),
         "metric": Option((str,), "r2", "metric column"),
         "paper_key": Option((str,), None, "entry of the grid's paper_values holding the values per bar"),
         "paper_scale": Option((float,), 1.0, "factor on the paper's values (0.01 for percentages)"),
         "order": Option((list,), None, "order of the bars"),
         "facet": Option(_COMMON_FACETS, None, "axis (or axes) giving one subplot per value", axis=True)}),
}


def panel_data(df: pd.DataFrame, spec: PanelSpec, ctx: RunContext) -> pd.DataFrame:
    """The tidy DataFrame a panel draws (after its ``where`` filter)."""
    return PANELS[spec.kind].data(apply_where(df, spec.where), spec, ctx)


def panel_figure(data: pd.DataFrame, spec: PanelSpec, ctx: RunContext) -> go.Figure:
    """Draw a panel's data."""
    return PANELS[spec.kind].draw(data, spec, ctx)
