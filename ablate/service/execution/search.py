"""How Ray Tune searches a grid: a plain grid search, or Optuna (TPE) with ASHA, its study in the run directory
(Optuna's journal ``optuna.journal``: :mod:`ablate.service.records.study`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ablate.service.records.record import RunRecord, folder_name
from ablate.service.records.trial import record_of
from ablate.service.records.trial_log import ERROR_KEY
from ablate.service.specs.grids import Grid, n_reports

__all__ = [
    "check_study",
    "close_study",
    "finished_samples",
    "open_study",
    "save_best",
    "trial_dirname",
    "tune_config",
    "unfinished_points",
    "unit_searcher",
]


def trial_dirname(trial) -> str:
    """A trial's folder name in the run directory: ``trial_<record id>`` (:func:`ablate.service.records.trial.record_of`)."""
    record = record_of(trial.config)
    return folder_name(record["id"] if record is not None else trial.trial_id)


def _study(grid: Grid, run_dir: str, storage=None):
    """The search's Optuna study in the run directory (study name = grid name), or None when there is none yet.
    ``storage``: the study's storage already open in this driver (:func:`ablate.service.records.study.study_storage`)."""
    from ablate.service.records.study import load_study

    return load_study(run_dir, grid.name, storage)


def open_study(grid: Grid, run_dir: str, check: Callable[[], None] | None = None):
    """A search's study storage, opened once for the driver (None for a grid search): on object storage its writes
    ask ``check()`` first, which raises when the driver lost its lease (:mod:`ablate.service.records.study`)."""
    if grid.search != "optuna":
        return None
    from ablate.service.records.study import study_storage

    return study_storage(run_dir, check=check)


def close_study(storage) -> None:
    """Upload what the driver's study holds and its file does not yet (:func:`open_study`; None: nothing)."""
    if storage is not None:
        from ablate.service.records.study import flush_study

        flush_study(storage)


def check_study(run_dir: str) -> None:
    """Refuse to go on with a search whose study (``optuna.journal``; ``optuna.db`` in an earlier version's run) is gone while
    its trial folders are not: a new study would know nothing of them, suggest their settings again and train on
    trials ASHA had stopped, mixing two searches in one record. Raises
    :class:`ablate.service.records.rundir.RunError`."""
    from ablate.service.records.rundir import RunError, has_study, study_file

    if has_study(run_dir):
        return
    trials = list(RunRecord(run_dir).trials())
    if trials:
        name = study_file(run_dir)
        raise RunError(
            f"{run_dir}: {name} is missing but {len(trials)} trial folder(s) of the search are here: the study "
            f"that ranked them is gone, and a new one would mix with them; put {name} back, or run the search "
            "under another --name"
        )


def finished_samples(grid: Grid, run_dir: str, storage=None) -> int:
    """Trials of the search's study that ended (complete, pruned or failed): they count against its budget."""
    study = _study(grid, run_dir, storage)
    if study is None:
        return 0
    import optuna

    done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)
    replaced = set(study.user_attrs.get(_CONTINUED, []))
    return sum(t.state in done and t.number not in replaced for t in study.get_trials(deepcopy=False))


#: The study's user attribute listing the numbers of trials a stopped driver left RUNNING, closed as FAIL when a
#: later run continued them (as new trials, in the same trial folders): the budget counts each setting once.
_CONTINUED = "ablate_continued"


def unfinished_points(grid: Grid, run_dir: str, storage=None) -> list[dict[str, Any]]:
    """The settings of the study's trials a stopped driver left RUNNING, closed here (FAIL, marked continued): the
    search asks Optuna to evaluate them again first, and each continues in its trial folder from its checkpoint."""
    study = _study(grid, run_dir, storage)
    if study is None:
        return []
    import optuna

    space = set(grid.optuna.space) if grid.optuna is not None else set()
    points, closed = [], list(study.user_attrs.get(_CONTINUED, []))
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if set(trial.params) >= space:  # a kill mid-suggestion leaves a trial with some of its settings: never ran
            points.append(dict(trial.params))
        closed.append(trial.number)
        study.set_user_attr(_CONTINUED, closed)
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
    return points


