"""What a run produced, as `ablate run` reports it: each point's end state (read from the run's own files), what
the run reused, continued and started, the storage that filled up, the trials a Ctrl-C or SIGTERM stopped and
those that never started."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate.service.records.plan import Plan
from ablate.service.records.reader import RunReader
from ablate.service.records.rundir import INTERRUPTED, INTERRUPTED_FILE, TRIAL_PREFIX, RunError
from ablate.service.records.store import as_store
from ablate.service.specs.grids import Grid, axis_text

__all__ = [
    "RunOutcome",
    "StorageFull",
    "TrialOutcome",
    "collect_outcome",
    "full_disk",
    "full_in_text",
    "retry_line",
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


def full_in_text(text: str) -> OSError | None:
    """The full disk a trial's error names in its text (Ray hands a trial's error back as its traceback's text, or
    wrapped without the OSError's errno): ``cannot write FILE (No space left on device)``."""
    for code in _FULL:
        reason = os.strerror(code)
        if reason in text:
            found = re.search(r"cannot write (\S+) \(" + re.escape(reason), text)
            return OSError(code, reason, found[1] if found else None)
    return None


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

    run_dir: Path | str  # a local path, or the run's URI on object storage
    grid: Grid
    trials: list[TrialOutcome] = field(default_factory=list)
    best_config: dict[str, Any] | None = None
    wall_s: float = 0.0
    plan: Plan | None = None  # what the run reused, continued and started (a grid; None for a search)
    interrupted: bool = False  # Ctrl-C or SIGTERM stopped the run; --resume continues it
    stop_signal: int = 0  # the signal that stopped it (signal.SIGINT or signal.SIGTERM), 0 if none
    storage_full: str | None = None  # a trial failed because the storage is full: what could not be written
    #: unit (a trial, or a pack) → why each of its retries happened (Ray's within a round, the runner's after one)
    retried: dict[str, list[str]] = field(default_factory=dict)
    redone: int = 0  # reports trained again by the retried trials (those after the checkpoint each continued from)

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
    grid: Grid,
    run_dir: str,
    plan: Plan | None,
    *,
    stop_signal: int,
    pack: int,
    wall_s: float,
    errors: dict[str | None, BaseException],
) -> RunOutcome:
    """The run's outcome from the run directory's files: one :class:`TrialOutcome` per point of ``grid`` (every
    trial of a search), INTERRUPTED where a signal (``stop_signal``, 0 for none) stopped a trial, PENDING where one
    never started; records the stopped trials in ``RUN_DIR/ablate_interrupted.json`` (through the run's store). ``errors``: the errors Ray
    returned (a full disk among them is named in :attr:`RunOutcome.storage_full`)."""
    where = as_store(run_dir).local_file("") or run_dir  # a folder of this machine as a Path, else its URI
    outcome = RunOutcome(run_dir=where, grid=grid, wall_s=wall_s, plan=plan)
    outcome.stop_signal = stop_signal
    outcome.interrupted = bool(stop_signal)
    reader = RunReader(run_dir)
    states = reader.trial_states()
    ids = [p.trial_id for p in plan.points] if plan is not None else list(states)
    for trial_id in ids:
        state = states.get(trial_id, {"status": "PENDING", "params": {}, "error": None})
        status = state["status"]
        if status == "RUNNING":  # the driver is done with it: a signal stopped it, or Ray gave up on it
            status = INTERRUPTED if outcome.interrupted else "ERROR"
        params = state["params"] or {}
        last = (reader.results(f"{TRIAL_PREFIX}{trial_id}") or [{}])[-1]
        error = errors.get(trial_id) or errors.get(state.get("pack"))
        message = f"{type(error).__name__}: {error}" if error is not None else state.get("error")
        outcome.trials.append(TrialOutcome(trial_id, _label(params, grid), status, params, last, message))
    for error in errors.values():
        full = full_disk(error) or full_in_text(str(error))
        if full is not None:
            outcome.storage_full = storage_full_message(full, run_dir)
            break
    if outcome.interrupted:
        stopped = [t.trial_id for t in outcome.unfinished]
        info = {"trials": stopped, "time": time.time()}
        as_store(run_dir).write_text(INTERRUPTED_FILE, json.dumps(info, indent=1))
    return outcome


def retry_line(outcome: RunOutcome) -> str | None:
    """``retried N trial(s) M time(s) …: a× why, b× why; R report(s) trained again`` for a run whose trials were
    retried (None: none was)."""
    if not outcome.retried:
        return None
    reasons = Counter(why for whys in outcome.retried.values() for why in whys)
    times = sum(reasons.values())
    whys = ", ".join(f"{n}× {why}" for why, n in reasons.most_common())
    return (
        f"retried {len(outcome.retried)} trial(s) {times} time(s), each from its own checkpoint: {whys}; "
        f"{outcome.redone} report(s) trained again (--max-failures bounds each trial's failures)"
    )


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
