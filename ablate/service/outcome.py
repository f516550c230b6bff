"""What a run produced, as `ablate run` reports it: each trial's end state (packs' members as trials), the storage
that filled up, the trials a Ctrl-C or SIGTERM stopped and those that never started."""

from __future__ import annotations

import errno
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate.rundir import (
    INTERRUPTED,
    INTERRUPTED_FILE,
    TRIAL_PREFIX,
    RunError,
    RunReader,
    is_remote,
    member_id,
    write_text,
)
from ablate.service.grids import Grid, axis_text
from ablate.service.params import flat_params, pack_members

__all__ = [
    "RunOutcome",
    "StorageFull",
    "TrialOutcome",
    "collect_outcome",
    "full_disk",
    "storage_full_message",
    "summary_rows",
]


class StorageFull(RunError):
    """The run stopped because its storage is full; the message says what could not be written, and where."""


#: errno values of a full disk or an exhausted quota.
_FULL = (errno.ENOSPC, errno.EDQUOT)


def full_disk(exc: BaseException | None) -> OSError | None:
    """The ENOSPC/EDQUOT OSError behind ``exc`` (following causes and contexts), or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _FULL:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def storage_full_message(exc: OSError | None, run_dir: str) -> str:
    what = exc.filename if exc is not None and exc.filename else run_dir
    reason = (exc.strerror if exc is not None else None) or "no space left on device"
    return (
        f"could not write {what} ({reason}) while running {run_dir}; nothing finished was lost "
        "(finished reports and checkpoints stay on disk): free some space, then resume"
    )


@dataclass
class TrialOutcome:
    """The end state of one trial."""

    trial_id: str
    label: str
    status: str
    params: dict[str, Any]
    last: dict[str, Any]
    error: str | None = None


@dataclass
class RunOutcome:
    """What a run produced: where it lives and each trial's end state."""

    run_dir: Path
    grid: Grid
    trials: list[TrialOutcome] = field(default_factory=list)
    best_config: dict[str, Any] | None = None
    wall_s: float = 0.0
    set_aside: dict[str, str] = field(default_factory=dict)  # torn snapshot files moved aside on resume
    interrupted: bool = False  # Ctrl-C or SIGTERM stopped the run; --resume continues it
    stop_signal: int = 0  # the signal that stopped it (signal.SIGINT or signal.SIGTERM), 0 if none
    storage_full: str | None = None  # a trial failed because the storage is full: what could not be written

    @property
    def failed(self) -> list[TrialOutcome]:
        """Trials that did not finish."""
        return [t for t in self.trials if t.status != "TERMINATED"]

    @property
    def unfinished(self) -> list[TrialOutcome]:
        """Trials that Ctrl-C (or SIGTERM) stopped before they finished."""
        return [t for t in self.trials if t.status == INTERRUPTED]

    @property
    def not_started(self) -> list[TrialOutcome]:
        """Trials of an interrupted run that never started (Ray's PENDING): --resume starts them."""
        return [t for t in self.trials if t.status == "PENDING"]