def unit_searcher(units: list[dict[str, Any]]):
    """A Ray Tune ``Searcher`` that suggests ``units`` (trial configs), each once, in order, then finishes.

    A grid's units are not a ``tune.grid_search``: Tune's grid expansion deep-copies the whole space, all the
    units included, for every trial it makes, so making n trials costs n² (a 10 000-point grid had no trial
    started after 150 s on 2 cores). Handing one unit per suggestion costs n.
    """
    from ray.tune.search import Searcher

    class UnitSearcher(Searcher):
        def __init__(self):
            super().__init__()
            self._next = 0

        def suggest(self, trial_id: str) -> dict[str, Any] | None:
            if self._next >= len(units):
                return Searcher.FINISHED
            self._next += 1
            return units[self._next - 1]

        def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
            pass

        def save(self, checkpoint_path: str) -> None:  # the run directory is the record: nothing to save
            pass

        def restore(self, checkpoint_path: str) -> None:
            pass

    return UnitSearcher()


def _optuna_search(**kwargs: Any):
    """Ray's ``OptunaSearch`` that tells the study a trial whose loss went non-finite (its last report holds
    :data:`ablate.service.records.trial_log.ERROR_KEY`) FAILED, as for a trial that raised, not a value of NaN."""
    from ray.tune.search.optuna import OptunaSearch

    class RecordOptunaSearch(OptunaSearch):
        def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
            if result and result.get(ERROR_KEY):
                result, error = None, True
            super().on_trial_complete(trial_id, result=result, error=error)

    return RecordOptunaSearch(**kwargs)


def tune_config(
    grid: Grid,
    max_concurrent: int | None,
    run_dir: str | None = None,
    n_samples: int | None = None,
    units: list[dict[str, Any]] | None = None,
    study=None,
):
    """Ray Tune's TuneConfig for ``grid``: its ``units`` once each (a grid, :func:`unit_searcher`), or Optuna's
    TPE sampler with ASHA.

    An Optuna grid keeps its study in the run directory (study name = grid name; Optuna's journal
    ``optuna.journal``), so ``optuna.load_study``, optuna-dashboard and the report read it, and a
    later run of the search continues it: ``n_samples`` (the budget less the trials the study finished) are run,
    first the trials a stopped driver left running (each continues from its checkpoint), then new ones. ``study``:
    the study's storage the driver opened (:func:`ablate.service.records.study.study_storage`), else one is opened
    here.
    """
    from ray import tune

    if grid.search != "optuna":
        if units is None:
            raise ValueError(f"{grid.name}: a grid search runs its plan's units; none given")
        return tune.TuneConfig(
            search_alg=unit_searcher(units),
            num_samples=len(units),
            reuse_actors=True,
            max_concurrent_trials=max_concurrent,
            trial_dirname_creator=trial_dirname,
        )
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search import ConcurrencyLimiter

    opt = grid.optuna
    assert opt is not None  # search: optuna
    storage, again, tried = None, [], 0
    if run_dir is not None:
        from ablate.service.records.study import study_storage

        storage = study if study is not None else study_storage(run_dir)
        again = unfinished_points(grid, run_dir, storage)
        found = _study(grid, run_dir, storage)
        tried = 0 if found is None else len(found.get_trials(deepcopy=False))
    searcher = _optuna_search(
        metric=opt.metric,
        mode=opt.mode,
        # a later run of the search draws on from where the study is: with the first run's seed, the sampler's
        # random start would suggest the settings it suggested then, again (an unbroken search is unchanged)
        seed=grid.seeds[0] + tried,
        storage=storage,
        study_name=grid.name if storage is not None else None,
        points_to_evaluate=again or None,
    )
    limit = max_concurrent or opt.max_concurrent or 2
    if opt.time_budget_s is not None:  # rungs in seconds of training: settings compete at equal wall time
        asha = {"time_attr": "time_total_s", "max_t": opt.time_budget_s, "grace_period": opt.grace_period}
    else:  # rungs in reports
        n_max = max(max(n_reports(t.config) for t in grid.trials), 1)
        asha = {"time_attr": "training_iteration", "max_t": n_max, "grace_period": min(opt.grace_period, n_max)}
    asha["reduction_factor"] = opt.reduction_factor
    if run_dir is not None:  # the rungs of the search so far, from its trials' logs (:mod:`.rungs`)
        from ablate.service.execution.rungs import RecordASHA

        scheduler = RecordASHA(run_dir, grid.name, **asha)
    else:
        scheduler = ASHAScheduler(**asha)
    samples = opt.num_samples if n_samples is None else n_samples
    return tune.TuneConfig(
        metric=opt.metric,
        mode=opt.mode,
        search_alg=ConcurrencyLimiter(searcher, max_concurrent=limit),
        scheduler=scheduler,
        num_samples=samples,  # the continued trials are part of the budget left: evaluated first
        # no actor reuse: a trial ASHA stops ends its actor, which lets go of its folder's lock; a cached actor kept
        # it, and a later suggestion of the same setting waited for it forever while holding a CPU itself
        reuse_actors=False,
        trial_dirname_creator=trial_dirname,
    )


