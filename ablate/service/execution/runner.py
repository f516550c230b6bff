"""Runs a grid through Ray Tune: validation before Ray starts, the plan from the run's own files, the Tuner.

A run lives in ``<storage>/<name>`` (see :mod:`ablate.service.records.rundir` for its files). What a run does to it is decided
from ablate's files alone (:mod:`ablate.service.records.plan`); each run is one fresh Ray Tune experiment over the work
that remains, and nothing Ray writes is read back. ``ray.init`` and the cluster live in
:mod:`ablate.service.execution.cluster`, the search algorithm in :mod:`ablate.service.execution.search`.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections import Counter
from typing import Any

from ablate import ray_compat
from ablate.service.execution.cluster import init_ray
from ablate.service.execution.options import RunOptions
from ablate.service.execution.preflight import CheckedRun, prepare_run
from ablate.service.execution.probes import grid_plugins, probe_acceptance, probe_plugins
from ablate.service.execution.retries import Retries, run_again, units_left
from ablate.service.execution.search import check_study, close_study, open_study, save_best, tune_config
from ablate.service.records.driver_lock import one_driver
from ablate.service.records.outcome import RunOutcome, StorageFull, collect_outcome, full_disk, storage_full_message
from ablate.service.records.plan import Plan, check_trial_folders, plan_run
from ablate.service.records.provenance import record_provenance
from ablate.service.records.reader import read_marker
from ablate.service.records.run_marker import marker_after
from ablate.service.records.rundir import (
    DRIVER_LOCK,
    INTERRUPTED_FILE,
    RUN_MARKER,
    RunError,
    resolve_run_dir,
    run_name,
    write_marker,
)
from ablate.service.records.store import as_store
from ablate.service.specs.grids import Grid
from ablate.service.specs.params import RECORD_KEY

__all__ = [
    "probe_acceptance",
    "probe_plugins",
    "grid_plugins",
    "default_run_name",
    "has_run_state",
    "run_grid",
]

_log = logging.getLogger("ablate.runner")
#: Metrics shown in the live progress table.
PROGRESS_METRICS = ("step", "r2", "loss", "mcc")


def _callbacks(tensorboard: bool, check, retries: Retries) -> list:
    """ablate's result log (:class:`ablate.service.execution.callbacks.ResultLog`, which runs ``check()`` before it
    writes and tells ``retries`` of Ray's), and TensorBoard's if asked for."""
    from ablate.service.execution.callbacks import ResultLog

    cbs: list = [ResultLog(check, retries)]
    if tensorboard:
        from ray.tune.logger import TBXLoggerCallback

        cbs.append(TBXLoggerCallback())
    return cbs


def _reporter(grid: Grid):
    from ray.tune import CLIReporter

    if grid.search == "optuna":  # the searched settings and the seed sit at the top of a suggested config
        params = {k: k for k in [*grid.optuna.space, "seed"]}
    else:  # grid points travel whole (Grid.param_space)
        params = {f"point/{k}": k for k in grid.axis_names()}
        if "point/variant" in params:
            params["point/variant/name"] = "variant"
            del params["point/variant"]
    return CLIReporter(
        metric_columns={m: m for m in PROGRESS_METRICS},
        parameter_columns=params,
        max_report_frequency=30,
        print_intermediate_tables=True,
        sort_by_metric=False,
        max_progress_rows=40,
    )


def default_run_name(grid: Grid) -> str:
    """A run's name when ``--name`` is not given (:func:`ablate.service.records.rundir.run_name`)."""
    return run_name(grid.name, grid.scale, grid.preset)


def has_run_state(storage: str, name: str) -> bool:
    """Whether ``<storage>/<name>`` holds a run (its marker) that ``--resume`` can continue."""
    return as_store(resolve_run_dir(storage, name)).exists(RUN_MARKER)