def collect_outcome(
    results,
    grid: Grid,
    run_dir: str,
    *,
    stop_signal: int,
    pack: int,
    wall_s: float,
    set_aside: dict[str, str],
) -> RunOutcome:
    """The run's outcome from Tune's ``results`` (a ResultGrid): one :class:`TrialOutcome` per trial (per member of
    a pack), INTERRUPTED where a signal (``stop_signal``, 0 for none) stopped a trial, PENDING where one never
    started; records the stopped trials in ``RUN_DIR/ablate_interrupted.json``."""
    local = not is_remote(run_dir)
    outcome = RunOutcome(run_dir=Path(run_dir), grid=grid, wall_s=wall_s, set_aside=set_aside)
    outcome.stop_signal = stop_signal
    outcome.interrupted = bool(outcome.stop_signal)
    states = RunReader(run_dir).trial_states() if outcome.interrupted and local else {}
    for result in results:
        metrics = result.metrics or {}
        trial_id = metrics.get("trial_id") or Path(result.path).name.removeprefix(TRIAL_PREFIX)
        state = states.get(trial_id, {})
        cfg = flat_params(result.config or state.get("config") or {})  # a trial that never started: the snapshot's
        err = None if result.error is None else f"{type(result.error).__name__}: {result.error}"
        status = "ERROR" if result.error is not None else "TERMINATED"
        if outcome.interrupted and status == "TERMINATED":
            # Ray's last snapshot (taken before it stopped the actors) says whether the trial had finished or
            # had not started (PENDING); on remote storage the trial's last report does
            if local:
                was = state.get("status", "RUNNING")
            else:
                was = "TERMINATED" if metrics.get("done") else "RUNNING" if metrics else "PENDING"
            status = {"TERMINATED": status, "PENDING": "PENDING"}.get(was, INTERRUPTED)
        if outcome.storage_full is None and result.error is not None:
            full = full_disk(result.error)
            if full is not None or "No space left on device" in str(result.error):
                outcome.storage_full = storage_full_message(full, run_dir)
        outcome.trials.append(TrialOutcome(trial_id, _label(cfg, grid), status, cfg, metrics, err))
    if pack > 1 and local:
        outcome.trials = _pack_members(outcome.trials, run_dir, grid)
    if outcome.interrupted:
        outcome.trials += _never_created(grid, outcome.trials)
        stopped = [t.trial_id for t in outcome.unfinished]
        write_text(f"{run_dir}/{INTERRUPTED_FILE}", json.dumps({"trials": stopped, "time": time.time()}, indent=1))
    return outcome


def _never_created(grid: Grid, trials: list[TrialOutcome]) -> list[TrialOutcome]:
    """The grid points of an interrupted run that Ray had not even made a trial for (a --max-concurrent cap
    makes them one by one), as PENDING trials without an id; an Optuna grid's undrawn samples have no point."""
    if grid.search != "grid":
        return []
    seen = {t.label for t in trials}
    out = []
    for trial in grid.trials:
        params = grid.point_params(trial)
        label = _label(params, grid)
        if label not in seen:
            out.append(TrialOutcome("", label, "PENDING", params, {}))
    return out


def _pack_members(trials: list[TrialOutcome], run_dir: str, grid: Grid) -> list[TrialOutcome]:
    """Each pack trial's outcome replaced by its members': status, settings and last report from their folders."""
    reader = RunReader(run_dir)
    states = reader.trial_states()
    out = []
    for t in trials:
        members = pack_members(t.params)
        if not members:
            out.append(t)
            continue
        for i, params in enumerate(members):
            mid = member_id(t.trial_id, i)
            last = (reader.results(f"{TRIAL_PREFIX}{mid}") or [{}])[-1]
            status = states.get(mid, {}).get("status", t.status)
            if status not in ("TERMINATED", "ERROR") or t.status in (INTERRUPTED, "PENDING"):
                status = status if last.get("done") else t.status
            error = last.get("member_error") or (t.error if status == "ERROR" else None)
            out.append(TrialOutcome(mid, _label(params, grid), status, params, last, error))
    return out


def _label(params: dict[str, Any], grid: Grid) -> str:
    return ",".join(f"{k}={axis_text(params.get(k))}" for k in grid.axis_names())


def summary_rows(outcome: RunOutcome) -> list[dict[str, Any]]:
    """One row per trial: the axes, status, steps and final R² (for the end-of-run table)."""
    rows = []
    for t in outcome.trials:
        row: dict[str, Any] = {}
        for k in outcome.grid.axis_names():
            v = t.params.get(k)
            row[k] = axis_text(v) if isinstance(v, dict | list) else v
        row["status"] = t.status
        row["step"] = t.last.get("step")
        r2 = t.last.get("r2")
        row["r2"] = None if r2 is None or (isinstance(r2, float) and math.isnan(r2)) else round(float(r2), 4)
        rows.append(row)
    return rows
