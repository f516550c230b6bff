"""Panels of final values: heatmaps over two axes, R² per Λ block, the loss at a fixed Λ̂, bars against the paper."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go

from ablate.analysis.finished import final_values
from ablate.analysis.run import RunContext
from ablate.analysis.stats import block_r2, fixed_lambda_losses, seed_stats
from ablate.reports.panels.base import (
    PanelKind,
    as_number,
    empty_figure,
    finish,
    fmt,
    group_key,
    make_facets,
    natural_col,
    palette,
    register,
    sort_key,
    sorted_unique,
)
from ablate.reports.panels.options import EnsembleBars, FinalHeatmap, LossVsFixedLambda, R2BlocksVsLambda


# --------------------------------------------------------------------------- final_heatmap
def _final_heatmap_data(df: pd.DataFrame, spec: FinalHeatmap, ctx: RunContext) -> pd.DataFrame:
    cols = ["facet", "x", "y", "value", "std", "n_seeds"]
    x, y, metric = spec.x, spec.y, spec.metric
    if df.empty or x not in df.columns or y not in df.columns or metric not in df.columns:
        return pd.DataFrame(columns=cols)
    fin = final_values(df)  # the trials that finished
    facet_axes = [a for a in spec.facet if a in fin.columns]
    fin = fin.assign(facet=fin.apply(lambda r: group_key(r, facet_axes), axis=1) if facet_axes else "")
    g = fin.groupby(["facet", x, y], dropna=False, sort=False)[metric]
    out = g.agg(value="mean", std="std", n_seeds="count").reset_index().rename(columns={x: "x", y: "y"})
    return out[cols].sort_values(["facet", "y", "x"], key=natural_col, kind="stable").reset_index(drop=True)


def _final_heatmap_draw(data: pd.DataFrame, spec: FinalHeatmap, ctx: RunContext) -> go.Figure:
    metric = spec.metric
    if data.empty:
        return empty_figure(spec, f"no final {metric} yet")
    facets = sorted_unique(data["facet"])
    fig, where = make_facets(facets, cols=2)
    r2_like = str(metric).startswith(("r2", "mcc"))
    for facet in facets:
        sub = data[data["facet"] == facet]
        xs, ys = sorted_unique(sub["x"]), sorted_unique(sub["y"])
        z = [[None] * len(xs) for _ in ys]
        text = [[""] * len(xs) for _ in ys]
        for _, r in sub.iterrows():
            i, j = ys.index(r["y"]), xs.index(r["x"])
            z[i][j] = r["value"]
            text[i][j] = f"{r['value']:.3f}" + (f"<br>n={int(r['n_seeds'])}" if r["n_seeds"] > 1 else "")
        row, col = where[facet]
        fig.add_trace(
            go.Heatmap(
                x=[fmt(v) for v in xs],
                y=[fmt(v) for v in ys],
                z=z,
                text=text,
                texttemplate="%{text}",
                colorscale="Viridis",
                zmin=0 if r2_like else None,
                zmax=1 if r2_like else None,
                colorbar={"title": {"text": metric}},
                hovertemplate=f"{spec.x}=%{{x}}<br>{spec.y}=%{{y}}<br>{metric}=%{{z:.4f}}<extra></extra>",
            ),
            row=row,
            col=col,
        )
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category")
    return finish(fig, spec, x=spec.x, y=spec.y)


# --------------------------------------------------------------------------- r2_blocks_vs_lambda (Fig. 2A)
def _blocks_data(df: pd.DataFrame, spec: R2BlocksVsLambda, ctx: RunContext) -> pd.DataFrame:
    cols = ["color", "x", "block", "block_lambda", "mean", "lo", "hi", "n_seeds"]
    raw = block_r2(df, ctx)
    if raw.empty:
        return pd.DataFrame(columns=cols)
    color_axes = [a for a in spec.color if a in raw.columns]
    raw = raw.assign(
        color=raw.apply(lambda r: group_key(r, color_axes), axis=1) if color_axes else "",
        x=raw["varied_lambda"],
        block=raw["block"].map({"first": "Λ₁ block", "last": "Λ₂ block"}),
    )
    out = seed_stats(raw, ["color", "x", "block", "block_lambda"], "r2")
    return out[cols].sort_values(["color", "block", "x"], key=natural_col, kind="stable").reset_index(drop=True)


def _blocks_draw(data: pd.DataFrame, spec: R2BlocksVsLambda, ctx: RunContext) -> go.Figure:
    if data.empty:
        return empty_figure(spec, "no per-block R² yet (needs r2_lambda_<Λ> columns)")
    fig = go.Figure()
    colors = palette(sorted_unique(data["color"]))
    for (color, block), g in data.groupby(["color", "block"], sort=False):
        name = f"{color} · {block}" if color else block
        c = colors.get(color, "#444")
        err = {
            "type": "data",
            "symmetric": False,
            "array": g["hi"] - g["mean"],
            "arrayminus": g["mean"] - g["lo"],
            "visible": bool((g["n_seeds"] > 1).any()),
        }
        fig.add_trace(
            go.Scatter(
                x=g["x"],
                y=g["mean"],
                mode="lines+markers",
                name=name,
                error_y=err,
                line={"color": c, "dash": "solid" if block == "Λ₁ block" else "dot"},
                marker={"symbol": "circle" if block == "Λ₁ block" else "square", "size": 8},
            )
        )
    fig = finish(fig, spec, x="Λ₂ (concentration of the varied block)", y="final R² of the block", log_x=spec.log_x)
    fig.update_yaxes(range=[-0.05, 1.05])
    fig.update_layout(height=420)
    return fig


# --------------------------------------------------------------------------- loss_vs_fixed_lambda (Fig. 10A)
def _fixed_lambda_data(df: pd.DataFrame, spec: LossVsFixedLambda, ctx: RunContext) -> pd.DataFrame:
    cols = ["color", "fixed_lambda", "mean", "lo", "hi", "n_seeds", "optimum", "optimum_label"]
    raw = fixed_lambda_losses(df, ctx, spec.metric)
    if raw.empty:
        return pd.DataFrame(columns=cols)
    color_axes = [a for a in spec.color if a in raw.columns]
    raw = raw.assign(
        color=raw.apply(lambda r: group_key(r, color_axes), axis=1) if color_axes else "",
        optimum_label=raw["hard"].map({True: "Λ⁺ − Λ⁻", False: "Λ⁺ (no hard negatives)"}),
    )
    out = seed_stats(raw, ["color", "fixed_lambda", "optimum", "optimum_label"], "value")
    return out[cols].sort_values(["color", "fixed_lambda"], key=natural_col, kind="stable").reset_index(drop=True)


def _fixed_lambda_draw(data: pd.DataFrame, spec: LossVsFixedLambda, ctx: RunContext) -> go.Figure:
    if data.empty:
        return empty_figure(spec, "no trial with a fixed Λ̂ (fixed_lambda_hat) has reported yet")
    fig = go.Figure()
    colors = palette(sorted_unique(data["color"]))
    for color, g in data.groupby("color", sort=False):
        c = colors.get(color, "#444")
        fig.add_trace(
            go.Scatter(
                x=g["fixed_lambda"],
                y=g["mean"],
                mode="lines+markers",
                name=str(color) or "loss",
                line={"color": c},
                marker={"size": 8},
            )
        )
        best = g.loc[g["mean"].idxmin()]
        fig.add_trace(
            go.Scatter(
                x=[best["fixed_lambda"]],
                y=[best["mean"]],
                mode="markers",
                showlegend=False,
                marker={"symbol": "star", "size": 14, "color": c, "line": {"width": 1, "color": "black"}},
                hovertemplate="lowest loss at Λ̂ = %{x:g}<extra></extra>",
            )
        )
    marks = data[["optimum", "optimum_label"]].drop_duplicates().sort_values("optimum")
    for i, (opt, label) in enumerate(marks.itertuples(index=False)):
        fig.add_vline(
            x=opt,
            line_dash="dash",
            line_color="black",
            annotation_text=f"{label} = {opt:g}",
            annotation_position="top" if i % 2 == 0 else "bottom",
        )
    fig = finish(fig, spec, x="fixed Λ̂", y=f"final {spec.metric}", log_x=spec.log_x)
    fig.update_layout(height=420)
    return fig


# --------------------------------------------------------------------------- ensemble_bars (Fig. 11A + table)
def _paper_value(paper: Any, key: Any, scale: float = 1.0) -> float | None:
    """The paper's value for bar ``key``: a number, or a mapping with 'mean' (or 'r2'), times ``scale``."""
    if isinstance(paper, dict):
        for k, v in paper.items():
            if str(k) == str(key):
                x = as_number(v.get("mean", v.get("r2"))) if isinstance(v, dict) else as_number(v)
                return None if x is None else x * scale
    return None


