"""ASHA's rungs rebuilt from the run directory's result logs (ablate.service.execution.rungs): a search that goes
on in a fresh Tune experiment judges new and continued trials against the reports its earlier runs made."""

from __future__ import annotations

import json

import pytest
from ray.tune.experiment import Trial
from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from ablate.service.execution.rungs import RecordASHA
from ablate.service.records.rundir import PARAMS_FILE, RESULT_FILE, TRIAL_PREFIX
from ablate.service.records.trial_log import append_row

pytestmark = pytest.mark.ray  # Ray's scheduler API: run again on the lowest supported Ray (make test-ray-low)

ASHA = {"time_attr": "training_iteration", "metric": "r2", "mode": "max", "max_t": 8, "grace_period": 1}
ASHA["reduction_factor"] = 2


def _log(run_dir, record_id, r2s, grid="g", every=100, seconds=2.0):
    """A trial folder with one report per value in ``r2s``, as the result log writes them."""
    folder = run_dir / f"{TRIAL_PREFIX}{record_id}"
    folder.mkdir(parents=True)
    (folder / PARAMS_FILE).write_text(json.dumps({"grid": grid}))
    for i, r2 in enumerate(r2s, start=1):
        row = {"step": i * every, "r2": r2, "training_iteration": i, "time_total_s": i * seconds}
        append_row(folder / RESULT_FILE, row)


def _trial(run_dir, record_id, tune_id):
    config = {"grid": "g", "record": {"dir": str(run_dir), "id": record_id, "keep": 2}}
    return Trial("ablate", config=config, trial_id=tune_id, stub=True)


def _report(scheduler, trial, iteration, r2, step):
    return scheduler.on_trial_result(None, trial, {"training_iteration": iteration, "r2": r2, "step": step})


def test_new_trials_meet_the_rungs_of_the_finished_ones(tmp_path):
    for i, r2s in enumerate(([0.5, 0.7], [0.6, 0.8], [0.7, 0.9], [0.8, 0.95])):
        _log(tmp_path, f"done{i}", r2s)
    _log(tmp_path, "other", [0.99, 0.99], grid="another-grid")  # another grid's trials do not count
    scheduler = RecordASHA(tmp_path, "g", **ASHA)
    assert scheduler.rebuild_rungs() == 4

    low, high = _trial(tmp_path, "low", "t1"), _trial(tmp_path, "high", "t2")
    for trial in (low, high):
        scheduler.on_trial_add(None, trial)
    # rung 1 holds 0.5..0.8 from the logs: its cutoff (the median) is 0.65
    assert _report(scheduler, low, 1, 0.55, 100) == TrialScheduler.STOP
    assert _report(scheduler, high, 1, 0.75, 100) == TrialScheduler.CONTINUE

    fresh = ASHAScheduler(**ASHA)  # what a resumed search had before: empty rungs let a poor trial run on
    fresh.on_trial_add(None, low)
    assert _report(fresh, low, 1, 0.55, 100) == TrialScheduler.CONTINUE


def test_a_continued_trial_is_judged_at_its_place_in_the_log(tmp_path):
    for i, r2s in enumerate(([0.5, 0.6, 0.7, 0.8], [0.6, 0.7, 0.8, 0.9])):
        _log(tmp_path, f"done{i}", r2s)
    # a trial a stopped driver left after 3 reports (rungs 1 and 2 passed): it continues from step 300
    _log(tmp_path, "cont", [0.9, 0.9, 0.9])
    scheduler = RecordASHA(tmp_path, "g", **ASHA)
    trial = _trial(tmp_path, "cont", "t9")
    scheduler.on_trial_add(None, trial)
    # Ray's clock starts again at 1; the report is the log's 4th: judged at rung 4 (cutoff 0.85), not rung 1
    assert _report(scheduler, trial, 1, 0.84, 400) == TrialScheduler.STOP

    again = RecordASHA(tmp_path, "g", **ASHA)
    trial = _trial(tmp_path, "cont", "t10")
    again.on_trial_add(None, trial)
    assert _report(again, trial, 1, 0.86, 400) == TrialScheduler.CONTINUE


def test_two_tune_trials_of_one_record_share_its_bracket(tmp_path):
    _log(tmp_path, "done", [0.5, 0.6])
    scheduler = RecordASHA(tmp_path, "g", **ASHA)
    first, second = _trial(tmp_path, "same", "t1"), _trial(tmp_path, "same", "t2")
    scheduler.on_trial_add(None, first)
    scheduler.on_trial_add(None, second)  # Optuna suggested the same settings again: it waits on the folder
    scheduler.on_trial_complete(None, first, {"training_iteration": 1, "r2": 0.7, "step": 100})
    # the first one's end leaves the record's bracket to the second, which reports on into it
    assert _report(scheduler, second, 1, 0.7, 200) == TrialScheduler.CONTINUE
    scheduler.on_trial_complete(None, second, {"training_iteration": 1, "r2": 0.7, "step": 200})
