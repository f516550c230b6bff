"""Optuna's own views of an Optuna grid's study (RUN_DIR/optuna.journal, or an earlier run's optuna.db; study name =
grid name), beside ablate's panels.

Three views, each computed as a plain DataFrame first (what the tests assert on), then drawn with
:mod:`optuna.visualization`: the optimisation history, the parameters' importances and the parallel
coordinates of the trials. A view that cannot be computed (e.g. importances with fewer than two finished
trials) is skipped with a note; it never stops the report. Optuna and its plots are imported only here,
and only when the study file exists.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ablate.service.records.rundir import has_study, study_file

__all__ = ["OptunaView", "load_study", "optuna_views"]

_log = logging.getLogger("ablate.reports")


@dataclass
class OptunaView:
    """One of Optuna's views: its data, its figure (None when skipped) and, when skipped, why."""

    name: str
    title: str
    describe: str
    data: pd.DataFrame
    figure: Any = None
    note: str = ""


def load_study(run_dir: str | Path, study_name: str):
    """The run's Optuna study, or None when the run has no study file (:mod:`ablate.service.records.study`)."""
    if not has_study(run_dir):
        return None
    import optuna

    from ablate.service.records.study import load_study as load_run_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return load_run_study(run_dir, study_name)


def _finished(study) -> list:
    import optuna

    return [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None]


def history_data(study) -> pd.DataFrame:
    """One row per finished trial in order: its number, objective value, and the best value so far."""
    trials = _finished(study)
    values = pd.Series([float(t.value) for t in trials], dtype=float)
    maximize = study.direction.name == "MAXIMIZE"
    best = values.cummax() if maximize else values.cummin()
    return pd.DataFrame({"trial": [t.number for t in trials], "value": values, "best_so_far": best})


def importance_data(study) -> pd.DataFrame:
    """Each searched parameter's importance for the objective (Optuna's default evaluator), largest first."""
    import optuna

    importances = optuna.importance.get_param_importances(study)
    return pd.DataFrame({"param": list(importances), "importance": [float(v) for v in importances.values()]})


def parallel_data(study) -> pd.DataFrame:
    """One row per finished trial: its number, objective value and every parameter (lists as text)."""
    rows = []
    for t in _finished(study):
        params = {k: (str(v) if isinstance(v, list | tuple | dict) else v) for k, v in t.params.items()}
        rows.append({"trial": t.number, "value": float(t.value), **params})
    return pd.DataFrame(rows)


#: name → (title, description, data function, Optuna's plot function name)
_VIEWS = {
    "optimization_history": (
        "Optuna: optimisation history",
        "The objective of every finished trial, in the order Optuna proposed them, and the best value so far.",
        history_data,
        "plot_optimization_history",
    ),
    "param_importances": (
        "Optuna: parameter importances",
        "How much each searched setting explains the objective (Optuna's default importance evaluator).",
        importance_data,
        "plot_param_importances",
    ),
    "parallel_coordinate": (
        "Optuna: parallel coordinates",
        "Every finished trial as a line through its settings and its objective.",
        parallel_data,
        "plot_parallel_coordinate",
    ),
}


def optuna_views(run_dir: str | Path, study_name: str) -> list[OptunaView]:
    """Optuna's views of the run's study; empty when there is no study file. A view that fails is kept with a
    note saying why (and no figure); it never raises."""
    try:
        study = load_study(run_dir, study_name)
    except Exception as exc:  # noqa: BLE001 - a damaged or foreign study file must not stop the report
        return [
            OptunaView(
                "study",
                "Optuna study",
                "",
                pd.DataFrame(),
                None,
                f"the study in {study_file(run_dir)} could not be opened ({type(exc).__name__}: {exc})",
            )
        ]
    if study is None:
        return []
    import optuna.visualization as vis

    views = []
    for name, (title, describe, data_fn, plot_name) in _VIEWS.items():
        view = OptunaView(name, title, describe, pd.DataFrame())
        try:
            with warnings.catch_warnings(record=True) as caught:  # e.g. "too few trials: importances are equal"
                warnings.simplefilter("always")
                view.data = data_fn(study)
                if view.data.empty:
                    raise ValueError("no finished trial yet")
                view.figure = getattr(vis, plot_name)(study)
            view.note = "; ".join(
                dict.fromkeys(f"Optuna: {w.message}" for w in caught if not issubclass(w.category, DeprecationWarning))
            )
        except Exception as exc:  # noqa: BLE001 - e.g. importances need two finished trials with varied settings
            view.figure = None
            view.note = f"skipped: {type(exc).__name__}: {exc}"
            _log.info("Optuna view %s skipped: %s", name, exc)
        views.append(view)
    return views
