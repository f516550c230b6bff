"""ASHA whose rungs are the run directory's: a search that goes on in a fresh Tune experiment (a resumed or
extended ``ablate run`` of an Optuna grid) judges its trials against every report the search has made so far.

Ray's ``ASHAScheduler`` keeps its rungs in memory (Tune pickles them into its experiment snapshot, which ablate
never reads back). :class:`RecordASHA` rebuilds them when it is made, from the trials' own result logs, and keys
each trial by its record (its folder), so a trial that continues from its checkpoint keeps the rungs it passed.
A continued trial's Ray clock starts again at its first report in this driver; its reports are judged at their
place in the log (``training_iteration``) and the training time the log holds (``time_total_s``), as the result
log writes them (:class:`ablate.service.execution.callbacks.ResultLog`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from ray.tune.schedulers import ASHAScheduler

from ablate.service.records.record import RunRecord, TrialRecord, own_record
from ablate.service.records.trial import record_of
from ablate.service.records.trial_log import ERROR_KEY, seconds_of

__all__ = ["RecordASHA"]


class _Record:
    """The scheduler's view of a record: its folder's id stands for every Tune trial that trains it."""

    def __init__(self, trial_id: str):
        self.trial_id = trial_id


class RecordASHA(ASHAScheduler):
    """``ASHAScheduler`` with its rungs rebuilt from ``run_dir``'s result logs of grid ``grid``'s trials."""

    def __init__(self, run_dir: str | Path, grid: str, **asha: Any):
        super().__init__(**asha)
        self._run = RunRecord(run_dir)
        self._holders: Counter[str] = Counter()  # record id -> Tune trials training it now
        self._shift: dict[str, tuple[int, float, int]] = {}  # Tune trial id -> (rows, seconds, last step) before
        self._grid, self._rebuilt = grid, None

    def rebuild_rungs(self) -> int:
        """Replay every report in the run's logs of the grid's trials into the rungs, once (at the first trial,
        when Tune has given the metric and mode); the number of trials replayed."""
        if self._rebuilt is None:
            self._rebuilt = self._replay()
        return self._rebuilt

    def _replay(self) -> int:
        n = 0
        for trial in self._run.trials():
            rows = trial.rows()
            if not rows or _grid_of(trial) not in (self._grid, None):
                continue
            record = _Record(trial.id)
            super().on_trial_add(None, record)
            for row in rows:
                if not row.get(ERROR_KEY):  # a loss that went non-finite is no rung result
                    super().on_trial_result(None, record, row)
            super().on_trial_remove(None, record)
            n += 1
        return n

    def on_trial_add(self, tune_controller, trial):
        self.rebuild_rungs()
        record = self._record(trial)
        if self._holders[record.trial_id] == 0:
            super().on_trial_add(tune_controller, record)
        self._holders[record.trial_id] += 1

    def on_trial_result(self, tune_controller, trial, result):
        if result and result.get(ERROR_KEY):  # its last report (done): no rung result
            return self.CONTINUE
        return super().on_trial_result(tune_controller, self._record(trial), self._in_log(trial, result))

    def on_trial_complete(self, tune_controller, trial, result):
        if result and result.get(ERROR_KEY):  # its loss went non-finite: it leaves the rungs as a removed trial
            self.on_trial_remove(tune_controller, trial)
            return
        record = self._record(trial)
        if self._release(record):
            super().on_trial_complete(tune_controller, record, self._in_log(trial, result))
        elif result:  # another Tune trial trains the same record: record this report, keep its bracket
            super().on_trial_result(tune_controller, record, self._in_log(trial, result))
        self._shift.pop(trial.trial_id, None)

    def on_trial_remove(self, tune_controller, trial):
        record = self._record(trial)
        if self._release(record):
            super().on_trial_remove(tune_controller, record)
        self._shift.pop(trial.trial_id, None)

    def _release(self, record: _Record) -> bool:
        """Drop one holder of ``record``; True when it was the last."""
        self._holders[record.trial_id] -= 1
        if self._holders[record.trial_id] > 0:
            return False
        del self._holders[record.trial_id]
        return True

    @staticmethod
    def _record(trial) -> _Record:
        record = record_of(trial.config)
        return _Record(record["id"] if record is not None else trial.trial_id)

    def _in_log(self, trial, result: dict[str, Any]) -> dict[str, Any]:
        """``result`` with the clock of the trial's log: its place there and the training time the log holds."""
        if not result:
            return result
        step = result.get("step")
        known = self._shift.get(trial.trial_id)
        if known is None or (isinstance(step, int) and step <= known[2]):  # first report here, or a replay
            record = record_of(trial.config)
            rows = []
            if record is not None and isinstance(step, int):
                rows = [r for r in own_record(record).rows() if r["step"] < step]
            known = (len(rows), seconds_of(rows), -1)
        self._shift[trial.trial_id] = (known[0], known[1], step if isinstance(step, int) else known[2])
        shifted = dict(result)
        if isinstance(shifted.get("training_iteration"), int):
            shifted["training_iteration"] += known[0]
        if isinstance(shifted.get("time_total_s"), int | float):
            shifted["time_total_s"] += known[1]
        return shifted


def _grid_of(trial: TrialRecord) -> str | None:
    """The grid a trial's params.json names (None: unreadable or unnamed)."""
    grid = (trial.read_params() or {}).get("grid")
    return grid if isinstance(grid, str) else None
