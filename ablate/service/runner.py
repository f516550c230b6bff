"""Runs a grid through Ray Tune: validation before Ray starts, the Tuner, storage, resume.

A run lives in ``<storage>/<name>`` (see :mod:`ablate.rundir` for its files). ``ray.init`` and the cluster
live in :mod:`ablate.service.cluster`, the search algorithm in :mod:`ablate.service.search`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Any

from ablate import __version__, ray_compat
from ablate.rundir import (
    INTERRUPTED_FILE,
    MARKER_TIME_FORMAT,
    RunError,
    check_writable,
    is_remote,
    read_marker,
    remove_file,
    resolve_run_dir,
    run_name,
    sweep_stale_temps,
    write_marker,
)
from ablate.service.cluster import init_ray
from ablate.service.driver_lock import one_driver
from ablate.service.grids import Grid, GridError
from ablate.service.integrity import mend_for_resume
from ablate.service.memory import check_memory
from ablate.service.outcome import RunOutcome, StorageFull, collect_outcome, full_disk, storage_full_message
from ablate.service.provenance import record_provenance
from ablate.service.same_run import check_same_run, run_record
from ablate.service.search import save_best, tune_config
from ablate.service.snapshots import BACKUP_DIR, DISCARDED_DIR, SnapshotError, choose_snapshot, has_snapshot
from ablate.service.trust import check_before_resume, check_key, sign_files

__all__ = [
    "probe_acceptance",
    "default_run_name",
    "has_run_state",
    "run_grid",
]

_log = logging.getLogger("ablate.runner")
#: Metrics shown in the live progress table.
PROGRESS_METRICS = ("step", "r2", "loss", "mcc")


def probe_acceptance(grid: Grid) -> None:
    """Fail before any compute when a trial's Λ/threshold/d makes the rejection sampler hopeless."""
    import torch

    from ablate.core.dgp import LowAcceptanceError, sample_conditional, sample_uniform

    seen = set()
    for trial in grid.trials:
        cfg = trial.config
        if cfg.conditional != "normal" or cfg.threshold is None:
            continue
        lams = [tuple(lam) for lam in cfg.lambda_ensemble]
        if cfg.lambda_negative is not None:
            lams.append(tuple(cfg.lambda_negative))
        for lam in lams:
            key = (lam, cfg.threshold)
            if key in seen:
                continue
            seen.add(key)
            gen = torch.Generator().manual_seed(0)
            z = sample_uniform(256, len(lam), generator=gen)
            try:
                sample_conditional(z, torch.tensor(lam), threshold=cfg.threshold, generator=gen)
            except LowAcceptanceError as exc:
                raise GridError(f"{grid.path}: trial {trial.label}: {exc}") from None


def _marker(grid: Grid) -> dict[str, Any]:
    """The run marker's content: the grid, its scale and preset, its YAML text, its axes and trial count."""
    return {
        "ablate_version": __version__,
        "grid": grid.name,
        "scale": grid.scale,
        "preset": grid.preset,
        "grid_file": str(grid.path),
        "grid_yaml": grid.text,
        "search": grid.search,
        "axes": grid.axis_names(),
        "variants": [v.name for v in grid.variants],
        "n_trials": grid.n_trials,
        "created": time.strftime(MARKER_TIME_FORMAT),
        **run_record(grid),  # the --set settings and resolved trials: --resume refuses another run
    }


def _callbacks(tensorboard: bool, local: bool) -> list:
    """Result loggers and the snapshot keeper. A local run directory gets ablate's append-only result log;
    remote storage (s3://, gs://) keeps Ray's JSON and CSV loggers, which reach it through Ray's sync."""
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    from ablate.service.callbacks import ResultLog, SnapshotKeeper

    cbs: list = [ResultLog(), SnapshotKeeper()] if local else [JsonLoggerCallback(), CSVLoggerCallback()]
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
    """A run's name when ``--name`` is not given (:func:`ablate.rundir.run_name`)."""
    return run_name(grid.name, grid.scale, grid.preset)


