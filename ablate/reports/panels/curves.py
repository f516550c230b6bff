"""Panels of quantities during training: R² curves, learned Λ̂, the loss against its floor."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from ablate.analysis.compare import seed_ci
from ablate.analysis.finished import unfinished_trials
from ablate.analysis.run import RunContext, final_rows
from ablate.analysis.stats import seed_stats
from ablate.columns import parse_lambda_hat
from ablate.config import RunConfig
from ablate.reports.panels.base import (
    PanelKind,
    PanelSpec,
    add_ended_marks,
    axes_in,
    empty_figure,
    ended_marks,
    finish,
    group_key,
    label_value,
    make_facets,
    metric_columns,
    metric_label,
    natural_col,
    palette,
    point_label,
    register,
    rgba,
    sort_key,
    sorted_unique,
    trace_mode,
)
from ablate.reports.panels.options import LambdaHatCurves, LossVsFloor, R2Curves


# --------------------------------------------------------------------------- r2_curves
def _with_ended_marks(stats: pd.DataFrame, df: pd.DataFrame, axes: list[str], x: str, metric: str) -> pd.DataFrame:
    """A curve's seed statistics (``ended`` empty) and, for each trial that stopped before its end, a row at its
    last report (``mean``: its value, ``n_seeds`` 1, ``ended``: the trial and why; :func:`ended_marks`)."""
    marks = ended_marks(df, metric, x)
    if marks.empty:
        return stats
    marks = marks[[*axes, x, metric, "ended"]].rename(columns={x: "x", metric: "mean"})
    return pd.concat([stats, marks.assign(lo=float("nan"), hi=float("nan"), n_seeds=1)], ignore_index=True)


def _r2_curves_data(df: pd.DataFrame, spec: R2Curves, ctx: RunContext) -> pd.DataFrame:
    cols = ["facet", "color", "series", "metric", "x", "mean", "lo", "hi", "n_seeds", "ended"]
    x = spec.x
    metrics = metric_columns(df, spec.y)
    if df.empty or not metrics or x not in df.columns:
        return pd.DataFrame(columns=cols)
    axes = axes_in(df, ctx)
    color_axes = [a for a in spec.color if a in axes]
    facet_axes = [a for a in spec.facet if a in axes]
    frames = []
    for metric in metrics:
        sub = df[df[metric].notna()]
        if sub.empty:
            continue
        band = seed_ci if spec.band == "ci95" else seed_stats  # lo/hi: the 95 % interval, or min and max
        stats = band(sub, [*axes, x], metric).rename(columns={x: "x"}).assign(ended="")
        stats = _with_ended_marks(stats, df, axes, x, metric)
        stats["metric"] = metric
        stats["series"] = stats.apply(lambda r: point_label({a: r[a] for a in axes}), axis=1)
        if len(metrics) > 1:
            label = metric_label(metric)
            stats["series"] = stats["series"].map(lambda s, m=label: f"{s} · {m}" if s != "all trials" else m)
        stats["color"] = (
            stats.apply(lambda r: group_key(r, color_axes), axis=1)
            if color_axes
            else (metric_label(metric) if len(metrics) > 1 else stats["series"])
        )
        stats["facet"] = stats.apply(lambda r: group_key(r, facet_axes), axis=1) if facet_axes else ""
        frames.append(stats[cols])
    if not frames:
        return pd.DataFrame(columns=cols)
    out = pd.concat(frames, ignore_index=True)
    return out.sort_values(["facet", "series", "ended", "x"], key=natural_col, kind="stable").reset_index(drop=True)


def _draw_curves(
    data: pd.DataFrame,
    spec: PanelSpec,
    *,
    x_title: str,
    y_title: str,
    log_x=False,
    log_y=False,
    y_range: list[float] | None = None,
) -> go.Figure:
    facets = sorted_unique(data["facet"]) if not data.empty else [""]
    fig, where = make_facets([f for f in facets], shared_yaxes=True)
    colors = palette(sorted(sorted_unique(data["color"]), key=lambda v: sort_key(label_value(v))))
    shown: set[str] = set()
    marks = data[data["ended"] != ""]
    data = data[data["ended"] == ""]
    for (facet, series), g in data.groupby(["facet", "series"], sort=False):
        row, col = where[facet]
        c = colors.get(g["color"].iloc[0], "#444")
        legend = str(g["color"].iloc[0])
        g_band = g[g["n_seeds"].gt(1) & g["lo"].notna() & g["hi"].notna()]  # no band where one seed
        if not g_band.empty:
            xs = list(g_band["x"])
            fig.add_trace(
                go.Scatter(
                    x=xs + xs[::-1],
                    y=list(g_band["hi"]) + list(g_band["lo"])[::-1],
                    fill="toself",
                    fillcolor=rgba(c, 0.18),
                    line={"width": 0},
                    hoverinfo="skip",
                    showlegend=False,
                    legendgroup=legend,
                ),
                row=row,
                col=col,
            )
        fig.add_trace(
            go.Scatter(
                x=g["x"],
                y=g["mean"],
                mode=trace_mode(len(g)),
                marker={"size": 5},
                line={"color": c, "width": 2},
                name=legend,
                legendgroup=legend,
                showlegend=legend not in shown,
                hovertext=series,
                hovertemplate="%{hovertext}<br>x=%{x}<br>y=%{y:.4f}<extra></extra>",
            ),
            row=row,
            col=col,
        )
        shown.add(legend)
    add_ended_marks(fig, marks, where)
    fig = finish(fig, spec, x=x_title, y=y_title, log_x=log_x, log_y=log_y)
    if y_range:
        fig.update_yaxes(range=y_range)
    return fig


def _r2_curves_draw(data: pd.DataFrame, spec: R2Curves, ctx: RunContext) -> go.Figure:
    if data.empty:
        return empty_figure(spec, f"no {', '.join(spec.y)} reported yet")
    metrics = sorted_unique(data["metric"])
    metric_names = metric_label(metrics[0]) if len(metrics) == 1 else "value (legend: metric)"
    y_range = [-0.05, 1.05] if all(str(m).startswith(("r2", "mcc")) for m in data["metric"].unique()) else None
    return _draw_curves(
        data,
        spec,
        x_title=spec.x,
        y_title=f"{metric_names} (mean over seeds; band: {'95 % CI' if spec.band == 'ci95' else 'min–max'})",
        log_x=spec.log_x,
        y_range=y_range,
    )


# --------------------------------------------------------------------------- lambda_hat_curves (Fig. 2D, 3C/D, 11B/C)
def _truth(cfg: RunConfig, member: int) -> tuple[list[float], str]:
    if cfg.loss == "tricl":
        return [], ""
    lams = cfg.lambda_ensemble
    if cfg.lambda_negative is not None:
        return cfg.lambda_optimum, "Λ⁺ − Λ⁻"
    true = lams[member] if member < len(lams) else lams[0]
    return list(true), "Λ" if len(lams) == 1 else f"Λ{member + 1}"


def _lambda_hat_data(df: pd.DataFrame, spec: LambdaHatCurves, ctx: RunContext) -> pd.DataFrame:
    cols = ["facet", "trial_id", "member", "dim", "kind", "truth", "x", "value"]
    hat_cols = [c for c in df.columns if parse_lambda_hat(c) is not None]
    if df.empty or not hat_cols:
        return pd.DataFrame(columns=cols)
    axes = axes_in(df, ctx)
    facet_axes = [a for a in spec.facet if a in axes] or axes
    # one trial per facet (the lowest seed that finished): Λ̂ of different seeds would not be comparable dimension
    # by dimension; where no trial of a facet finished, its title names the one shown and why it did not
    stopped = unfinished_trials(df)
    fin = final_rows(df)
    fin = fin.assign(
        facet=fin.apply(lambda r: group_key(r, facet_axes), axis=1),
        stopped=fin["trial_id"].astype(str).map(lambda t: stopped.get(t, "")),
    )
    fin = fin.sort_values("seed", key=natural_col, kind="stable")
    chosen = fin.sort_values("stopped", key=lambda s: s != "", kind="stable").drop_duplicates("facet")  # finished first
    chosen = chosen.assign(
        facet=[
            " · ".join(p for p in (facet, f"{trial} {why}") if p) if why else facet
            for facet, trial, why in zip(chosen["facet"], chosen["trial_id"], chosen["stopped"])
        ]
    )
    chosen = chosen.sort_values("facet", key=natural_col, kind="stable").head(spec.max_facets)
    x = spec.x
    rows = []
    for _, trial in chosen.iterrows():
        tdf = df[df["trial_id"] == trial["trial_id"]]
        members: set[int] = set()
        for c in hat_cols:
            k, i = parse_lambda_hat(c)
            member = k if k is not None else 0
            sub = tdf[["trial_id", x, c]].dropna()
            if sub.empty:
                continue
            members.add(member)
            for xv, v in zip(sub[x], sub[c]):
                rows.append(
                    {
                        "facet": trial["facet"],
                        "trial_id": trial["trial_id"],
                        "member": member,
                        "dim": int(i),
                        "kind": "learned",
                        "truth": "",
                        "x": xv,
                        "value": float(v),
                    }
                )
        cfg = ctx.configs.get(trial["trial_id"])
        if cfg is None or tdf.empty:
            continue
        for member in sorted(members):
            values, what = _truth(cfg, member)
            for v in sorted(set(values)):
                for xv in (tdf[x].min(), tdf[x].max()):
                    rows.append(
                        {
                            "facet": trial["facet"],
                            "trial_id": trial["trial_id"],
                            "member": member,
                            "dim": -1,
                            "kind": "true",
                            "truth": what,
                            "x": xv,
                            "value": float(v),
                        }
                    )
    if not rows:
        return pd.DataFrame(columns=cols)
    return pd.DataFrame(rows, columns=cols)


def _lambda_hat_draw(data: pd.DataFrame, spec: LambdaHatCurves, ctx: RunContext) -> go.Figure:
    if data.empty:
        return empty_figure(spec, "no learned Λ̂ reported (fixed or absent for this loss)")
    facets = list(dict.fromkeys(data["facet"]))
    fig, where = make_facets(facets)
    dims = sorted_unique(data.loc[data["kind"] == "learned", "dim"])
    colors = palette([f"dim {d}" for d in dims] if len(dims) <= 2 else dims)
    dash_by_member = ["solid", "dash", "dot", "dashdot"]
    shown: set[str] = set()
    for (facet, member, dim, kind), g in data.groupby(["facet", "member", "dim", "kind"], sort=False):
        row, col = where[facet]
        if kind == "true":
            for v, gv in g.groupby("value"):
                name = f"true {gv['truth'].iloc[0]}"
                fig.add_trace(
                    go.Scatter(
                        x=gv["x"],
                        y=gv["value"],
                        mode="lines",
                        name=name,
                        legendgroup="true",
                        showlegend=name not in shown,
                        line={"color": "black", "dash": "dash", "width": 1.5},
                        hovertemplate=f"{name} = {v:g}<extra></extra>",
                    ),
                    row=row,
                    col=col,
                )
                shown.add(name)
            continue
        key = dim if len(dims) > 2 else f"dim {dim}"
        name = f"Λ̂{member + 1 if data['member'].max() > 0 else ''} dim {dim}"
        fig.add_trace(
            go.Scatter(
                x=g["x"],
                y=g["value"],
                mode=trace_mode(len(g)),
                name=name,
                legendgroup=name,
                showlegend=name not in shown,
                line={"color": colors.get(key, "#444"), "dash": dash_by_member[member % 4]},
            ),
            row=row,
            col=col,
        )
        shown.add(name)
    return finish(fig, spec, x=spec.x, y="Λ̂ (learned concentration)", log_y=spec.log_y)


# --------------------------------------------------------------------------- loss_vs_floor (Fig. 2C)
def _loss_floor_data(df: pd.DataFrame, spec: LossVsFloor, ctx: RunContext) -> pd.DataFrame:
    cols = ["facet", "color", "series", "kind", "x", "mean", "lo", "hi", "n_seeds", "ended"]
    loss, x = spec.loss, spec.x
    if df.empty or loss not in df.columns or x not in df.columns:
        return pd.DataFrame(columns=cols)
    axes = axes_in(df, ctx)
    facet_axes = [a for a in spec.facet if a in axes]
    color_axes = [a for a in spec.color if a in axes]
    frames = []
    for kind, column in (("loss", loss), ("floor", "loss_floor")):
        if column not in df.columns:
            continue
        sub = df[df[column].notna()]
        if sub.empty:
            continue
        stats = seed_stats(sub, [*axes, x], column).rename(columns={x: "x"}).assign(ended="")
        if kind == "loss":
            stats = _with_ended_marks(stats, df, axes, x, column)
        stats["kind"] = kind
        stats["series"] = stats.apply(lambda r: point_label({a: r[a] for a in axes}), axis=1)
        stats["color"] = stats.apply(lambda r: group_key(r, color_axes), axis=1) if color_axes else stats["series"]
        stats["facet"] = stats.apply(lambda r: group_key(r, facet_axes), axis=1) if facet_axes else ""
        frames.append(stats[cols])
    if not frames:
        return pd.DataFrame(columns=cols)
    out = pd.concat(frames, ignore_index=True)
    out = out.sort_values(["facet", "series", "kind", "ended", "x"], key=natural_col, kind="stable")
    return out.reset_index(drop=True)


def _loss_floor_draw(data: pd.DataFrame, spec: LossVsFloor, ctx: RunContext) -> go.Figure:
    if data.empty:
        return empty_figure(spec, f"no {spec.loss} reported yet")
    facets = sorted_unique(data["facet"])
    fig, where = make_facets(facets, shared_yaxes=True)
    colors = palette(sorted(sorted_unique(data["color"]), key=lambda v: sort_key(label_value(v))))
    shown: set[str] = set()
    marks = data[data["ended"] != ""]
    data = data[data["ended"] == ""]
    for (facet, series, kind), g in data.groupby(["facet", "series", "kind"], sort=False):
        row, col = where[facet]
        color = str(g["color"].iloc[0])
        name = f"{color} · {'loss' if kind == 'loss' else 'floor (ẑ = z, Λ̂ = Λ)'}"
        fig.add_trace(
            go.Scatter(
                x=g["x"],
                y=g["mean"],
                mode=trace_mode(len(g)),
                name=name,
                legendgroup=name,
                showlegend=name not in shown,
                hovertext=series,
                line={"color": colors.get(color, "#444"), "dash": "solid" if kind == "loss" else "dash"},
                hovertemplate="%{hovertext}<br>x=%{x}<br>%{y:.4f}<extra></extra>",
            ),
            row=row,
            col=col,
        )
        shown.add(name)
    add_ended_marks(fig, marks, where)
    return finish(
        fig,
        spec,
        x=spec.x,
        y=f"{spec.loss} (solid) and its floor (dashed)",
        log_y=spec.log_y,
    )


# --------------------------------------------------------------------------- registry
register(
    PanelKind(
        "r2_curves",
        "R² during training",
        "R² (or another reported metric) against iterations: one line per grid point, the mean over seeds with a "
        "band (min–max, or the 95 % t interval of the mean: band: ci95), coloured and faceted by grid axes.",
        _r2_curves_data,
        _r2_curves_draw,
        R2Curves,
    )
)

register(
    PanelKind(
        "lambda_hat_curves",
        "Learned Λ̂ during training",
        "Each learned concentration Λ̂ᵢ against iterations for one seed of each grid point, with the true Λ "
        "(or Λ⁺ − Λ⁻ with hard negatives) dashed.",
        _lambda_hat_data,
        _lambda_hat_draw,
        LambdaHatCurves,
    )
)

register(
    PanelKind(
        "loss_vs_floor",
        "Loss against its floor",
        "The loss on fresh batches against the floor reached by the true latents with the true Λ (the global "
        "minimum), mean over seeds.",
        _loss_floor_data,
        _loss_floor_draw,
        LossVsFloor,
    )
)
