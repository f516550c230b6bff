"""Reads a run directory (finished, running or interrupted; local or remote) into one tidy DataFrame.

One row per trial per report. Only JSON is read (the run marker, Ray's experiment state, each trial's
params.json and result.json): nothing is unpickled, and a directory ablate did not write is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from ablate.config import RunConfig
from ablate.service.records.reader import RunReader
from ablate.service.records.rundir import RunError, atomic_write
from ablate.service.specs.grids import axis_text

__all__ = ["LEAD_COLUMNS", "NothingToExport", "axis_value", "differing_settings", "export_results", "load_results"]

#: Columns that lead the table, in this order (when present).
LEAD_COLUMNS = [
    "trial_id",
    "status",
    "stopped_early",
    "seed",
    "training_iteration",
    "step",
    "samples_seen",
    "time_total_s",
    "r2",
]
#: How many of :data:`LEAD_COLUMNS` come before the grid's axes.
_BEFORE_AXES = 3
#: Ray bookkeeping left out of the table.
_DROP = {
    "config",
    "date",
    "timestamp",
    "pid",
    "hostname",
    "node_ip",
    "done",
    "time_this_iter_s",
    "time_since_restore",
    "iterations_since_restore",
    "checkpoint_dir_name",
    "should_checkpoint",
}


class NothingToExport(RunError):
    """No trial of the run has reported yet: :func:`export_results` has no table to write, and writes none."""


#: The loss a trial whose params do not name one trains (RunConfig's default).
DEFAULT_LOSS = RunConfig.model_fields["loss"].default


def axis_value(v: Any) -> Any:
    """An axis value as the table holds it: text for a Λ pattern, a list or a variant, else the value."""
    return axis_text(v) if isinstance(v, dict | list) else v


#: Keys of a trial's settings that are not settings of its training (the record's bookkeeping), or that have a
#: column of their own (the seed, the loss's name).
_NOT_SETTINGS = {"grid", "scale", "record", "pack", "point", "seed", "loss", "loss_options"}


def differing_settings(all_params: Any) -> list[str]:
    """The settings whose values differ between the trials of a run (``all_params``: each trial's params), beyond
    its seeds: a grid's axes, and any setting a later ``--set`` changed for new points beside the old ones. Each
    is a column of the export and a level that compare, the report and claims keep apart."""
    params = list(all_params)
    keys = sorted({k for p in params for k in p if k not in _NOT_SETTINGS})
    return [k for k in keys if len({json.dumps(p.get(k), sort_keys=True, default=str) for p in params}) > 1]


def _default(key: str) -> Any:
    """RunConfig's default of ``key`` (None for a key that is not one of its fields)."""
    field = RunConfig.model_fields.get(key)
    if field is None:
        return None
    return field.get_default(call_default_factory=True)


def _effective(params: dict[str, Any], keys: set[str]) -> dict[str, Any]:
    """A trial's ``keys`` with RunConfig's defaults for those its params.json leaves out (it holds what its grid
    set), so that a setting one point leaves at its default and another sets differs only when the values do. A
    variant's own settings stay inside its ``variant`` column (the variant is the level)."""
    return {k: params[k] if k in params else _default(k) for k in keys}


def load_results(run_dir: str | Path, grid: str | None = None) -> pd.DataFrame:
    """One row per trial per report, with the grid axes as columns under their YAML names.

    Columns: trial_id, status, stopped_early (True for a search's trial its scheduler stopped before its stop
    settings: TERMINATED, but without a final value, :mod:`ablate.analysis.finished`), every grid axis, seed,
    loss_name (and ``loss_options.<key>`` for a plugin loss's options), training_iteration, step, samples_seen,
    time_total_s, r2, r2_lambda_<Λ>, r2_dim_<i>, mcc, loss, loss_floor, lambda_hat_<i>, pack (the pack trial and
    index of a member of a pack, ``ablate run --pack``; empty otherwise), and the other reported metrics. ``df.attrs`` holds the run marker (grid, scale, axes).
    """
    reader = RunReader(run_dir, grid)
    info = reader.marker()
    states = reader.trial_states()
    statuses = {trial_id: state["status"] for trial_id, state in states.items()}
    stopped_early = {trial_id for trial_id, state in states.items() if state.get("stopped_early") is not None}
    settings = {name: reader.params(name) or {} for name in reader.trial_dirs()}
    axes = [a for a in info.get("axes", []) if a != "seed"]
    keys = {k for params in settings.values() for k in params if k not in _NOT_SETTINGS}
    effective = {name: _effective(params, keys) for name, params in settings.items()}
    if info.get("search", "grid") == "grid":  # a search's trials differ by design: its space is not its axes
        axes += [k for k in differing_settings(effective.values()) if k not in axes]
    records: list[dict[str, Any]] = []
    for name, params in settings.items():
        trial_id = reader.trial_id(name)
        rows = reader.results(name)
        unique = {row.get("training_iteration", 0): row for row in rows}  # a replayed report supersedes
        for it in sorted(unique):
            row = unique[it]
            rec: dict[str, Any] = {
                "trial_id": trial_id,
                "status": statuses.get(trial_id, "UNKNOWN"),
                "stopped_early": trial_id in stopped_early,
            }
            for k, v in row.items():
                if k in _DROP or k == "trial_id":
                    continue
                rec[k] = v
            for axis in axes:  # the trial's settings win over a metric of the same name
                rec[axis] = axis_value(params[axis] if axis in params else effective[name].get(axis))
            rec["seed"] = params.get("seed")
            rec["loss_name"] = params.get("loss", DEFAULT_LOSS)  # the loss's name ("loss" is its value)
            options = params.get("loss_options")
            for key, value in (options if isinstance(options, dict) else {}).items():
                rec[f"loss_options.{key}"] = value
            rec["pack"] = row.get("pack")  # the pack id of a member of a pack (ablate run --pack), else empty
            records.append(rec)
    df = pd.DataFrame.from_records(records)
    if not df.empty:
        order = [*LEAD_COLUMNS[:_BEFORE_AXES], *axes, *LEAD_COLUMNS[_BEFORE_AXES:]]
        lead = [c for c in order if c in df.columns]
        df = df[lead + [c for c in df.columns if c not in lead]]
        df = df.sort_values(["trial_id", "training_iteration"], kind="stable").reset_index(drop=True)
    df.attrs.update(
        {"grid": info.get("grid"), "scale": info.get("scale"), "axes": axes, "run_dir": str(run_dir), "marker": info}
    )
    return df


def export_results(run_dir: str | Path, out: str | Path, grid: str | None = None) -> Path:
    """Write the results table to ``out`` (.csv or .parquet); list-valued cells become JSON text in CSV.

    A local file is written atomically (nothing half-written or temporary is left behind); one that cannot be
    written raises :class:`ablate.service.records.rundir.WriteError` naming ``out``. A run no trial of which has reported yet
    raises :class:`NothingToExport` and writes nothing (an existing ``out`` stays as it was)."""
    out = Path(out)
    if out.suffix not in (".csv", ".parquet"):
        raise RunError(f"--out {out}: unknown format {out.suffix!r}; allowed: .csv, .parquet")
    df = load_results(run_dir, grid)
    if df.empty:
        raise NothingToExport(f"{run_dir}: nothing to export yet: no trial has reported; no file written")
    if out.suffix == ".parquet":
        atomic_write(out, lambda tmp: df.to_parquet(tmp, index=False))
    else:
        flat = df.copy()
        for col in flat.columns:
            if flat[col].map(lambda v: isinstance(v, list | dict)).any():
                flat[col] = flat[col].map(lambda v: json.dumps(v) if isinstance(v, list | dict) else v)
        atomic_write(out, lambda tmp: flat.to_csv(tmp, index=False))
    return out