def run_grid(
    grid: str | os.PathLike[str] | Grid | CheckedRun,
    options: RunOptions | None = None,
    *,
    on_start=None,
    on_plan=None,
    trainable=None,
    num_cpus: int | None = None,
    **fields: Any,
) -> RunOutcome:
    """Run ``grid`` into the run directory ``<storage>/<name>`` through Ray Tune and return each trial's end state.

    The run directory is the record (:mod:`ablate.service.records.plan`): a point whose trial finished is reused, one that
    has reports continues from its newest checkpoint, a new one starts; one fresh Ray Tune experiment runs what
    remains. So a first run, ``resume``, more seeds, a new axis value, another variant, a higher ``max_steps``
    or a ``--set`` that makes new points are the same call; ``resume`` only insists that the run exists.

    ``grid``: a shipped grid's name or a grid file, loaded at the options' scale; or a :class:`Grid` (as
    :func:`ablate.service.specs.grids.load_grid` gives it), which keeps the scale it was loaded at (a different
    ``scale`` is refused); or a :class:`ablate.service.execution.preflight.CheckedRun`, resolved and checked already
    (`ablate run` passes one), which carries its options. ``options``
    (:class:`ablate.service.execution.options.RunOptions`; ``fields`` are set over them, e.g.
    ``run_grid("batch_vs_dim", scale="smoke", storage="runs", name="try1", preset="fast", max_failures=0)``) say
    what and where: their preset, ``settings`` (``--set KEY=VALUE``) and ``variants`` apply to the grid
    (:func:`ablate.service.specs.resolve.resolve_grid`; a Grid handed in is not changed). Everything is validated
    before Ray starts, once (:func:`ablate.service.execution.preflight.check_run`): the grid with its options, the
    pack size, the plugins, the sampler's acceptance, the memory, the storage.
    ``on_plan(plan)`` is called once the plan is made and ``on_start(run_dir, dashboard_url)`` once Ray is up (the
    CLI prints both). ``dashboard=False`` starts a local Ray without its web dashboard. ``pack`` > 1 trains up to
    that many grid points that share every shape and code path as one batched model per Ray trial; a run keeps
    the packing it started with. ``trainable``: the Trainable class to run (tests pass a subclass that injects
    faults); by default ablate's own.
    """
    if isinstance(grid, CheckedRun):
        if options is not None or fields or num_cpus is not None:
            raise TypeError("run_grid: a CheckedRun carries its options; check the grid again with the ones you want")
        checked = grid
    else:
        checked = prepare_run(grid, options, num_cpus=num_cpus, note=_log.info, **fields)
    return _run_locked(
        checked.grid,
        checked.options,
        pack=checked.pack,
        num_cpus=checked.num_cpus,
        on_start=on_start,
        on_plan=on_plan,
        trainable=trainable,
    )


@one_driver(lambda grid, opts: resolve_run_dir(opts.storage, opts.name or default_run_name(grid)))
def _run_locked(
    grid: Grid, opts: RunOptions, *, pack: int, num_cpus: int | None, on_start, on_plan, trainable, check
) -> RunOutcome:
    """Run a checked grid (:class:`CheckedRun`'s parts) holding the run directory's driver lock: open the record,
    plan the run into it, let Ray Tune train what the plan left, and read the outcome back from the record.
    ``check()`` raises when the driver may no longer write the run (its lease on object storage was lost)."""
    run_dir = resolve_run_dir(opts.storage, opts.name or default_run_name(grid))
    exists, pack = _open_record(grid, opts, run_dir, pack)
    plan = _plan_into(grid, opts, run_dir, pack, exists)
    if on_plan is not None and plan is not None:
        on_plan(plan)
    started = time.time()
    if plan is not None and not plan.units:  # every point finished already: nothing for Ray to do
        return collect_outcome(grid, run_dir, plan, stop_signal=0, pack=pack, wall_s=0.0, errors={})
    retries, settings = Retries(opts.max_failures), _plan_settings(opts, pack)
    todo, errors = plan, {}
    while True:  # a grid's units whose process or node died run again (:mod:`.retries`); a search's do not
        results, stop_signal, failed = _fit(
            grid, opts, run_dir, todo, pack, num_cpus, trainable, on_start, check, retries
        )
        errors.update({_record_id(r.config): r.error for r in results if r.error is not None})
        if todo is None or stop_signal:
            break
        left = units_left(grid, run_dir, todo, **settings)
        again = retries.again({u[RECORD_KEY]["id"] for u in left.units}, failed)
        if not again:
            break
        check()
        why = Counter(retries.retried[u][-1] for u in again)
        _log.warning("%d trial(s) run again: %s", len(again), ", ".join(f"{n}× {w}" for w, n in why.items()))
        for unit in again:
            errors.pop(unit, None)
        todo, on_start = run_again(left, again, run_dir), None
        retries.redone += todo.redone
    check()
    outcome = collect_outcome(
        grid, run_dir, plan, stop_signal=stop_signal, pack=pack, wall_s=time.time() - started, errors=errors
    )
    outcome.retried, outcome.redone = retries.retried, retries.redone
    if grid.search == "optuna":
        outcome.best_config = save_best(grid, run_dir)
    return outcome


