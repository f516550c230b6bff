"""Optuna's own views of an Optuna grid's study in its report: the data they hold, and a failing view skipped."""

from __future__ import annotations

import math

from conftest import optuna_journal

from ablate.service.records.rundir import STUDY_JOURNAL

VIEWS = ["optimization_history", "param_importances", "parallel_coordinate"]


def test_no_study_file_means_no_views(tmp_path):
    from ablate.reports.optuna_views import optuna_views

    assert optuna_views(tmp_path, "anything") == []


def _study(tmp_path, n_complete: int, n_failed: int = 0):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="s", storage=optuna_journal(tmp_path), direction="maximize")
    study.optimize(lambda t: t.suggest_float("lr", 0.0, 1.0) * t.suggest_int("width", 1, 4), n_trials=n_complete)
    for _ in range(n_failed):
        trial = study.ask()
        trial.suggest_float("lr", 0.0, 1.0)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
    return study


def test_views_of_a_search_without_a_finished_trial_are_skipped_with_notes(tmp_path):
    from ablate.reports.optuna_views import optuna_views

    _study(tmp_path, n_complete=0, n_failed=1)
    views = optuna_views(tmp_path, "s")
    assert [v.name for v in views] == VIEWS
    for view in views:
        assert view.figure is None and view.note.startswith("skipped:"), view


def test_importances_of_a_single_trial_carry_optunas_warning(tmp_path):
    from ablate.reports.optuna_views import optuna_views

    study = _study(tmp_path, n_complete=1)
    views = {v.name: v for v in optuna_views(tmp_path, "s")}
    history = views["optimization_history"]
    assert history.figure is not None and history.data["value"].tolist() == [study.trials[0].value]
    importances = views["param_importances"]
    assert sorted(importances.data["param"]) == ["lr", "width"]
    assert importances.figure is not None and "too small" in importances.note


def test_a_damaged_study_file_is_a_note_not_a_crash(tmp_path):
    from ablate.reports.optuna_views import optuna_views

    (tmp_path / STUDY_JOURNAL).write_text('{"op_code": 0, "worker_id": "w"}\nnot json\n')
    (view,) = optuna_views(tmp_path, "x")
    assert view.figure is None and "could not be opened" in view.note


def test_the_report_of_a_smoke_optuna_search_holds_optunas_views(ray_session, tmp_path):
    import optuna

    from ablate.reports.optuna_views import optuna_views
    from ablate.reports.report import write_report
    from ablate.service.execution.runner import run_grid
    from ablate.service.specs.grids import load_grid

    grid = load_grid("tune_aninfonce", "smoke")
    outcome = run_grid(grid, storage=str(tmp_path), name="search", verbose=0)
    assert not outcome.failed
    study = optuna.load_study(study_name=grid.name, storage=optuna_journal(outcome.run_dir))
    finished = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    views = {v.name: v for v in optuna_views(outcome.run_dir, grid.name)}
    assert list(views) == VIEWS

    # history: one row per finished trial, in order, with the best R² so far (mode max)
    history = views["optimization_history"].data
    assert history["trial"].tolist() == [t.number for t in finished]
    assert history["value"].tolist() == [t.value for t in finished]
    assert history["best_so_far"].tolist() == history["value"].cummax().tolist()
    drawn = [trace for trace in views["optimization_history"].figure.data if trace.name == "Objective Value"]
    assert [list(trace.y) for trace in drawn] == [history["value"].tolist()], "the figure draws the same values"

    # parallel coordinates: every finished trial with every searched setting (list-valued choices as text)
    parallel = views["parallel_coordinate"].data
    assert len(parallel) == len(finished) and set(grid.optuna.space) <= set(parallel.columns)
    assert set(parallel["encoder_widths"]) <= {
        "[2,2]",
        "[2,4,2]",
    }  # list choices travel as compact JSON text (ablate.service.specs.params.JSON_CHOICES)

    # importances: computed for the searched settings (summing to 1), or skipped with a note, never a crash
    importances = views["param_importances"]
    if importances.figure is not None:
        assert set(importances.data["param"]) <= set(grid.optuna.space)
        assert math.isclose(importances.data["importance"].sum(), 1.0, rel_tol=1e-6)
    else:
        assert importances.note.startswith("skipped:")

    page = open(write_report(outcome.run_dir)).read()
    for name in VIEWS:
        assert f'data-kind="{name}"' in page
    assert "Optuna: optimisation history" in page and "Paper figure:" in page
