"""Is a difference between the levels of one axis larger than seed noise? Intervals over seeds.

Everything here is numpy, pandas and scipy.stats on the tidy table of :func:`ablate.analysis.results.load_results` (or
:func:`ablate.analysis.run.load_run`'s ``df``): one value per trial (its final report, or its report at one step),
grouped by grid point. The papers' claims compare variants over a few seeds; :func:`compare` says, for each pair
of levels of one axis at every combination of the other axes, how far apart the seed means are and how sure that is:

- Welch's t interval of the difference of means (unequal variances; ``scipy.stats.ttest_ind``), which needs at
  least 2 seeds per side; it decides the verdict, since it stays honest at a few seeds;
- a percentile bootstrap interval over seeds (``scipy.stats.bootstrap``: each side resampled on its own,
  ``N_BOOT`` resamples from a fixed seed, so the output is reproducible), also only with at least 2 seeds per side: a resample of one value has no
  spread, and its interval would read as certainty.

With fewer seeds the verdict says so (``n=1: too few seeds to tell``) and no interval is given: it never reads as
a difference.

At ``final``, only trials that finished are compared: an errored, interrupted or running trial's last report is at
another step than a finished one's, so it is left out, and the table says which and why (``attrs["left_out"]``,
:func:`ablate.analysis.finished.unfinished_trials`, the rule the claims and the report share). At a step, every
trial that reported there is compared.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from ablate.analysis.finished import finished_only, unfinished_trials
from ablate.analysis.run import final_rows
from ablate.service.records.rundir import RunError
from ablate.service.specs.grids import natural_key

__all__ = [
    "BOOT_SEED",
    "LEVEL",
    "N_BOOT",
    "CompareError",
    "bootstrap_interval",
    "compare",
    "diff_text",
    "difference",
    "mean_interval",
    "point_table",
    "running_values",
    "seed_ci",
    "unfinished_trials",
    "values_at",
    "welch_interval",
]

#: Confidence level of every interval.
LEVEL = 0.95
#: Bootstrap resamples per comparison ...
N_BOOT = 10_000
#: ... drawn from this seed (the same for every pair, so a pair's interval does not depend on the others).
BOOT_SEED = 0
#: Fewer seeds than this on either side: no interval, and the verdict says the seeds are too few.
MIN_SEEDS = 2


class CompareError(RunError):
    """A comparison cannot be made as asked (an unknown axis, metric or step); the message says what is allowed."""


def _finite(values: Iterable[Any]) -> np.ndarray:
    v = np.asarray([x for x in values if x is not None], dtype=float)
    return v[np.isfinite(v)]


def mean_interval(values: Iterable[Any], level: float = LEVEL) -> tuple[float, float, float, int]:
    """Mean, Student's t interval of the mean (lo, hi) and count of the finite values; lo/hi are nan below 2."""
    v = _finite(values)
    if v.size == 0:
        return math.nan, math.nan, math.nan, 0
    m = float(v.mean())
    if v.size < MIN_SEEDS:
        return m, math.nan, math.nan, int(v.size)
    half = float(stats.t.ppf(0.5 + level / 2, v.size - 1)) * float(v.std(ddof=1)) / math.sqrt(v.size)
    return m, m - half, m + half, int(v.size)


def welch_interval(a: Iterable[Any], b: Iterable[Any], level: float = LEVEL) -> tuple[float, float, float, float]:
    """Welch's t interval of mean(a) − mean(b): (lo, hi, degrees of freedom, two-sided p), from
    ``scipy.stats.ttest_ind(a, b, equal_var=False)``.

    All nan with fewer than 2 finite values on either side, or with no spread on both sides (no standard error).
    """
    a, b = _finite(a), _finite(b)
    if a.size < MIN_SEEDS or b.size < MIN_SEEDS or not (a.var() + b.var()) > 0:
        return math.nan, math.nan, math.nan, math.nan
    result = stats.ttest_ind(a, b, equal_var=False)
    ci = result.confidence_interval(level)
    return float(ci.low), float(ci.high), float(result.df), float(result.pvalue)


