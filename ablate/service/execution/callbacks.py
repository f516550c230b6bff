"""The driver-side Ray Tune callback of the runner (imported only once Ray is needed): ablate's result log."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ray.tune import Callback

from ablate.service.execution.results import split_reports
from ablate.service.execution.retries import Retries, error_line, failure_reason, last_failure
from ablate.service.records.outcome import full_in_text
from ablate.service.records.record import TrialRecord, own_record, trial_records
from ablate.service.records.trial import record_of
from ablate.service.records.trial_log import ERROR_KEY, finished, seconds_of
from ablate.service.specs.params import PACK_KEY, RECORD_KEY, config_from_params, flat_params, pack_members

__all__ = ["ResultLog"]

_log = logging.getLogger("ablate.service.execution.runner")


class ResultLog(Callback):
    """Append each report to its trial's ``result.json`` in the run directory (a pack's: one row per member; a
    result that carries several reports, :mod:`ablate.service.execution.results`: one row per report).

    Rows are only ever appended, in the driver's thread; a row cut by a kill is dropped at the next append. A
    trial that continues (a resumed run, Ray's retry of a failed trial) reports again from its checkpoint: the
    rows at and after the step it reports are dropped first, so the log holds each report once and its steps
    rise. ``training_iteration`` is the row's place in the log and ``time_total_s`` adds the time of the rows
    before this driver's first report of the trial, so both run on across resumes as in one unbroken run.

    A report that ends a trial whose loss went non-finite (:data:`ablate.service.records.trial_log.ERROR_KEY`) is its error: it is
    written beside the log (``error.json``, as for a trial that failed for good) and said in one line.
    """

    def __init__(self, check: Callable[[], None] | None = None, retries: Retries | None = None):
        """``check()``: run before each write; it raises when the driver may no longer write the run (its lease on
        object storage was lost, :class:`ablate.service.records.driver_lock.DriverCheck`), which ends the run.
        ``retries``: told of each trial Ray retries, and why (:class:`ablate.service.execution.retries.Retries`)."""
        super().__init__()
        self._check = check or _unchecked
        self._retries = retries
        #: unit id → (Tune's count of its failures, its last error) for each trial that failed for good
        self.failed: dict[str, tuple[int, str | None]] = {}
        self._offset: dict[str, float] = {}
        self._known: dict[str, tuple[int, int]] = {}  # folder -> (rows in its log, last step)
        self._marked: set[str] = set()  # folders this driver wrote an error or stopped file into

    def on_trial_result(self, iteration, trials, trial, result, **info):
        record = record_of(trial.config)
        if record is None:
            return
        self._check()
        for report in split_reports(result):  # several with --results-every: each its own row
            self._write_report(trial, record, report)

    def _write_report(self, trial, record: dict[str, Any], result: dict[str, Any]) -> None:
        if isinstance(result.get("members"), list):  # a pack: one row per member that reported
            shared = {k: v for k, v in result.items() if k not in _PACK_RESULT_KEYS}
            members = pack_members(trial.config)
            for member, params, row in zip(trial_records(record), members, result["members"]):
                if row is not None:  # None: finished (or failed) in an earlier report
                    self._append(member, {**shared, **row, "pack": record["id"], "config": _settings(params)})
            return
        self._append(own_record(record), {**result, "config": _settings(flat_params(trial.config))})

    def _append(self, trial: TrialRecord, row: dict[str, Any]) -> None:
        key, step = str(trial.folder), row.get("step")
        known = self._known.get(key)
        if known is None or not isinstance(step, int) or step <= known[1]:  # first report here, or a replay
            rows = trial.rows()
            if isinstance(step, int) and rows and rows[-1]["step"] >= step:  # reported again from a checkpoint
                kept = [r for r in rows if r["step"] < step]
                trial.rewrite(kept)
                if self._retries is not None:
                    self._retries.redone += len(rows) - len(kept)
                rows = kept
            # the trial (re)started in this driver: its clock starts at 0, after the time its log holds already
            self._offset[key] = seconds_of(rows)
            known = (len(rows), rows[-1]["step"] if rows else -1)
        row = {**row, "trial_id": trial.id, "training_iteration": known[0] + 1}
        if isinstance(row.get("time_total_s"), int | float):
            row["time_total_s"] = row["time_total_s"] + self._offset[key]
        trial.append(row)
        self._known[key] = (known[0] + 1, step if isinstance(step, int) else known[1])
        if row.get(ERROR_KEY):
            self._marked.add(key)
            trial.write_error(str(row[ERROR_KEY]), 1)
            why = "recorded; not retried, its seed fails the same way"
            _log.warning("trial %s failed (%s): %s", row["trial_id"], why, row[ERROR_KEY])

    def on_trial_start(self, iteration, trials, trial, **info):
        """A trial starts (or starts again): its folder without an earlier error or stopped file, with its params.
        A folder the plan prepared (its record says ``prepared``) needs nothing until this driver marks it."""
        self._check()
        prepared = bool((record_of(trial.config) or {}).get("prepared"))
        for record in _records(trial):
            if prepared and str(record.folder) not in self._marked:
                continue  # the plan wrote its params and cleared it; nothing since
            record.make()
            if not (record.last_row() or {}).get(ERROR_KEY):  # a failed pack member's error stays
                record.clear_error()
            record.clear_stopped()
            if not record.has_params():  # a search's trial (a grid's points were written by the plan)
                record.write_params({k: v for k, v in flat_params(trial.config).items() if k != RECORD_KEY})

    def on_trial_complete(self, iteration, trials, trial, **info):
        """A trial that ended: its log made one piece (in a bucket one entry, so that status and export read it in
        one request), and, for a trial the scheduler stopped before its stop settings (ASHA in a search), say so
        beside its log, so it reads as finished, not interrupted."""
        self._check()
        for record in _records(trial):
            record.compact()
        if pack_members(trial.config):
            return
        config = config_from_params(flat_params(trial.config))
        for record in _records(trial):
            rows = record.rows()
            if rows and not finished(rows, config.max_steps, config.target_r2) and not rows[-1].get(ERROR_KEY):
                self._marked.add(str(record.folder))
                record.write_stopped("the scheduler", rows[-1]["step"])

    def on_trial_recover(self, iteration, trials, trial, **info):
        """Ray retries a trial that failed while it trained: one line says why (Ray's traceback of each failure is
        not printed: :func:`ablate.ray_compat.set_tune_environment`), and ``retries`` is told."""
        record = record_of(trial.config)
        if record is None:
            return
        text = _last_error(trial)
        if self._retries is not None:
            self._retries.ray_retried(record["id"], failure_reason(text))
        _say(
            text, "trial %s failed (%s): retried from its checkpoint, failure %d of at most %d",
            record["id"], error_line(text), int(getattr(trial, "num_failures", 1) or 1),
            int(getattr(trial, "max_failures", 0)) + 1,
        )  # fmt: skip

    def on_trial_error(self, iteration, trials, trial, **info):
        """A trial that failed for good in this driver (Ray retries it no more): one line, and its error beside its
        log, with the traceback of its last failure (a resume, or the runner's retry of a trial whose process died,
        runs it again)."""
        record = record_of(trial.config)
        if record is None:
            return
        text = _last_error(trial)
        failures = int(getattr(trial, "num_failures", 1) or 1)  # Tune's count: the first failure and each retry's
        self.failed[record["id"]] = (failures, text)
        line = error_line(text)
        _say(text, "trial %s failed %d time(s), not retried by Ray: %s", record["id"], failures, line)
        self._check()
        for member in _records(trial):
            self._marked.add(str(member.folder))
            member.write_error(line, failures, trace=last_failure(text))


def _say(error_text: str | None, message: str, *args: Any) -> None:
    """A trial's failure in one warning line, unless it is a full disk, which the runner says once for the run."""
    if full_in_text(error_text or "") is None:
        _log.warning(message, *args)


def _last_error(trial) -> str | None:
    """The text of a trial's last failure (its traceback) as Tune writes it in the driver's folder (``error.txt``;
    Ray's file, read as text, outside the run directory); None if there is none."""
    try:
        path = trial.error_file
        return Path(path).read_text(errors="replace") if path else None
    except OSError:
        return None


def _unchecked() -> None:
    """A driver that holds a lock: it is never lost."""


def _settings(params: dict[str, Any]) -> dict[str, Any]:
    """A trial's settings as its rows carry them (``config``): its params without where its record lives."""
    return {k: v for k, v in params.items() if k != RECORD_KEY}


def _records(trial) -> list[TrialRecord]:
    """The trial records a Ray trial writes: its own, or each member's of a pack (none outside a run)."""
    record = record_of(trial.config)
    return [] if record is None else trial_records(record)


#: A pack trial's own result keys that are not a member's: the member rows and the pack-wide means.
_PACK_RESULT_KEYS = ("members", "r2", "loss", "mcc", "step", "done", "config", "trial_id", PACK_KEY)
