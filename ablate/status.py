"""Reads a run directory's state without Ray and without unpickling anything: trial statuses and latest R²."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ablate.runner import RunError, check_run_dir

__all__ = ["latest_result", "read_trials", "run_status"]


def _latest_state_file(run_dir: Path) -> Path | None:
    files = sorted(run_dir.glob("experiment_state*.json"), key=lambda p: p.stat().st_mtime)
    return files[-1] if files else None


def latest_result(trial_dir: Path) -> dict[str, Any] | None:
    """The last complete line of a trial's result.json, or None."""
    path = trial_dir / "result.json"
    if not path.is_file():
        return None
    last = None
    for line in path.read_text().splitlines():
        try:
            last = json.loads(line)
        except json.JSONDecodeError:  # a line being written right now
            continue
    return last


def read_trials(run_dir: str | Path) -> list[dict[str, Any]]:
    """Each trial Ray knows of: id, status, evaluated params, directory and number of failures (JSON only)."""
    run_dir = Path(run_dir)
    check_run_dir(run_dir)
    state = _latest_state_file(run_dir)
    if state is None:
        return []
    try:
        data = json.loads(state.read_text())
    except json.JSONDecodeError as exc:
        raise RunError(f"{state}: damaged experiment state ({exc})") from None
    trials = []
    for entry in data.get("trial_data", []):
        info = json.loads(entry[0])
        meta = json.loads(entry[1]) if len(entry) > 1 else {}
        trials.append({
            "trial_id": info["trial_id"],
            "status": info.get("status", "UNKNOWN"),
            "params": info.get("evaluated_params", {}),
            "dir": run_dir / (info.get("relative_logdir") or f"trial_{info['trial_id']}"),
            "failures": meta.get("num_failures", 0),
            "error_file": meta.get("error_filename"),
        })
    return trials


def run_status(run_dir: str | Path) -> dict[str, Any]:
    """Counts of finished / running / errored / pending trials and each trial's latest R²."""
    run_dir = Path(run_dir)
    info = check_run_dir(run_dir)
    trials = read_trials(run_dir)
    counts = {"finished": 0, "running": 0, "errored": 0, "pending": 0}
    names = {"TERMINATED": "finished", "RUNNING": "running", "ERROR": "errored", "PENDING": "pending",
             "PAUSED": "pending"}
    rows = []
    for t in trials:
        counts[names.get(t["status"], "pending")] += 1
        last = latest_result(t["dir"]) or {}
        rows.append({"trial": t["trial_id"], "status": t["status"],
                     **{k: v for k, v in t["params"].items()},
                     "step": last.get("step"), "r2": None if last.get("r2") is None else round(last["r2"], 4),
                     "failures": t["failures"]})
    expected = int(info.get("n_trials", len(trials)))
    counts["pending"] += max(expected - len(trials), 0)
    return {"grid": info["grid"], "scale": info["scale"], "counts": counts, "trials": rows}