def bootstrap_interval(
    a: Iterable[Any], b: Iterable[Any], level: float = LEVEL, n_boot: int = N_BOOT, seed: int = BOOT_SEED
) -> tuple[float, float]:
    """Percentile bootstrap interval of mean(a) − mean(b), each side resampled with replacement on its own
    (``scipy.stats.bootstrap``, ``method="percentile"``).

    Reproducible (``seed``); (nan, nan) with fewer than 2 finite values on either side; the difference itself when
    neither side has any spread (every resample gives it).
    """
    a, b = _finite(a), _finite(b)
    if a.size < MIN_SEEDS or b.size < MIN_SEEDS:
        return math.nan, math.nan
    if not (a.var() + b.var()) > 0:
        diff = float(a.mean() - b.mean())
        return diff, diff
    ci = stats.bootstrap(
        (a, b),
        lambda x, y, axis=-1: np.mean(x, axis=axis) - np.mean(y, axis=axis),
        n_resamples=n_boot,
        confidence_level=level,
        method="percentile",
        random_state=np.random.default_rng(seed),
    ).confidence_interval
    return float(ci.low), float(ci.high)


def difference(
    a: Iterable[Any],
    b: Iterable[Any],
    name_a: str = "a",
    name_b: str = "b",
    level: float = LEVEL,
    n_boot: int = N_BOOT,
    seed: int = BOOT_SEED,
) -> dict[str, Any]:
    """mean(a) − mean(b) with both intervals and a verdict (the verdict reads Welch's interval).

    Keys: n_a, n_b, mean_a, mean_b, diff, welch_lo, welch_hi, welch_df, welch_p, boot_lo, boot_hi, verdict. The
    verdict is ``"<a> > <b>"`` or ``"<a> < <b>"`` where Welch's interval excludes 0, ``"no clear difference"`` where
    it holds 0, ``"n=<k>: too few seeds to tell"`` below 2 seeds on a side, and ``"no spread between seeds: cannot
    tell"`` where every seed of both sides gave the same value.
    """
    va, vb = _finite(a), _finite(b)
    n_a, n_b = int(va.size), int(vb.size)
    mean_a = float(va.mean()) if n_a else math.nan
    mean_b = float(vb.mean()) if n_b else math.nan
    w_lo, w_hi, dof, p = welch_interval(va, vb, level)
    b_lo, b_hi = bootstrap_interval(va, vb, level, n_boot, seed)
    if min(n_a, n_b) < MIN_SEEDS:
        verdict = f"n={min(n_a, n_b)}: too few seeds to tell"
    elif math.isnan(w_lo):
        verdict = "no spread between seeds: cannot tell"
    elif w_lo > 0:
        verdict = f"{name_a} > {name_b}"
    elif w_hi < 0:
        verdict = f"{name_a} < {name_b}"
    else:
        verdict = "no clear difference"
    return {
        "n_a": n_a,
        "n_b": n_b,
        "mean_a": mean_a,
        "mean_b": mean_b,
        "diff": mean_a - mean_b,
        "welch_lo": w_lo,
        "welch_hi": w_hi,
        "welch_df": dof,
        "welch_p": p,
        "boot_lo": b_lo,
        "boot_hi": b_hi,
        "verdict": verdict,
    }


def diff_text(a: Iterable[Any], b: Iterable[Any], name_a: str, name_b: str, digits: int = 3) -> str:
    """One line for a claim's value: ``AnInfoNCE − InfoNCE = +0.120, 95 % CI [+0.050, +0.190] (Welch, 3 vs 3
    seeds): AnInfoNCE > InfoNCE``; with too few seeds, no interval and ``n=1: too few seeds to tell``."""
    d = difference(a, b, name_a, name_b)
    head = f"{name_a} − {name_b} = {d['diff']:+.{digits}f}"
    if math.isnan(d["welch_lo"]):
        return f"{head} ({d['verdict']})"
    ci = f"{d['welch_lo']:+.{digits}f}, {d['welch_hi']:+.{digits}f}"
    return f"{head}, {LEVEL * 100:g} % CI [{ci}] (Welch, {d['n_a']} vs {d['n_b']} seeds): {d['verdict']}"


