"""How Ray Tune searches a grid: a plain grid search, or Optuna (TPE) with ASHA, its study in RUN_DIR/optuna.db."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ablate.rundir import BEST_CONFIG_FILE, TRIAL_PREFIX, is_remote, optuna_storage_url
from ablate.service.grids import Grid, n_reports

__all__ = ["save_best", "trial_dirname", "tune_config"]


def trial_dirname(trial) -> str:
    """A trial's folder name in the run directory: ``trial_<id>``."""
    return f"{TRIAL_PREFIX}{trial.trial_id}"


def tune_config(grid: Grid, max_concurrent: int | None, run_dir: str | None = None):
    """Ray Tune's TuneConfig for ``grid``: every point once (grid search), or Optuna's TPE sampler with ASHA.

    An Optuna grid on local storage keeps its study in ``RUN_DIR/optuna.db`` (study name = grid name), so
    ``optuna.load_study``, optuna-dashboard and the report read it; remote runs keep it in memory.
    """
    from ray import tune

    if grid.search != "optuna":
        return tune.TuneConfig(
            reuse_actors=True, max_concurrent_trials=max_concurrent, trial_dirname_creator=trial_dirname
        )
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    opt = grid.optuna
    storage = None
    if run_dir is not None and not is_remote(run_dir):
        import optuna

        storage = optuna.storages.RDBStorage(optuna_storage_url(run_dir))
    searcher = OptunaSearch(
        metric=opt["metric"],
        mode=opt["mode"],
        seed=grid.seeds[0],
        storage=storage,
        study_name=grid.name if storage is not None else None,
    )
    limit = max_concurrent or opt.get("max_concurrent") or 2
    if "time_budget_s" in opt:  # rungs in seconds of training: settings compete at equal wall time
        scheduler = ASHAScheduler(
            time_attr="time_total_s",
            max_t=opt["time_budget_s"],
            grace_period=opt["grace_period"],
            reduction_factor=opt["reduction_factor"],
        )
    else:  # rungs in reports
        n_max = max(max(n_reports(t.config) for t in grid.trials), 1)
        scheduler = ASHAScheduler(
            time_attr="training_iteration",
            max_t=n_max,
            grace_period=min(opt["grace_period"], n_max),
            reduction_factor=opt["reduction_factor"],
        )
    return tune.TuneConfig(
        metric=opt["metric"],
        mode=opt["mode"],
        search_alg=ConcurrencyLimiter(searcher, max_concurrent=limit),
        scheduler=scheduler,
        num_samples=opt["num_samples"],
        reuse_actors=True,
        trial_dirname_creator=trial_dirname,
    )


def save_best(results, grid: Grid, run_dir: str) -> dict[str, Any] | None:
    """The best trial of an Optuna grid (metric, value, searched settings, steps); written to best_config.json."""
    opt = grid.optuna
    try:
        best = results.get_best_result(metric=opt["metric"], mode=opt["mode"], scope="last")
    except RuntimeError:
        return None
    if best is None or best.metrics is None:
        return None
    info = {
        "metric": opt["metric"],
        "mode": opt["mode"],
        "value": best.metrics.get(opt["metric"]),
        "config": {k: best.config[k] for k in opt["space"] if k in best.config},
        "steps": best.metrics.get("step"),
        "trial_id": best.metrics.get("trial_id"),
    }
    if not is_remote(run_dir):
        (Path(run_dir) / BEST_CONFIG_FILE).write_text(json.dumps(info, indent=1, default=str))
    return info
