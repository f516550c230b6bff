"""Claims: the result types and the helpers every claim uses (verdicts, seed means, not-measured checks).

A criterion the data cannot decide (a metric missing, a target never reached by any setting) is
"not measured" (``passed is None``), never a pass.

A claim reads only the trials that finished (:mod:`ablate.analysis.finished`): the last report of a trial that
errored, was interrupted, is still running or was stopped early by a search's scheduler is not a final value. Its
criteria stay as they are. Each claim declares the trials it reads (:func:`reads`: the variants and grid points it
is decided on; every trial of the run by default); it is given only those, and the ones among them that did not
finish are named in :attr:`ClaimResult.left_out` (set by :func:`ablate.analysis.claims.evaluate.evaluate_frame`).
A claim that lost the data it needs to them is not measured, as for any missing data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from ablate.analysis.run import RunContext
from ablate.analysis.stats import spearman
from ablate.columns import r2_block_lambda

__all__ = [
    "ITT_TARGETS",
    "Check",
    "ClaimFn",
    "ClaimResult",
    "Scope",
    "claim_scope",
    "every_trial",
    "reads",
    "trials_of",
    "variants",
]

#: Target R² values of the iterations-to-target checks (the batch_vs_dim dashboard's Fig. 9B targets).
ITT_TARGETS = (0.5, 0.7, 0.8, 0.9)


# --------------------------------------------------------------------------- result types
@dataclass
class Check:
    """One criterion of a claim: what was measured, the rule, and whether it held (None = not measured)."""

    name: str
    value: str
    criterion: str
    passed: bool | None


@dataclass
class ClaimResult:
    """The verdict on one claim for one run."""

    claim: int
    title: str
    figure: str
    paper_value: str
    value: str
    checks: list[Check]
    details: dict[str, Any] = field(default_factory=dict)
    grid: str = ""
    scale: str = ""
    run_dir: str = ""
    wall_s: float | None = None
    preset: str | None = None
    #: trial id → why it did not finish (``errored at step 7``), for each trial this claim reads (:func:`reads`)
    #: that it was not decided on.
    left_out: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool | None:
        """False if any check failed; None if none failed but one was not measured; True otherwise."""
        verdicts = [c.passed for c in self.checks]
        if not verdicts or any(v is None for v in verdicts) and all(v is not False for v in verdicts):
            return None
        return all(verdicts)

    @property
    def status(self) -> str:
        """PASS, FAIL or NOT MEASURED."""
        return {True: "PASS", False: "FAIL", None: "NOT MEASURED"}[self.passed]

    @property
    def criterion(self) -> str:
        """Every check's rule, joined."""
        return "; ".join(c.criterion for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (with ``passed`` and ``status``)."""
        return {**asdict(self), "passed": self.passed, "status": self.status}


#: A claim: the run's table and context in, its verdict out.
ClaimFn = Callable[[pd.DataFrame, RunContext], ClaimResult]
#: The rows of a run's table a claim reads: every report of each trial it is decided on.
Scope = Callable[[pd.DataFrame, RunContext], pd.DataFrame]


# --------------------------------------------------------------------------- which trials a claim reads
def every_trial(df: pd.DataFrame, ctx: RunContext) -> pd.DataFrame:
    """The scope of a claim decided on every trial of its run: the whole table."""
    return df


def trials_of(df: pd.DataFrame, trial_ids: Iterable[Any]) -> pd.DataFrame:
    """Every row of the trials ``trial_ids`` (``attrs`` kept)."""
    out = df[df["trial_id"].isin(set(trial_ids))] if "trial_id" in df.columns else df.iloc[0:0]
    out.attrs.update(df.attrs)
    return out


def variants(*names: str) -> Scope:
    """The scope of a claim decided on the trials of these variants (none in a table without a variant column,
    where :func:`_variant` finds none either)."""

    def scope(df: pd.DataFrame, ctx: RunContext) -> pd.DataFrame:
        if "variant" not in df.columns:
            return trials_of(df, [])
        return trials_of(df, df.loc[df["variant"].isin(names), "trial_id"])

    return scope


def reads(scope: Scope) -> Callable[[ClaimFn], ClaimFn]:
    """Declare the rows a claim reads (``scope``): :func:`ablate.analysis.claims.evaluate.evaluate_frame` gives it
    only those and names the trials among them that did not finish. Without it, a claim reads every trial."""

    def mark(fn: ClaimFn) -> ClaimFn:
        fn.reads = scope  # type: ignore[attr-defined]
        return fn

    return mark


def claim_scope(fn: ClaimFn) -> Scope:
    """The rows ``fn`` reads (:func:`reads`), :func:`every_trial` when it declares none."""
    return getattr(fn, "reads", every_trial)


# --------------------------------------------------------------------------- helpers
def _sign_ok(rho: float, sign: int) -> bool | None:
    return None if math.isnan(rho) else bool(rho * sign > 0)


def _all_or_none(verdicts: list[bool | None]) -> bool | None:
    """False if any is False; None if none was decided; else True."""
    if any(v is False for v in verdicts):
        return False
    return True if any(v is True for v in verdicts) else None


def _seed_means(fin: pd.DataFrame, keys: list[str], metric: str) -> pd.DataFrame:
    """Mean, sd and count of ``metric`` over seeds for each combination of ``keys``."""
    g = fin.groupby(keys, dropna=False, sort=True)[metric]
    return g.agg(mean="mean", sd="std", n="count").reset_index()


def _missing(df: pd.DataFrame, *cols: str) -> list[str]:
    return [c for c in cols if c not in df.columns or not df[c].notna().any()]


def _not_measured(name: str, criterion: str, why: str) -> Check:
    return Check(name, f"not measured: {why}", criterion, None)


def _groupwise_sign(
    fin: pd.DataFrame, group: str, x: str, metric: str, sign: int, name: str, criterion: str
) -> tuple[Check, dict[str, float]]:
    """Spearman(x, seed-mean metric) within every value of ``group``; the check holds if each has ``sign``."""
    miss = _missing(fin, group, x, metric)
    if miss:
        return _not_measured(name, criterion, f"no {', '.join(miss)} in the results"), {}
    means = _seed_means(fin, [group, x], metric)
    rhos = {str(g): spearman(sub[x], sub["mean"]) for g, sub in means.groupby(group, sort=True)}
    verdict = _all_or_none([_sign_ok(r, sign) for r in rhos.values()])
    text = ", ".join(f"{group}={g}: ρ={r:+.2f}" for g, r in rhos.items())
    return Check(name, text, criterion, verdict), rhos


def _block_lambdas(df: pd.DataFrame) -> list[float]:
    """The Λ values with a per-block R² column (r2_lambda_<Λ>), ascending."""
    return sorted(lam for c in df.columns if (lam := r2_block_lambda(c)) is not None and df[c].notna().any())


def _pct(fraction: float) -> str:
    """A threshold given as a fraction, in a criterion's text: 0.02 → ``2 %``."""
    return f"{fraction * 100:g} %"


def _paper_values(ctx: RunContext, grid: str) -> dict:
    """The paper's numbers from the grid's ``paper_values`` (their one home): the run's stored grid, else the
    shipped grid file (a run made before its grid had them)."""
    if ctx.paper_values:
        return ctx.paper_values
    from ablate.service.specs.grids import GridError, load_grid

    try:
        return load_grid(grid, "smoke").paper_values
    except GridError:
        return {}


def _variant(fin: pd.DataFrame, name: str) -> pd.DataFrame:
    return fin[fin["variant"] == name] if "variant" in fin.columns else fin.iloc[0:0]