def _bars_data(df: pd.DataFrame, spec: EnsembleBars, ctx: RunContext) -> pd.DataFrame:
    cols = ["facet", "x", "mean", "std", "n_seeds", "paper"]
    x, metric = spec.x, spec.metric
    if df.empty or x not in df.columns or metric not in df.columns:
        return pd.DataFrame(columns=cols)
    fin = final_values(df)  # the trials that finished
    facet_axes = [a for a in spec.facet if a in fin.columns]
    fin = fin.assign(facet=fin.apply(lambda r: group_key(r, facet_axes), axis=1) if facet_axes else "")
    g = fin.groupby(["facet", x], dropna=False, sort=False)[metric]
    out = g.agg(mean="mean", std="std", n_seeds="count").reset_index().rename(columns={x: "x"})
    paper = ctx.paper_values
    if spec.paper_key:
        paper = paper.get(spec.paper_key, {}) if isinstance(paper, dict) else {}
    out["paper"] = out["x"].map(lambda v: _paper_value(paper, v, spec.paper_scale))
    order = {v: i for i, v in enumerate(spec.order)}
    out = out.sort_values(
        ["facet", "x"],
        key=lambda s: s.map(lambda v: (order.get(v, len(order)), sort_key(v))) if s.name == "x" else natural_col(s),
        kind="stable",
    )
    return out[cols].reset_index(drop=True)


