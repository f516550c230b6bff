"""One run directory read for analysis: the tidy table, each trial's settings and config, and the run's grid.

:func:`load_run` is what the claims and the report read; it never reaches back into training.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ablate.analysis.results import axis_value, load_results
from ablate.config import ConfigError, RunConfig
from ablate.service.records.reader import RunReader
from ablate.service.specs.grid import DEFAULT_SCALE
from ablate.service.specs.grids import Grid, GridError, grid_from_text, load_grid, natural_key
from ablate.service.specs.params import config_from_params

__all__ = ["Run", "RunContext", "final_rows", "generator_table", "load_run", "nothing_left_to_run", "trial_table"]

#: Statuses of a trial that its run's driver has nothing left to run for: it reached its stop or its scheduler
#: stopped it (TERMINATED), or it failed (ERROR).
_ENDED = {"TERMINATED", "ERROR"}


@dataclass
class RunContext:
    """What analysis needs beyond the table: the grid's axes, each trial's config and the paper's values."""

    grid: str = ""
    axes: list[str] = field(default_factory=list)
    configs: dict[str, RunConfig] = field(default_factory=dict)
    paper_values: dict[str, Any] = field(default_factory=dict)


def final_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The last report of each trial."""
    if df.empty:
        return df
    idx = df.groupby("trial_id", sort=False)["training_iteration"].idxmax()
    return df.loc[idx.values].reset_index(drop=True)


@dataclass
class Run:
    """Everything a report shows of one run directory."""

    run_dir: str
    df: pd.DataFrame
    marker: dict[str, Any]
    grid: Grid | None
    params: dict[str, dict[str, Any]]
    statuses: dict[str, str]
    ctx: RunContext
    provenance: list[dict[str, Any]] = field(
        default_factory=list
    )  # what produced the run (ablate.service.records.provenance)
    left_out: list[str] = field(default_factory=list)  # trials whose params.json disagrees with the run's record
    live: bool = False  # an `ablate run` was writing the run when it was read

    @property
    def name(self) -> str:
        """The grid's name (from the run marker)."""
        return str(self.marker.get("grid", "?"))


def _grid_from_marker(marker: dict[str, Any]) -> Grid | None:
    """The run's grid at its scale, from the YAML text the run stored (so later edits do not matter)."""
    name, scale = marker.get("grid"), marker.get("scale", DEFAULT_SCALE)
    text = marker.get("grid_yaml")
    try:
        if text:
            return grid_from_text(text, scale, marker.get("grid_file") or f"{name}.yaml")
        if marker.get("grid_file") and Path(marker["grid_file"]).is_file():
            return load_grid(marker["grid_file"], scale)
    except (GridError, ConfigError):
        return None
    return None


def load_run(run_dir: str | Path, grid: str | None = None) -> Run:
    """Read a run directory (finished, running or interrupted); refuses a directory ablate did not write."""
    df = load_results(run_dir, grid)
    marker = dict(df.attrs.get("marker") or {})
    reader = RunReader(run_dir, grid)
    params: dict[str, dict[str, Any]] = {}
    for name in reader.trial_dirs():
        p = reader.params(name)
        if p is not None:
            params[reader.trial_id(name)] = p
    configs: dict[str, RunConfig] = {}
    for trial_id, p in params.items():
        try:
            configs[trial_id] = config_from_params(p, f"trial {trial_id}")
        except ConfigError:
            continue
    axes = list(df.attrs.get("axes") or [])
    # An axis is the trial's setting: a reported metric of the same name (e.g. the scheduled `lr`) must not
    # replace it (ablate.analysis.results lets the reported value win).
    for axis in axes:
        if axis in df.columns and params:
            setting = df["trial_id"].map(lambda t, a=axis: axis_value(params[t].get(a)) if t in params else None)
            known = df["trial_id"].isin(list(params))
            if known.any():
                df[axis] = setting.where(known, df[axis])
    grid = _grid_from_marker(marker)
    ctx = RunContext(
        grid=str(marker.get("grid", "")),
        axes=axes,
        configs=configs,
        paper_values=dict(grid.paper_values) if grid else {},
    )
    return Run(
        run_dir=str(run_dir),
        df=df,
        marker=marker,
        grid=grid,
        params=params,
        statuses={k: v for k, v in reader.statuses().items() if k not in set(reader.disagreeing())},
        ctx=ctx,
        provenance=reader.provenance(),
        left_out=reader.disagreeing(),
        live=reader.driver_live(),
    )


def nothing_left_to_run(run: Run) -> bool:
    """True once the run's driver has nothing left to run: every trial the run expects is known and ended,
    TERMINATED (it reached its stop, or its scheduler stopped it early) or ERROR (it failed); none is pending,
    running or interrupted. ``ablate report --watch`` stops here.

    Not "every trial has a final value": an errored trial and one its scheduler stopped early have none, and
    final-value comparisons leave them out (:mod:`ablate.analysis.finished`)."""
    expected = int(run.marker.get("n_trials") or 0)
    if not run.statuses or len(run.statuses) < expected:
        return False
    return all(s in _ENDED for s in run.statuses.values())


def trial_table(run: Run) -> pd.DataFrame:
    """One row per trial: its axes, seed, status, steps and R² at its last report (trials without reports
    included); that R² is a final value only where the trial finished: TERMINATED, and not stopped early by its
    scheduler (:mod:`ablate.analysis.finished`)."""
    axes = run.ctx.axes
    fin = final_rows(run.df).set_index("trial_id") if not run.df.empty else pd.DataFrame()
    rows = []
    for trial_id in sorted(set(run.params) | set(run.statuses)):
        p = run.params.get(trial_id, {})
        row: dict[str, Any] = {"trial": trial_id}
        for a in axes:
            v = axis_value(p.get(a))
            row[a] = "null" if v is None and a in p else v
        row["seed"] = p.get("seed")
        row["status"] = run.statuses.get(trial_id, "PENDING")
        last = fin.loc[trial_id] if trial_id in fin.index else None
        cfg = run.ctx.configs.get(trial_id)
        step = None if last is None else last.get("step")
        row["steps"] = f"{int(step) if step is not None and pd.notna(step) else 0} / {cfg.max_steps if cfg else '?'}"
        for col, name in (("r2", "R² (last report)"), ("mcc", "MCC"), ("time_total_s", "time (s)")):
            v = None if last is None else last.get(col)
            row[name] = None if v is None or pd.isna(v) else round(float(v), 4 if col != "time_total_s" else 2)
        rows.append(row)
    order = [*axes, "seed"]
    rows.sort(key=lambda r: [natural_key(r.get(k)) for k in order])
    return pd.DataFrame(rows)


def generator_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct generator g of a run: its condition numbers, threshold, linear R², and trials."""
    cols = sorted(c for c in df.columns if c.startswith("g_cond_layer_")) + ["g_cond_threshold", "g_linear_r2"]
    if df.empty or "g_linear_r2" not in df.columns or "trial_id" not in df.columns:
        return pd.DataFrame()
    last = df.dropna(subset=["g_linear_r2"]).groupby("trial_id").tail(1)
    keys = [c for c in ("latent_dim", "generator_seed") if c in last.columns]
    table = last.groupby(keys + cols, dropna=False).size().reset_index(name="trials")
    return table.round({c: 3 for c in cols})