def has_run_state(storage: str, name: str) -> bool:
    """Whether ``<storage>/<name>`` holds a run that ``--resume`` can continue (local storage; remote: True)."""
    run_dir = resolve_run_dir(storage, name)
    return is_remote(run_dir) or has_snapshot(run_dir)


@one_driver(lambda grid, name: name or default_run_name(grid))
def run_grid(
    grid: Grid,
    *,
    storage: str = "runs",
    name: str | None = None,
    address: str | None = None,
    cpus_per_trial: float = 1,
    gpus_per_trial: float = 0,
    max_concurrent: int | None = None,
    resume: bool = False,
    keep_checkpoints: int = 2,
    max_failures: int = 2,
    tensorboard: bool = False,
    num_cpus: int | None = None,
    dashboard: bool = True,
    pack: int = 1,
    verbose: int = 1,
    on_start=None,
    trust_run_dir: bool = False,
) -> RunOutcome:
    """Run ``grid`` through Ray Tune (or resume it) and return each trial's end state.

    Everything is validated before Ray starts: the grid, the sampler's acceptance, the storage.
    ``on_start(run_dir, dashboard_url)`` is called once Ray is up (the CLI prints it). ``dashboard=False``
    starts a local Ray without its web dashboard (a headless machine, or a Ray installed without the dashboard's
    packages); joining a cluster (``address``) leaves the cluster's dashboard as it is.
    A resume unpickles only files ablate signed (:mod:`ablate.service.trust`); ``trust_run_dir`` vouches for
    a run directory copied from elsewhere (its files are signed instead of checked).
    ``pack`` > 1 trains up to that many grid points that share every shape and code path as one batched model
    per Ray trial (:mod:`ablate.service.pack_trainable`); each still gets its own trial folder. A resume keeps
    the packing the run started with.
    """
    run_name = name or default_run_name(grid)
    run_dir = resolve_run_dir(storage, run_name)
    if pack > 1 and grid.search != "grid":
        raise RunError(f"--pack {pack}: {grid.name} is an Optuna search; a search runs one setting per trial")
    probe_acceptance(grid)
    check_memory(grid, cpus_per_trial, gpus_per_trial, max_concurrent, address=address, num_cpus=num_cpus, pack=pack)
    check_writable(storage)
    local = not is_remote(run_dir)
    if local:
        check_key()
    set_aside: dict[str, str] = {}
    state_exists = local and has_snapshot(run_dir)
    if resume:
        if local and not Path(run_dir).exists():
            raise RunError(f"--resume: nothing to resume at {run_dir} (no such run)")
        info = read_marker(run_dir) if local else None
        if info is not None:
            check_same_run(info, grid, run_dir)  # the grid, its --set and its trials as the run started
        if local and not state_exists:
            raise RunError(f"--resume: nothing to resume at {run_dir} (no experiment state)")
        pack = int(info.get("pack", 1)) if info is not None else pack  # the trainable the run was made with
        if local:
            _swept(sweep_stale_temps(run_dir, (BACKUP_DIR,)))  # temporaries of writers killed earlier
            set_aside = _choose_snapshot(run_dir, trust_run_dir)
        check_before_resume(run_dir, trust_run_dir)  # before Ray unpickles anything
        mended = mend_for_resume(run_dir) if local else None  # each report once (ablate.service.integrity)
        if mended and mended.rewritten:
            sign_files(run_dir, mended.rewritten)
        remove_file(f"{run_dir}/{INTERRUPTED_FILE}")  # a driver runs the trials again
        if local:
            record_provenance(run_dir, "resume")
    elif state_exists:
        raise RunError(f"{run_dir} already holds a run: add --resume to continue it, or choose another --name")

    ray_compat.set_tune_environment(num_cpus)
    from ray import tune

    if pack > 1:
        from ablate.service.pack_trainable import PackTrainable as trainable_class
    else:
        from ablate.service.trainable import AblateTrainable as trainable_class
    if not resume:
        write_marker(run_dir, {**_marker(grid), "pack": pack})
        if local:
            record_provenance(run_dir, "start")
    ray_info = init_ray(address, num_cpus=num_cpus, dashboard=dashboard)
    ray_compat.reclaim_sigterm()  # Ray's crash handler took SIGTERM: Python's handler (the CLI's) again
    if on_start is not None:
        on_start(run_dir, ray_info["dashboard_url"])

    trainable = tune.with_resources(trainable_class, {"cpu": cpus_per_trial, "gpu": gpus_per_trial})
    started = time.time()
    if resume:
        tuner = tune.Tuner.restore(run_dir, trainable=trainable, resume_unfinished=True, resume_errored=True)
    else:
        tuner = tune.Tuner(
            trainable,
            param_space=grid.param_space(pack=pack),
            tune_config=tune_config(grid, max_concurrent, run_dir),
            run_config=tune.RunConfig(
                name=run_name,
                storage_path=storage if is_remote(storage) else str(Path(storage).expanduser().resolve()),
                checkpoint_config=tune.CheckpointConfig(
                    num_to_keep=keep_checkpoints, checkpoint_frequency=1, checkpoint_at_end=True
                ),
                failure_config=tune.FailureConfig(max_failures=max_failures),
                callbacks=_callbacks(tensorboard, local),
                progress_reporter=_reporter(grid),
                verbose=verbose,
            ),
        )
    if local and not resume:
        sign_files(run_dir, [Path(run_dir, ray_compat.TUNER_FILE)])  # Ray has just written it
    guard = ray_compat.refuse_silent_restart(_restore_failed(run_dir)) if resume else contextlib.nullcontext()
    try:
        with guard, ray_compat.graceful_interrupt() as interrupted, ray_compat.hide_full_disk_tracebacks(_full_warning):
            results = tuner.fit()
    except Exception as exc:  # a full disk in the driver (a callback, a snapshot) ends Tune with a traceback
        full = full_disk(exc)
        if full is None:
            raise
        raise StorageFull(storage_full_message(full, run_dir)) from exc
    outcome = collect_outcome(
        results, grid, run_dir, stop_signal=interrupted(), pack=pack, wall_s=time.time() - started, set_aside=set_aside
    )
    if grid.search == "optuna":
        outcome.best_config = save_best(results, grid, run_dir)
    return outcome


