"""`ablate status`: trial counts and each trial's latest R², read without Ray and without unpickling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ablate.config import ConfigError
from ablate.service.records.plan import decide
from ablate.service.records.provenance import summary_line
from ablate.service.records.reader import RunReader
from ablate.service.records.rundir import INTERRUPTED
from ablate.service.records.trial_log import ERROR_KEY, intact_rows
from ablate.service.specs.grids import axis_text, natural_key
from ablate.service.specs.params import config_from_params, flat_params

__all__ = ["last_run", "next_run", "run_status", "varying_keys"]

_GROUPS = {
    "TERMINATED": "finished",
    "RUNNING": "running",
    "ERROR": "errored",
    "PENDING": "pending",
    "PAUSED": "pending",
    INTERRUPTED: "interrupted",  # started, unfinished, no live driver (Ctrl-C, SIGTERM, a kill); --resume continues it
}


def varying_keys(rows: list[dict[str, Any]], skip: tuple[str, ...] = ()) -> list[str]:
    """The keys whose values differ between rows (the grid's axes and seed), in the order they first appear."""
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row))
    return [k for k in keys if k not in skip and len({repr(r.get(k)) for r in rows}) > 1]


def next_run(params: dict[str, Any], rows: list[dict[str, Any]]) -> str | None:
    """What the next `ablate run … --resume` does with a trial of these recorded settings and intact ``rows``
    (:func:`ablate.service.records.plan.decide`, the plan's own decision): ``"reuse"``, ``"continue"`` or
    ``"start"``; None when its settings no longer make a config (a plugin gone, say)."""
    try:
        return decide(config_from_params(params), rows)
    except (ConfigError, ValueError, TypeError):
        return None


def _damaged_log_hint(action: str | None, rows: list[dict[str, Any]]) -> str:
    """What ``--resume`` does with a trial whose log has rows out of order (every command reads the intact ones)."""
    if action == "reuse":
        return "--resume reuses the trial as " + ("it ended (failed)" if rows[-1].get(ERROR_KEY) else "finished")
    if action == "continue":
        return "--resume continues the trial from its newest checkpoint and runs the reports after it again"
    if action == "start":
        return "--resume starts the trial again from step 0"
    return "its settings no longer make a config, so --resume cannot run it"


def _edited_params_hint(action: str | None, rows: list[dict[str, Any]]) -> str:
    """What ``--resume`` does with a trial whose params.json disagrees with the run's record of its point."""
    head = "params.json disagrees with the run's record of its point: left out of export, report and compare"
    if action == "reuse":
        how = "as it ended (failed)" if rows[-1].get(ERROR_KEY) else "as finished"
        return (
            f"{head}; --resume reuses the trial {how} and leaves its params.json as it is, so it stays left out "
            "until its params.json holds the recorded settings again (the trial's entry in the run marker's points)"
        )
    if action in ("continue", "start"):
        what = "continues the trial from its newest checkpoint" if action == "continue" else "starts the trial"
        return f"{head} until --resume, which writes its params.json again from the grid's point and {what}"
    return f"{head}; its recorded settings no longer make a config, so --resume cannot run it"


def _axis_values(state: dict[str, Any], axes: list[str] | None) -> dict[str, Any]:
    """A trial's value of each axis named by the run marker, from its config (Ray's own record of what it
    varied holds them under "point"), as display text; Ray's evaluated params where there is no config."""
    config = flat_params(state.get("config") or {})
    params = {k: config[k] for k in axes if k in config} if axes and config else state["params"]
    return {k: axis_text(v) if isinstance(v, dict | list) else v for k, v in params.items()}


def run_status(run_dir: str | Path, grid: str | None = None) -> dict[str, Any]:
    """Counts of finished / running / interrupted / errored / pending trials and each trial's latest R²;
    ``errors``: trial id → the error of each errored trial (its last line; a non-finite loss names its step).
    ``damaged``: trial id → what of its record every command leaves out (rows of its log out of order, a
    params.json edited by hand) and what the next ``--resume`` does with it (:func:`next_run`). ``driver``: the
    live `ablate run` writing the run ({pid, host, since}; :meth:`RunReader.driver`: the holder of the run's lock, or
    of a fresh lease on object storage); None when none is. A trial counts as running only while a live driver
    holds it; otherwise one Ray's last snapshot left RUNNING reads as interrupted."""
    reader = RunReader(run_dir, grid)
    info = reader.marker()
    counts = {"finished": 0, "running": 0, "interrupted": 0, "errored": 0, "pending": 0}
    rows, damaged, errors = [], {}, {}
    states = reader.trial_states()
    for trial_id, state in states.items():
        counts[_GROUPS.get(state["status"], "pending")] += 1
        if state["status"] == "ERROR":
            errors[trial_id] = state.get("error") or "failed (no error recorded)"
        logged = reader.logged_rows(reader.trial_name(trial_id))
        results = intact_rows(logged)
        intact = len(results)
        if intact < len(logged):
            then = _damaged_log_hint(next_run(state["params"] or {}, results), results)
            damaged[trial_id] = (
                f"result.json holds reports 1–{intact} intact, then {len(logged) - intact} out of order, which every "
                f"command leaves out; {then}"
            )
        last = results[-1] if results else {}
        r2 = last.get("r2")
        params = _axis_values(state, info.get("axes"))
        rows.append(
            {
                "trial": trial_id,
                "status": state["status"],
                **params,
                "step": last.get("step"),
                "r2": None if r2 is None else round(r2, 4),
                "failures": state["failures"],
            }
        )
    for trial_id in reader.disagreeing():
        results = reader.results(reader.trial_name(trial_id))
        recorded = states[trial_id]["params"] if trial_id in states else {}
        damaged[trial_id] = _edited_params_hint(next_run(recorded or {}, results), results)
    counts["pending"] += max(int(info.get("n_trials", len(rows))) - len(rows), 0)
    order = varying_keys(rows, skip=("trial", "status", "step", "r2", "failures"))  # the axes and the seed
    rows.sort(key=lambda r: [natural_key(r.get(k)) for k in order])
    driver = reader.driver()
    return {
        "grid": info["grid"],
        "scale": info["scale"],
        "counts": counts,
        "trials": rows,
        "errors": errors,
        "damaged": damaged,
        "driver": driver,
        "provenance": _provenance_line(reader),
        "last_run": last_run(info),
    }


def last_run(marker: dict[str, Any]) -> str | None:
    """What the newest `ablate run` of the marker's grid did: ``N points: a reused, b continued, c started``."""
    runs = [r for r in marker.get("runs") or [] if isinstance(r, dict) and r.get("grid") == marker.get("grid")]
    return runs[-1].get("plan") if runs else None


def _provenance_line(reader: RunReader) -> str | None:
    """What produced the run (:func:`ablate.service.records.provenance.summary_line` of its newest record) and how often it was
    resumed; None for runs made before provenance was recorded."""
    records = reader.provenance()
    if not records:
        return None
    resumes = sum(r.get("event") == "resume" for r in records)
    return summary_line(records[-1]) + (f"; resumed {resumes}×" if resumes else "")