def _open_record(grid: Grid, opts: RunOptions, run_dir: str, pack: int) -> tuple[bool, int]:
    """Check that ``run_dir`` may take this run (a run of the same kind, or a new folder; ``--resume`` only where a
    run is) and tidy what a killed driver left. Returns (whether the run existed, the pack size: the one the run
    was made with, where it exists)."""
    store = as_store(run_dir)
    entries = _entries(store)  # the storage was found writable as the driver lock was taken
    exists = RUN_MARKER in entries
    foreign = any(name != DRIVER_LOCK for name in entries)
    if not exists and foreign:
        raise RunError(
            f"{run_dir}: not an ablate run directory (no {RUN_MARKER}); ablate writes only into runs it made: "
            "choose another --name or --storage"
        )
    if opts.resume and not exists:
        raise RunError(f"--resume: nothing to resume at {run_dir} (no such run)")
    if exists:
        before = read_marker(run_dir)
        if before.get("search", "grid") != grid.search:
            kinds = {"grid": "a grid search", "optuna": "an Optuna search"}
            raise RunError(
                f"{run_dir} holds {kinds.get(before.get('search', 'grid'), 'a run')} of {before.get('grid')}; "
                f"{grid.name} is {kinds[grid.search]}: choose another --name"
            )
        recorded = int(before.get("pack", 1))
        if recorded != pack:
            _log.warning(
                "%s was run with --pack %d: it keeps that packing (--pack %d ignored)", run_dir, recorded, pack
            )
            pack = recorded
        check_trial_folders(run_dir)
        _swept(store.sweep_temporaries())  # what writers killed earlier left (on disk their temporaries)
        if grid.search == "optuna":
            check_study(run_dir)
    store.delete(INTERRUPTED_FILE)  # a driver runs the trials again
    return exists, pack


def _entries(store) -> list[str]:
    """The names in the run directory (files and folders, but a write's temporaries): [] for none."""
    return store.list(dirs=False) + store.list(dirs=True)


def _plan_into(grid: Grid, opts: RunOptions, run_dir: str, pack: int, exists: bool) -> Plan | None:
    """A grid's plan, written into the run (None for a search: Optuna suggests its trials as it goes), then the
    marker and this start's provenance."""
    plan = None
    if grid.search == "grid":  # a search's trials send every report: its scheduler and searcher judge each
        plan = plan_run(grid, run_dir, **_plan_settings(opts, pack))
    write_marker(run_dir, marker_after(grid, run_dir, plan, pack))
    record_provenance(run_dir, "resume" if exists else "start", plugins=grid_plugins(grid))
    return plan


def _plan_settings(opts: RunOptions, pack: int) -> dict[str, Any]:
    """The options a plan of the run is made with (:func:`ablate.service.records.plan.plan_run`)."""
    return {
        "pack": pack,
        "keep": opts.keep_checkpoints,
        "every": opts.checkpoint_every,
        "results_every": opts.results_every,
    }