def _swept(paths: list[str]) -> None:
    if paths:
        _log.warning("--resume: removed %d temporary file(s) of killed writers: %s", len(paths), ", ".join(paths))


def _full_warning(line: str) -> None:
    _log.warning("the storage is full (%s); trials that cannot save are retried, then stop", line)


def _choose_snapshot(run_dir: str, trust: bool = False) -> dict[str, str]:
    """Resume from the newest complete snapshot; say which torn files were set aside and why."""
    try:
        choice = choose_snapshot(run_dir, trust)
    except SnapshotError as exc:
        raise RunError(f"--resume: {exc}") from exc
    if choice.discarded:
        source = f"ablate's backup in {BACKUP_DIR}/" if choice.from_backup else "the run directory"
        _log.warning(
            "--resume: the newest snapshot was torn by a kill (%s); moved %s to %s/ and resuming from "
            "session %s as saved in %s",
            "; ".join(sorted(set(choice.discarded.values()))),
            ", ".join(choice.discarded),
            Path(run_dir, DISCARDED_DIR),
            choice.session,
            source,
        )
    return choice.discarded


def _restore_failed(run_dir: str):
    def fail(exc: BaseException | None) -> None:
        cause = f" ({type(exc).__name__}: {exc})" if exc is not None else ""
        raise RunError(
            f"--resume: Ray could not read the experiment state in {run_dir}{cause}; "
            "stopped instead of restarting the grid from scratch"
        )

    return fail