def values_at(df: pd.DataFrame, metric: str, at: str | int = "final") -> pd.DataFrame:
    """One row per trial: its final report (``at="final"``) or its report at step ``at``, with ``metric`` finite.

    Raises :class:`CompareError` for a metric the table lacks, a bad ``at``, or a step no trial reported at.
    """
    numeric = [c for c in df.columns if pd.api.types.is_numeric_dtype(df[c]) and c not in ("seed",)]
    if metric not in df.columns:
        shown = ", ".join(sorted(numeric)[:20]) or "(the run has no reports yet)"
        raise CompareError(f"--metric {metric}: not a column of the run's results; numeric columns: {shown}")
    if at == "final" or df.empty:
        rows = final_rows(df)
    else:
        try:
            step = int(at)
        except (TypeError, ValueError):
            raise CompareError(f"--at {at!r}: expected 'final' or a step (an integer)") from None
        rows = df[df["step"] == step] if "step" in df.columns else df.iloc[0:0]
        if rows.empty:
            steps = sorted({int(s) for s in df["step"].dropna()}) if "step" in df.columns else []
            near = ", ".join(map(str, steps[:12])) + (" …" if len(steps) > 12 else "")
            raise CompareError(f"--at {step}: no trial reported at step {step}; reported steps: {near or 'none'}")
        rows = rows.drop_duplicates("trial_id", keep="last")
    rows = rows[pd.to_numeric(rows[metric], errors="coerce").map(lambda v: v is not None and np.isfinite(v))]
    return rows.reset_index(drop=True)


def compare(
    df: pd.DataFrame,
    by: str,
    metric: str = "r2",
    at: str | int = "final",
    axes: list[str] | None = None,
    level: float = LEVEL,
    n_boot: int = N_BOOT,
    seed: int = BOOT_SEED,
) -> pd.DataFrame:
    """Each pair of levels (a, b) of axis ``by`` at every combination of the other axes: mean(a) − mean(b) of
    ``metric`` over seeds, with Welch's and the bootstrap interval and a verdict (:func:`difference`).

    ``axes`` defaults to ``df.attrs['axes']`` (the run's grid axes). Levels are paired in natural order (a
    before b). Columns: the other axes, ``a``, ``b``, then :func:`difference`'s keys; ``attrs`` hold ``by``,
    ``metric``, ``at``, ``level`` and ``left_out`` (at ``final``: the trials that did not finish, left out, with
    why: :func:`unfinished_trials`). Raises :class:`CompareError` for an unknown axis, metric or step.
    """
    axes = list(axes if axes is not None else df.attrs.get("axes") or [])
    if by not in axes or by not in df.columns:
        raise CompareError(f"--by {by}: not an axis of the run; axes: {', '.join(axes) or '(the run has none)'}")
    left_out = unfinished_trials(df) if at == "final" else {}
    if at == "final":
        df = finished_only(df)
    rows = values_at(df, metric, at)
    others = [a for a in axes if a != by and a in rows.columns]
    records = []
    groups = rows.groupby(others, dropna=False, sort=False) if others else [((), rows)]
    for key, sub in groups:
        key = key if isinstance(key, tuple) else (key,)
        point = dict(zip(others, key))
        by_level = dict(sorted(sub.groupby(by, dropna=False, sort=False)[metric], key=lambda kv: natural_key(kv[0])))
        for la, lb in itertools.combinations(by_level, 2):
            d = difference(by_level[la], by_level[lb], str(la), str(lb), level, n_boot, seed)
            records.append({**point, "a": la, "b": lb, **d})
    cols = [*others, "a", "b", *difference([], [], level=level).keys()]
    out = pd.DataFrame(records, columns=cols)
    if not out.empty:
        out = out.sort_values([*others, "a", "b"], key=lambda s: s.map(natural_key), kind="stable")
    out = out.reset_index(drop=True)
    out.attrs.update({"by": by, "metric": metric, "at": at, "level": level, "n_boot": n_boot, "seed": seed})
    out.attrs["left_out"] = left_out
    return out


