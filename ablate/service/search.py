"""How Ray Tune searches a grid: a plain grid search, or Optuna (TPE) with ASHA, its study in RUN_DIR/optuna.db."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ablate.rundir import BEST_CONFIG_FILE, RESULT_FILE, TRIAL_PREFIX, is_remote, optuna_storage_url
from ablate.service.grids import Grid, n_reports
from ablate.service.params import flat_params

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
    assert opt is not None  # search: optuna
    storage = None
    if run_dir is not None and not is_remote(run_dir):
        import optuna

        storage = optuna.storages.RDBStorage(optuna_storage_url(run_dir))
    searcher = OptunaSearch(
        metric=opt.metric,
        mode=opt.mode,
        seed=grid.seeds[0],
        storage=storage,
        study_name=grid.name if storage is not None else None,
    )
    limit = max_concurrent or opt.max_concurrent or 2
    if opt.time_budget_s is not None:  # rungs in seconds of training: settings compete at equal wall time
        scheduler = ASHAScheduler(
            time_attr="time_total_s",
            max_t=opt.time_budget_s,
            grace_period=opt.grace_period,
            reduction_factor=opt.reduction_factor,
        )
    else:  # rungs in reports
        n_max = max(max(n_reports(t.config) for t in grid.trials), 1)
        scheduler = ASHAScheduler(
            time_attr="training_iteration",
            max_t=n_max,
            grace_period=min(opt.grace_period, n_max),
            reduction_factor=opt.reduction_factor,
        )
    return tune.TuneConfig(
        metric=opt.metric,
        mode=opt.mode,
        search_alg=ConcurrencyLimiter(searcher, max_concurrent=limit),
        scheduler=scheduler,
        num_samples=opt.num_samples,
        reuse_actors=True,
        trial_dirname_creator=trial_dirname,
    )


def seconds_to_target(trial_dir: str | Path, metric: str, target: float) -> tuple[float, int] | None:
    """(time_total_s, step) of a trial's first report with ``metric ≥ target``, from its result.json; None if never."""
    path = Path(trial_dir) / RESULT_FILE
    if not path.is_file():
        return None
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line
        value = row.get(metric)
        if isinstance(value, int | float) and value >= target:
            return float(row.get("time_total_s", float("nan"))), int(row.get("step", 0))
    return None


def save_best(results, grid: Grid, run_dir: str) -> dict[str, Any] | None:
    """The best trial of an Optuna grid (metric, value, searched settings, steps); written to best_config.json.

    A search with a target (``stop.target_r2`` and metric ``r2``) looks for the fastest way there: its best trial
    is the one that first reached the target in the fewest seconds of training (``time_total_s``); without a
    trial that reached it, or without a target, the best is the highest (``mode``) last value of the metric.
    """
    opt = grid.optuna
    assert opt is not None  # search: optuna
    target = grid.stop.target_r2
    fastest = None
    if target is not None and opt.metric == "r2" and not is_remote(run_dir):
        reached = []
        for result in results:
            hit = seconds_to_target(result.path, "r2", float(target)) if result.path else None
            if hit is not None and result.metrics:
                reached.append((hit[0], hit[1], result))
        if reached:
            fastest = min(reached, key=lambda r: r[0])
    if fastest is not None:
        seconds, step, best = fastest
        ranked_by = f"fewest seconds of training to r2 >= {target:g}"
    else:
        try:
            best = results.get_best_result(metric=opt.metric, mode=opt.mode, scope="last")
        except RuntimeError:
            return None
        seconds, step, ranked_by = None, None, f"{opt.mode} last {opt.metric}"
    if best is None or best.metrics is None:
        return None
    info = {
        "metric": opt.metric,
        "mode": opt.mode,
        "value": best.metrics.get(opt.metric),
        "config": {k: v for k, v in flat_params(best.config).items() if k in opt.space},
        "steps": best.metrics.get("step"),
        "trial_id": best.metrics.get("trial_id"),
        "ranked_by": ranked_by,
    }
    if seconds is not None:
        info.update({"seconds_to_target": seconds, "steps_to_target": step})
    if not is_remote(run_dir):
        (Path(run_dir) / BEST_CONFIG_FILE).write_text(json.dumps(info, indent=1, default=str))
    return info
