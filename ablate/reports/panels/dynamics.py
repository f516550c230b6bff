"""Panels of learning dynamics (Fig. 8, 9B): iterations to a target R², similarities of positive and negative pairs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ablate.analysis.finished import final_values
from ablate.analysis.run import RunContext
from ablate.analysis.stats import iterations_to_targets
from ablate.reports.panels.base import (
    PanelKind,
    axes_in,
    empty_figure,
    finish,
    group_key,
    label_value,
    make_facets,
    natural_col,
    palette,
    register,
    sort_key,
    sorted_unique,
)
from ablate.reports.panels.options import IterationsToTarget, SimilarityHistograms


# --------------------------------------------------------------------------- iterations_to_target (Fig. 8B, 9B)
def _itt_data(df: pd.DataFrame, spec: IterationsToTarget, ctx: RunContext) -> pd.DataFrame:
    cols = ["x", "color", "target", "iterations", "lo", "hi", "n_reached", "n_seeds"]
    x = spec.x
    targets = [float(t) for t in spec.targets]
    if df.empty or "r2" not in df.columns or (x != "target" and x not in df.columns):
        return pd.DataFrame(columns=cols)
    axes = axes_in(df, ctx)
    color_axes = [a for a in spec.color if a in axes]
    raw = iterations_to_targets(df, axes, targets)
    raw["x"] = raw["target"] if x == "target" else raw[x]
    if color_axes:
        raw["color"] = raw.apply(lambda r: group_key(r, color_axes), axis=1)
    else:
        raw["color"] = raw["target"].map(lambda t: f"R² ≥ {t:g}") if x != "target" else ""
    keys = [k for k in dict.fromkeys(["x", "color", "target"])]
    g = raw.groupby(keys, dropna=False, sort=False)["iterations"]
    out = g.agg(iterations="mean", lo="min", hi="max", n_reached="count", n_seeds="size").reset_index()
    return out[cols].sort_values(["color", "target", "x"], key=natural_col, kind="stable").reset_index(drop=True)


def _itt_draw(data: pd.DataFrame, spec: IterationsToTarget, ctx: RunContext) -> go.Figure:
    if data.empty:
        return empty_figure(spec, "no R² reported yet")
    fig = go.Figure()
    lines = ["color"] if spec.x == "target" else ["color", "target"]
    colors = palette(list(dict.fromkeys(data["color"])))
    symbols = ["circle", "square", "diamond", "triangle-up", "x", "star"]
    targets = sorted_unique(data["target"])
    for key, g in data.groupby(lines, sort=False):
        color = key[0] if isinstance(key, tuple) else key
        target = key[1] if isinstance(key, tuple) and len(key) > 1 else None
        name = str(color) if target is None or str(color).startswith("R²") else f"{color} · R² ≥ {target:g}"
        hover = [f"reached by {int(n)}/{int(s)} seeds" for n, s in zip(g["n_reached"], g["n_seeds"])]
        fig.add_trace(
            go.Scatter(
                x=g["x"],
                y=g["iterations"],
                mode="lines+markers",
                name=name or "iterations",
                line={"color": colors.get(color, "#444")},
                hovertext=hover,
                marker={"size": 9, "symbol": symbols[targets.index(target) % 6] if target is not None else "circle"},
                hovertemplate="x=%{x}<br>iterations=%{y}<br>%{hovertext}<extra></extra>",
            )
        )
    missing = data[data["n_reached"] == 0]
    note = f"{len(missing)} of {len(data)} points never reached their target" if len(missing) else ""
    fig = finish(
        fig,
        spec,
        x="target R²" if spec.x == "target" else spec.x,
        y="iterations to target R² (mean over seeds that reached it)",
        log_y=spec.log_y,
    )
    if note:
        fig.add_annotation(
            text=note,
            showarrow=False,
            x=1,
            y=1.02,
            xref="paper",
            yref="paper",
            xanchor="right",
            yanchor="bottom",
            font={"size": 11, "color": "#a00"},
        )
    if not data["iterations"].notna().any():
        fig.add_annotation(
            text="no trial reached any target R² yet",
            showarrow=False,
            x=0.5,
            y=0.5,
            xref="paper",
            yref="paper",
            font={"size": 14, "color": "#666"},
        )
    fig.update_layout(height=420)
    return fig


# --------------------------------------------------------------------------- similarity_histograms (Fig. 8C/F)
def _hist_data(df: pd.DataFrame, spec: SimilarityHistograms, ctx: RunContext) -> pd.DataFrame:
    cols = ["facet", "kind", "bin_center", "density", "overlap", "n_seeds"]
    if df.empty or "sim_pos_hist" not in df.columns:
        return pd.DataFrame(columns=cols)
    fin = final_values(df)  # the trials that finished
    fin = fin[fin["sim_pos_hist"].map(lambda v: isinstance(v, list | np.ndarray) and len(v) > 0)]
    if fin.empty:
        return pd.DataFrame(columns=cols)
    axes = axes_in(fin, ctx)
    facet_axes = [a for a in spec.facet if a in axes] or axes
    fin = fin.assign(facet=fin.apply(lambda r: group_key(r, facet_axes), axis=1))
    facets = sorted(fin["facet"].unique(), key=lambda v: sort_key(label_value(v)))[: spec.max_facets]
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
                rows.append(
                    {
                        "facet": facet,
                        "kind": kind,
                        "bin_center": float(c),
                        "density": float(d),
                        "overlap": overlap,
                        "n_seeds": len(g),
                    }
                )
    return pd.DataFrame(rows, columns=cols)


def _hist_draw(data: pd.DataFrame, spec: SimilarityHistograms, ctx: RunContext) -> go.Figure:
    if data.empty:
        return empty_figure(spec, "no similarity histograms reported yet")
    facets = list(dict.fromkeys(data["facet"]))
    titles = [f"{f}<br>overlap {data.loc[data['facet'] == f, 'overlap'].iloc[0]:.2f}" for f in facets]
    fig, where = make_facets(titles)
    colors = {"positive": "#1f77b4", "negative": "#d62728"}
    for facet, title in zip(facets, titles):
        row, col = where[title]
        for kind in ("positive", "negative"):
            g = data[(data["facet"] == facet) & (data["kind"] == kind)]
            fig.add_trace(
                go.Bar(
                    x=g["bin_center"],
                    y=g["density"],
                    name=f"{kind} pairs",
                    legendgroup=kind,
                    showlegend=facet == facets[0],
                    marker={"color": colors[kind]},
                    opacity=0.6,
                    width=2.0 / max(len(g), 1),
                ),
                row=row,
                col=col,
            )
    fig.update_layout(barmode="overlay")
    fig.update_annotations(font_size=11)
    return finish(fig, spec, x="cosine similarity of encodings", y="fraction of pairs")


# --------------------------------------------------------------------------- registry
register(
    PanelKind(
        "iterations_to_target",
        "Iterations to a target R²",
        "The first iteration at which R² reached each target, mean over the seeds that reached it, against an "
        "axis (or against the target itself), log scale.",
        _itt_data,
        _itt_draw,
        IterationsToTarget,
        finals=True,
    )
)

register(
    PanelKind(
        "similarity_histograms",
        "Similarities of positive and negative pairs",
        "Histograms of the cosine similarity of positive pairs and of negative pairs at the last report, "
        "mean over seeds, with their overlap.",
        _hist_data,
        _hist_draw,
        SimilarityHistograms,
        finals=True,
    )
)