def _fit(
    grid: Grid,
    opts: RunOptions,
    run_dir: str,
    plan: Plan | None,
    pack: int,
    num_cpus,
    trainable,
    on_start,
    check,
    retries: Retries,
) -> tuple[Any, int, dict[str, tuple[int, str | None]]]:
    """Start (or join) Ray and let Tune train the plan's units or the search's trials; (Tune's results, the
    signal that stopped the run or 0, each unit that failed for good: Tune's count of its failures, its error's text)."""
    ray_compat.set_tune_environment(num_cpus)
    from ray import tune

    if trainable is None and pack > 1:
        from ablate.service.execution.pack_trainable import PackTrainable as trainable
    elif trainable is None:
        from ablate.service.execution.trainable import AblateTrainable as trainable
    ray_info = init_ray(opts.address, num_cpus=num_cpus, dashboard=opts.dashboard)
    ray_compat.reclaim_sigterm()  # Ray's crash handler took SIGTERM: Python's handler (the CLI's) again
    if on_start is not None:
        on_start(run_dir, ray_info["dashboard_url"])

    # Ray Tune's own files (its experiment snapshots, each trial's error.txt/error.pkl) go to a folder of the
    # driver's, never into the run directory: nothing Ray writes is part of the record, and a full run directory
    # cannot tear a file Ray reads back. No Ray checkpoints and no synced artifacts: no worker writes there.
    run_name = opts.name or default_run_name(grid)
    study = open_study(grid, run_dir, check)
    ray_storage = tempfile.mkdtemp(prefix=f"ablate-tune-{run_name}-")
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": opts.cpus_per_trial, "gpu": opts.gpus_per_trial or 0.0}),
        param_space=_param_space(grid, plan, run_dir, opts.keep_checkpoints, opts.checkpoint_every),
        tune_config=tune_config(
            grid,
            opts.max_concurrent,
            run_dir,
            n_samples=_samples_left(grid, run_dir, study),
            units=_units(grid, plan),
            study=study,
        ),
        run_config=tune.RunConfig(
            name=run_name,
            storage_path=ray_storage,
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=0, checkpoint_at_end=False),
            failure_config=tune.FailureConfig(max_failures=opts.max_failures),
            callbacks=(callbacks := _callbacks(opts.tensorboard, check, retries)),
            progress_reporter=_reporter(grid),
            verbose=opts.verbose,
        ),
    )
    try:
        with (
            ray_compat.graceful_interrupt() as interrupted,
            ray_compat.hide_full_disk_tracebacks(_full_warning),
            ray_compat.hide_tune_resume_hint(),
        ):
            results = tuner.fit()
    except Exception as exc:  # a full disk in the driver (the result log) ends Tune with a traceback
        full = full_disk(exc)
        if full is None:
            raise
        raise StorageFull(storage_full_message(full, run_dir)) from exc
    finally:
        if opts.tensorboard:
            _log.warning("TensorBoard's event files: %s", ray_storage)
        else:
            shutil.rmtree(ray_storage, ignore_errors=True)
    close_study(study)  # on object storage: the reports told last (each trial's start and end are uploaded)
    return results, interrupted(), callbacks[0].failed


def _param_space(grid: Grid, plan: Plan | None, run_dir: str, keep: int, every: float = 0.0) -> dict[str, Any]:
    """A search's space with the record's folder (each trial's id follows from its settings); a grid's units are
    handed to Tune one at a time by :class:`ablate.service.execution.search.UnitSearcher`, so its space is empty."""
    if plan is not None:
        return {}
    space = grid.param_space()
    metric = grid.optuna.metric if grid.optuna is not None else None  # a trial that fails reports it (as NaN)
    space[RECORD_KEY] = {"dir": run_dir, "keep": keep, "every": every, "shown": grid.axis_names(), "metric": metric}
    return space


def _units(grid: Grid, plan: Plan | None) -> list[dict[str, Any]] | None:
    """The trial configs of a grid's units (points or packs), in the plan's order; None for a search."""
    if plan is None:
        return None
    return [{"grid": grid.name, "scale": grid.scale, "point": unit} for unit in plan.units]


def _record_id(config: dict[str, Any] | None) -> str | None:
    from ablate.service.execution.search import record_of

    record = record_of(config or {})
    return None if record is None else record["id"]


def _samples_left(grid: Grid, run_dir: str, study=None) -> int | None:
    """An Optuna search's samples still to run: its budget less the trials its study finished (None: a grid); the
    trials a stopped driver left running are among them (evaluated again first, :mod:`.search`)."""
    if grid.search != "optuna":
        return None
    from ablate.service.execution.search import finished_samples

    return max(grid.n_trials - finished_samples(grid, run_dir, study), 0)


def _swept(paths: list[str]) -> None:
    if paths:
        _log.warning("removed %d temporary file(s) of killed writers: %s", len(paths), ", ".join(paths))


def _full_warning(line: str) -> None:
    _log.warning("the storage is full (%s); trials that cannot save are retried, then stop", line)
