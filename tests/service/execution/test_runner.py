"""The runner (``ablate.service.execution.runner``) end to end on a real Ray: every shipped grid through `ablate run` at smoke
scale, and Optuna searches (a time budget, the study in SQLite). Crashes and resumes: test_reliability.py; the
trainable: test_trainable.py; grid files: test_grids.py."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
from conftest import runs_root, smoke_run

from ablate.service.execution.runner import run_grid
from ablate.service.execution.trainable import CHECKPOINT_FILE
from ablate.service.records import rundir
from ablate.service.specs.grids import known_grids, load_grid, n_reports
from ablate.service.specs.optuna import Choice


def _rows(trial_dir: Path) -> list[dict]:
    path = trial_dir / "result.json"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("name", sorted(known_grids()))
def test_every_grid_runs_through_the_cli_at_smoke_scale(name, ray_session, tmp_path_factory):
    """Every shipped grid, search grids included, through `ablate run` with its live progress table (the run is
    shared with test_report's checks of the same grid: the smoke matrix runs once per session)."""
    grid = load_grid(name, "smoke")
    run_dir = smoke_run(name, runs_root(tmp_path_factory))  # asserts exit code 0
    trial_dirs = sorted(p for p in run_dir.glob("trial_*") if p.is_dir())
    assert len(trial_dirs) == grid.n_trials
    for trial_dir in trial_dirs:
        rows = _rows(trial_dir)
        params = json.loads((trial_dir / "params.json").read_text())
        from ablate.service.specs.params import config_from_params

        expected = n_reports(config_from_params(params))
        if grid.search == "optuna":  # ASHA may stop a trial early
            assert 1 <= len(rows) <= expected
        else:
            assert len(rows) == expected, f"{trial_dir.name}: one row per report"
        steps = [r["step"] for r in rows]
        assert steps == sorted(set(steps)), "no duplicated or missing reports"
        # R² on held-out samples is finite and at most 1 (it may be negative early on), and MCC is a correlation
        assert all(math.isfinite(r["r2"]) and r["r2"] <= 1.0 for r in rows), [r["r2"] for r in rows]
        assert all(0.0 <= r["mcc"] <= 1.0 + 1e-6 for r in rows), [r["mcc"] for r in rows]
        assert list(trial_dir.glob(f"checkpoint_*/{CHECKPOINT_FILE}")), "a checkpoint was written"
    # Ray Tune keeps its own files (experiment states, tuner.pkl, error.pkl, params.pkl) outside the run directory,
    # on every Ray ablate supports (this test is in the lowest Ray's contract set: Makefile RAY_LOW_TESTS)
    ours = {rundir.RUN_MARKER, rundir.PROVENANCE_FILE, rundir.ENVIRONMENT_FILE, rundir.DRIVER_LOCK}
    ours |= {rundir.STUDY_JOURNAL, rundir.BEST_CONFIG_FILE, rundir.REPORT_FILE}
    foreign = sorted(p.name for p in run_dir.iterdir() if p.is_file() and p.name not in ours)
    foreign += sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*.pkl"))
    assert not foreign, f"Ray Tune wrote into the run directory: {foreign}"
    if grid.search == "optuna":
        best = json.loads((run_dir / "best_config.json").read_text())
        assert set(best["config"]) <= set(grid.optuna.space)
        assert all(
            best["config"][k] in getattr(grid.optuna.space[k], "choice", [best["config"][k]]) for k in best["config"]
        )


def test_optuna_with_a_time_budget_ranks_settings_at_equal_seconds(ray_session, tmp_path):
    """ASHA on time_total_s: no trial starts a report once past the budget, and a best config comes out."""
    grid = load_grid("tune_aninfonce", "smoke")
    grid.optuna.time_budget_s, grid.optuna.grace_period, grid.optuna.num_samples = 3.0, 1, 3
    grid.optuna.space["report_every"] = Choice(choice=[1000])  # reports of about half a second of training
    grid.stop.max_steps = 10_000_000  # only the time budget ends these trials
    outcome = run_grid(grid, storage=str(tmp_path), name="timed", verbose=0)
    assert len(outcome.trials) == 3 and not outcome.failed
    for trial in outcome.trials:
        assert trial.last["time_total_s"] - trial.last["time_this_iter_s"] < 3.0  # it stopped once past 3 s
        assert trial.last["step"] < 10_000_000
    assert outcome.best_config is not None and set(outcome.best_config["config"]) <= set(grid.optuna.space)


def test_an_optuna_grid_stores_its_study_as_a_journal_that_optuna_can_open(ray_session, tmp_path):
    import optuna
    from conftest import optuna_journal

    from ablate.service.records.rundir import OPTUNA_DB, STUDY_JOURNAL

    grid = load_grid("tune_aninfonce", "smoke")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome = run_grid(grid, storage=str(tmp_path), name="study", verbose=0)
    # Optuna persists only scalar choices: the encoder widths travel as their JSON text, with no warning
    assert not [w for w in caught if "categorical distribution" in str(w.message)], [str(w.message) for w in caught]
    assert (outcome.run_dir / STUDY_JOURNAL).is_file() and not (outcome.run_dir / OPTUNA_DB).exists()
    study = optuna.load_study(study_name=grid.name, storage=optuna_journal(outcome.run_dir))
    finished = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(finished) == len(outcome.trials) == grid.n_trials
    # each study trial's value is the R² its Ray trial last reported, with the sampled parameters
    last_r2 = sorted(round(t.last["r2"], 9) for t in outcome.trials)
    assert sorted(round(t.value, 9) for t in finished) == last_r2
    assert all(set(t.params) == set(grid.optuna.space) for t in finished)
    widths = {json.dumps(w, separators=(",", ":")) for w in grid.optuna.space["encoder_widths"].choice}
    assert {t.params["encoder_widths"] for t in finished} <= widths
    # each Ray trial trained the list its study trial holds as text
    by_value = {round(t.value, 9): json.loads(t.params["encoder_widths"]) for t in finished}
    for trial in outcome.trials:
        assert trial.params["encoder_widths"] == by_value[round(trial.last["r2"], 9)]
    # a resume of the finished search reopens the same study instead of starting another one
    run_grid(grid, storage=str(tmp_path), name="study", verbose=0, resume=True)
    again = optuna.load_study(study_name=grid.name, storage=optuna_journal(outcome.run_dir))
    assert len(again.trials) == len(study.trials)