def _bars_draw(data: pd.DataFrame, spec: EnsembleBars, ctx: RunContext) -> go.Figure:
    if data.empty:
        return empty_figure(spec, f"no final {spec.metric} yet")
    facets = list(dict.fromkeys(data["facet"]))
    fig, where = make_facets(facets, shared_yaxes=True)
    colors = palette(list(dict.fromkeys(data["x"])))
    for i, facet in enumerate(facets):
        g = data[data["facet"] == facet]
        row, col = where[facet]
        fig.add_trace(
            go.Bar(
                x=[fmt(v) for v in g["x"]],
                y=g["mean"],
                name="this run (mean over seeds)",
                marker={"color": [colors[v] for v in g["x"]]},
                showlegend=i == 0,
                error_y={"type": "data", "array": g["std"].fillna(0), "visible": True},
                text=[f"{v:.3f}" for v in g["mean"]],
                textposition="outside",
            ),
            row=row,
            col=col,
        )
        p = g[g["paper"].notna()]
        if not p.empty:
            fig.add_trace(
                go.Scatter(
                    x=[fmt(v) for v in p["x"]],
                    y=p["paper"],
                    mode="markers+text",
                    name="paper",
                    showlegend=i == 0,
                    text=[f"paper {v:.2f}" for v in p["paper"]],
                    textposition="middle right",
                    marker={"symbol": "line-ew-open", "size": 40, "color": "black", "line": {"width": 3}},
                ),
                row=row,
                col=col,
            )
    fig = finish(fig, spec, x=spec.x, y=f"final {spec.metric}")
    fig.update_yaxes(range=[0, 1.12])
    fig.update_layout(height=max(fig.layout.height or 0, 420))
    return fig


# --------------------------------------------------------------------------- registry
register(
    PanelKind(
        "final_heatmap",
        "Final R² over two axes",
        "The final value of a metric (default R²) over two grid axes, mean over seeds.",
        _final_heatmap_data,
        _final_heatmap_draw,
        FinalHeatmap,
        finals=True,
    )
)

register(
    PanelKind(
        "r2_blocks_vs_lambda",
        "R² per Λ block against Λ₂",
        "Final R² of the fixed block (Λ₁, first dimensions) and the varied block (Λ₂, last dimensions) against "
        "Λ₂, one pair of lines per loss.",
        _blocks_data,
        _blocks_draw,
        R2BlocksVsLambda,
        finals=True,
    )
)

register(
    PanelKind(
        "loss_vs_fixed_lambda",
        "Loss against a fixed Λ̂",
        "The final loss of runs trained with Λ̂ held fixed, against that Λ̂, with Λ⁺ − Λ⁻ (Cor. B.1) marked.",
        _fixed_lambda_data,
        _fixed_lambda_draw,
        LossVsFixedLambda,
        finals=True,
    )
)

register(
    PanelKind(
        "ensemble_bars",
        "Final R² per variant against the paper",
        "Final R² per variant (mean ± std over seeds) with the paper's reported values marked.",
        _bars_data,
        _bars_draw,
        EnsembleBars,
        finals=True,
    )
)
