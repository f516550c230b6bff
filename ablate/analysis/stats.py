"""Statistics over a run's tidy table: means over seeds, rank correlations, and the per-trial tables that both
the claims and the report's panels read (per-block R², loss at a fixed Λ̂).

Everything here is pure pandas on :func:`ablate.analysis.results.load_results`'s table plus the trials'
configs (:class:`ablate.analysis.run.RunContext`). Columns hold values, never display labels, so a panel may
label them as it likes without changing what a claim measures.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from ablate.analysis.finished import final_values, finished_only
from ablate.analysis.run import RunContext
from ablate.columns import r2_block_column
from ablate.core.metrics import iterations_to_target

__all__ = [
    "block_r2",
    "fixed_lambda_losses",
    "iterations_to_targets",
    "fmt_ms",
    "mean_sd",
    "scalar",
    "seed_stats",
    "spearman",
]


def seed_stats(df: pd.DataFrame, keys: list[str], value: str) -> pd.DataFrame:
    """Mean, min (``lo``), max (``hi``) and count (``n_seeds``) of ``value`` over the rows sharing ``keys``."""
    g = df.groupby(keys, dropna=False, sort=False)[value]
    return g.agg(mean="mean", lo="min", hi="max", n_seeds="count").reset_index()


def mean_sd(values: Iterable[float]) -> tuple[float, float, int]:
    """Mean, sample standard deviation (nan for one value) and count of the finite values."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    if v.size == 0:
        return math.nan, math.nan, 0
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else math.nan, int(v.size)


def fmt_ms(values: Iterable[float], digits: int = 3) -> str:
    """``0.843 ± 0.002 (3 seeds)``; ``0.378 (1 seed)``; ``n/a`` with no value."""
    m, s, n = mean_sd(values)
    if n == 0:
        return "n/a"
    if n == 1:
        return f"{m:.{digits}f} (1 seed)"
    return f"{m:.{digits}f} ± {s:.{digits}f} ({n} seeds)"


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation (ties averaged; +inf ranks highest); nan if either side is constant."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.size < 2 or np.unique(x).size < 2 or np.unique(y).size < 2:
        return math.nan
    return float(spearmanr(x, y).statistic)


def scalar(v: Any) -> float | None:
    """One number for a setting that is a number or a list of equal numbers (else None)."""
    if v is None:
        return None
    if isinstance(v, list):
        return float(v[0]) if v and len(set(v)) == 1 else None
    return float(v)


def _point(row: pd.Series, columns: list[str]) -> dict[str, Any]:
    return {c: row[c] for c in ["trial_id", *columns, "seed"] if c in row.index}


def block_r2(df: pd.DataFrame, ctx: RunContext) -> pd.DataFrame:
    """Final R² of the first and the last Λ block of each trial (Fig. 2A: Λ₁ fixed, Λ₂ varied).

    One row per trial and block: trial_id, the grid's axes, seed, ``block`` ('first' or 'last'),
    ``block_lambda`` (that block's Λ), ``varied_lambda`` (the last block's Λ, Fig. 2A's x) and ``r2``.
    Trials that did not finish (:mod:`ablate.analysis.finished`), without a config or without the block's
    ``r2_lambda_<Λ>`` column are left out.
    """
    cols = ["trial_id", *ctx.axes, "seed", "block", "block_lambda", "varied_lambda", "r2"]
    fin = final_values(df)
    rows = []
    for _, r in fin.iterrows():
        cfg = ctx.configs.get(r["trial_id"])
        if cfg is None:
            continue
        lam = cfg.lambda_true
        for block, value in (("first", lam[0]), ("last", lam[-1])):
            col = r2_block_column(value)
            if col not in fin.columns or pd.isna(r[col]):
                continue
            rows.append(
                {
                    **_point(r, ctx.axes),
                    "block": block,
                    "block_lambda": value,
                    "varied_lambda": lam[-1],
                    "r2": float(r[col]),
                }
            )
    return pd.DataFrame(rows, columns=[c for c in cols if rows and c in rows[0]] or cols)


def fixed_lambda_losses(df: pd.DataFrame, ctx: RunContext, metric: str) -> pd.DataFrame:
    """Final ``metric`` of each trial trained with Λ̂ held fixed (Fig. 10A), and where theory puts the optimum.

    One row per trial that finished (:mod:`ablate.analysis.finished`): trial_id, the grid's axes, seed,
    ``fixed_lambda``, ``value``, ``optimum`` (the mean of :attr:`ablate.config.RunConfig.lambda_optimum`: Λ⁺ − Λ⁻
    with hard negatives, Cor. B.1, else Λ) and ``hard``.
    """
    cols = ["trial_id", *ctx.axes, "seed", "fixed_lambda", "value", "optimum", "hard"]
    if df.empty or metric not in df.columns:
        return pd.DataFrame(columns=cols)
    rows = []
    for _, r in final_values(df).iterrows():
        cfg = ctx.configs.get(r["trial_id"])
        if cfg is None or cfg.fixed_lambda_hat is None or pd.isna(r[metric]):
            continue
        fixed = scalar(cfg.fixed_lambda_hat)
        if fixed is None:
            continue
        rows.append(
            {
                **_point(r, ctx.axes),
                "fixed_lambda": fixed,
                "value": float(r[metric]),
                "optimum": float(np.mean(cfg.lambda_optimum)),
                "hard": cfg.lambda_negative is not None,
            }
        )
    return pd.DataFrame(rows, columns=[c for c in cols if rows and c in rows[0]] or cols)


def iterations_to_targets(df: pd.DataFrame, axes: list[str], targets: list[float]) -> pd.DataFrame:
    """The first step at which each trial's R² reached each target (Fig. 8B, 9B); nan where it never did.

    One row per trial that finished and target: the given ``axes`` (the trial's values), trial_id, ``target``,
    ``iterations``. A trial that did not finish (:mod:`ablate.analysis.finished`) is left out: it stopped before the
    end, so "never reached" would not be known of it.
    """
    cols = [*axes, "trial_id", "target", "iterations"]
    df = finished_only(df)
    if df.empty or "r2" not in df.columns:
        return pd.DataFrame(columns=cols)
    rows = []
    for trial_id, t in df.sort_values("step").groupby("trial_id", sort=False):
        first = t.iloc[0]
        for target, it in iterations_to_target(list(t["step"]), list(t["r2"]), targets).items():
            rows.append(
                {
                    **{a: first[a] for a in axes},
                    "trial_id": trial_id,
                    "target": target,
                    "iterations": float("nan") if it is None else float(it),
                }
            )
    return pd.DataFrame(rows, columns=cols)