def seconds_to_target(rows: list[dict[str, Any]], metric: str, target: float) -> tuple[float, int] | None:
    """(time_total_s, step) of the first of a trial's reports (its log's rows) with ``metric ≥ target``; None if
    never."""
    for row in rows:
        value = row.get(metric)
        if isinstance(value, int | float) and value >= target:
            return float(row.get("time_total_s", float("nan"))), int(row.get("step", 0))
    return None


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def save_best(grid: Grid, run_dir: str) -> dict[str, Any] | None:
    """The best trial of an Optuna grid (metric, value, searched settings, steps), from the run's trial folders;
    written to best_config.json.

    A search with a target (``stop.target_r2`` and metric ``r2``) looks for the fastest way there: its best trial
    is the one that first reached the target in the fewest seconds of training (``time_total_s``); without a
    trial that reached it, or without a target, the best is the highest (``mode``) last value of the metric.
    """
    from ablate.service.records.reader import RunReader

    opt = grid.optuna
    assert opt is not None  # search: optuna
    reader = RunReader(run_dir)
    trials = []
    for name in reader.trial_dirs():
        rows = reader.results(name)
        params = reader.params(name) or {}
        if rows:
            trials.append((name, params, rows))
    target = grid.stop.target_r2
    fastest = None
    if target is not None and opt.metric == "r2":
        reached = []
        for name, params, _rows in trials:
            hit = seconds_to_target(_rows, "r2", float(target))
            if hit is not None:
                reached.append((hit[0], hit[1], name, params, _rows))
        if reached:
            fastest = min(reached, key=lambda r: r[0])
    if fastest is not None:
        seconds, step, name, params, rows = fastest
        ranked_by = f"fewest seconds of training to r2 >= {target:g}"
    else:
        scored = [t for t in trials if _finite(t[2][-1].get(opt.metric)) and not t[2][-1].get(ERROR_KEY)]
        if not scored:
            return None
        pick = max if opt.mode == "max" else min
        name, params, rows = pick(scored, key=lambda t: t[2][-1][opt.metric])
        seconds, step, ranked_by = None, None, f"{opt.mode} last {opt.metric}"
    last = rows[-1]
    info = {
        "metric": opt.metric,
        "mode": opt.mode,
        "value": last.get(opt.metric),
        "config": {k: v for k, v in params.items() if k in opt.space},
        "steps": last.get("step"),
        "trial_id": reader.trial_id(name),
        "ranked_by": ranked_by,
    }
    if seconds is not None:
        info.update({"seconds_to_target": seconds, "steps_to_target": step})
    RunRecord(run_dir).write_best(info)
    return info