def seed_ci(df: pd.DataFrame, keys: list[str], value: str, level: float = LEVEL) -> pd.DataFrame:
    """Mean, Student's t interval of the mean (``lo``, ``hi``; nan below 2 seeds) and count (``n_seeds``) of
    ``value`` over the rows sharing ``keys`` (the columns of :func:`ablate.analysis.stats.seed_stats`)."""
    g = df.groupby(keys, dropna=False, sort=False)[value]
    out = g.agg(mean="mean", sd="std", n_seeds="count").reset_index()
    n = out["n_seeds"].to_numpy(dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.where(n >= MIN_SEEDS, stats.t.ppf(0.5 + level / 2, np.maximum(n - 1, 1)), np.nan)
        half = q * out["sd"].to_numpy(dtype=float) / np.sqrt(n)
    out["lo"], out["hi"] = out["mean"] - half, out["mean"] + half
    return out[[*keys, "mean", "lo", "hi", "n_seeds"]]


def running_values(df: pd.DataFrame, metric: str = "r2") -> pd.DataFrame:
    """The latest report with a finite ``metric`` of each trial still running (status RUNNING): one row per trial,
    as the table holds it. Not a final value (:mod:`ablate.analysis.finished`): shown beside final values, never
    pooled with them."""
    if df.empty or "status" not in df.columns or metric not in df.columns:
        return df.iloc[0:0]
    live = df[df["status"].astype(str).eq("RUNNING") & pd.to_numeric(df[metric], errors="coerce").notna()]
    return final_rows(live)


def _running_text(rows: pd.DataFrame, metric: str) -> str:
    """``0.4312 (running at step 500)`` for each of ``rows`` (:func:`running_values`), joined by ``; ``."""
    steps = rows["step"] if "step" in rows.columns else pd.Series(math.nan, index=rows.index)
    return "; ".join(
        f"{float(v):.4f} (running" + (f" at step {int(s)})" if pd.notna(s) else ")")
        for v, s in zip(rows[metric], steps)
    )


def point_table(df: pd.DataFrame, axes: list[str], metric: str = "r2", level: float = LEVEL) -> pd.DataFrame:
    """One row per grid point: its axes, the count of its finished seeds, and their final ``metric`` as mean with
    its interval. Trials that did not finish are left out of these (:func:`ablate.analysis.finished.finished_only`),
    named with why in ``attrs["left_out"]``. While trials run, a column ``running`` shows each running trial's latest
    ``metric`` with its step (:func:`running_values`), beside the mean, never in it; a point none of whose trials
    finished yet has a row with 0 seeds and no mean.

    Columns: the axes, ``seeds``, ``mean``, ``ci`` (``[lo, hi]``, or ``n=1: too few seeds`` below 2 seeds), and
    ``running`` (``0.4312 (running at step 500)``, ``; ``-separated) while any trial runs.
    """
    cols = [*axes, "seeds", "mean", "ci"]
    left_out = unfinished_trials(df)
    if df.empty or metric not in df.columns:
        out = pd.DataFrame(columns=cols)
        out.attrs["left_out"] = left_out
        return out
    parts = [
        values_at(finished_only(df), metric).assign(_running=False),
        running_values(df, metric).assign(_running=True),
    ]
    rows = pd.concat([p for p in parts if not p.empty] or parts[:1])
    keys = [a for a in axes if a in rows.columns]
    live = bool(rows["_running"].any())
    records = []
    for key, sub in rows.groupby(keys, dropna=False, sort=False) if keys else [((), rows)]:
        key = key if isinstance(key, tuple) else (key,)
        done, running = sub[~sub["_running"]], sub[sub["_running"]]
        m, lo, hi, n = mean_interval(done[metric], level)
        ci = f"[{lo:.4f}, {hi:.4f}]" if n >= MIN_SEEDS else ("" if n == 0 else f"n={n}: too few seeds")
        record = {**dict(zip(keys, key)), "seeds": n, "mean": round(m, 4), "ci": ci}
        if live:
            record["running"] = _running_text(running, metric)
        records.append(record)
    out = pd.DataFrame(records, columns=[*keys, "seeds", "mean", "ci", *(["running"] if live else [])])
    if keys:
        out = out.sort_values(keys, key=lambda s: s.map(natural_key), kind="stable").reset_index(drop=True)
    out.attrs["left_out"] = left_out
    return out
