"""Runs a grid through Ray Tune: validation before Ray starts, the Tuner, storage, resume.

A run lives in ``<storage>/<name>`` (see :mod:`ablate.rundir` for its files). ``ray.init`` and the cluster
live in :mod:`ablate.service.cluster`, the search algorithm in :mod:`ablate.service.search`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate import __version__, ray_compat
from ablate.rundir import (
    INTERRUPTED,
    INTERRUPTED_FILE,
    MARKER_TIME_FORMAT,
    RunError,
    RunReader,
    check_writable,
    is_remote,
    read_marker,
    remove_file,
    resolve_run_dir,
    run_name,
    write_marker,
    write_text,
)
from ablate.service.cluster import init_ray
from ablate.service.grids import Grid, GridError, axis_text, flat_params
from ablate.service.search import save_best, tune_config
from ablate.service.snapshots import BACKUP_DIR, DISCARDED_DIR, SnapshotError, choose_snapshot, has_snapshot

__all__ = [
    "RunOutcome",
    "StorageFull",
    "TrialOutcome",
    "probe_acceptance",
    "default_run_name",
    "has_run_state",
    "run_grid",
    "summary_rows",
]

_log = logging.getLogger("ablate.runner")
#: Metrics shown in the live progress table.
PROGRESS_METRICS = ("step", "r2", "loss", "mcc")


class StorageFull(RunError):
    """The run stopped because its storage is full; the message says what could not be written, and where."""


#: errno values of a full disk or an exhausted quota.
_FULL = (errno.ENOSPC, errno.EDQUOT)


def _full_disk(exc: BaseException | None) -> OSError | None:
    """The ENOSPC/EDQUOT OSError behind ``exc`` (following causes and contexts), or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _FULL:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _storage_full_message(exc: OSError | None, run_dir: str) -> str:
    what = exc.filename if exc is not None and exc.filename else run_dir
    reason = (exc.strerror if exc is not None else None) or "no space left on device"
    return (
        f"could not write {what} ({reason}) while running {run_dir}; nothing finished was lost "
        "(finished reports and checkpoints stay on disk): free some space, then resume"
    )


@dataclass
class TrialOutcome:
    """The end state of one trial."""

    trial_id: str
    label: str
    status: str
    params: dict[str, Any]
    last: dict[str, Any]
    error: str | None = None


@dataclass
class RunOutcome:
    """What a run produced: where it lives and each trial's end state."""

    run_dir: Path
    grid: Grid
    trials: list[TrialOutcome] = field(default_factory=list)
    best_config: dict[str, Any] | None = None
    wall_s: float = 0.0
    set_aside: dict[str, str] = field(default_factory=dict)  # torn snapshot files moved aside on resume
    interrupted: bool = False  # Ctrl-C stopped the run; --resume continues it
    storage_full: str | None = None  # a trial failed because the storage is full: what could not be written

    @property
    def failed(self) -> list[TrialOutcome]:
        """Trials that did not finish."""
        return [t for t in self.trials if t.status != "TERMINATED"]

    @property
    def unfinished(self) -> list[TrialOutcome]:
        """Trials that Ctrl-C stopped before they finished."""
        return [t for t in self.trials if t.status == INTERRUPTED]


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
        "variants": [v["name"] for v in grid.variants],
        "n_trials": grid.n_trials,
        "created": time.strftime(MARKER_TIME_FORMAT),
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
        params = {k: k for k in [*grid.optuna["space"], "seed"]}
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
    """
    run_name = name or default_run_name(grid)
    run_dir = resolve_run_dir(storage, run_name)
    probe_acceptance(grid)
    check_writable(storage)
    local = not is_remote(run_dir)
    set_aside: dict[str, str] = {}
    state_exists = local and has_snapshot(run_dir)
    if resume:
        if local and not Path(run_dir).exists():
            raise RunError(f"--resume: nothing to resume at {run_dir} (no such run)")
        info = read_marker(run_dir) if local else None
        if info is not None and (info["grid"], info["scale"], info.get("preset")) != (
            grid.name,
            grid.scale,
            grid.preset,
        ):
            raise RunError(
                f"--resume: {run_dir} was made from grid {info['grid']!r} at scale {info['scale']!r} with preset "
                f"{info.get('preset')!r}, not {grid.name!r} at {grid.scale!r} with preset {grid.preset!r}"
            )
        if local and not state_exists:
            raise RunError(f"--resume: nothing to resume at {run_dir} (no experiment state)")
        if local:
            set_aside = _choose_snapshot(run_dir)
        remove_file(f"{run_dir}/{INTERRUPTED_FILE}")  # a driver runs the trials again
    elif state_exists:
        raise RunError(f"{run_dir} already holds a run: add --resume to continue it, or choose another --name")

    ray_compat.set_tune_environment(num_cpus)
    from ray import tune

    from ablate.service.trainable import AblateTrainable

    if not resume:
        write_marker(run_dir, _marker(grid))
    ray_info = init_ray(address, num_cpus=num_cpus, dashboard=dashboard)
    if on_start is not None:
        on_start(run_dir, ray_info["dashboard_url"])

    trainable = tune.with_resources(AblateTrainable, {"cpu": cpus_per_trial, "gpu": gpus_per_trial})
    started = time.time()
    if resume:
        tuner = tune.Tuner.restore(run_dir, trainable=trainable, resume_unfinished=True, resume_errored=True)
    else:
        tuner = tune.Tuner(
            trainable,
            param_space=grid.param_space(),
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
    guard = ray_compat.refuse_silent_restart(_restore_failed(run_dir)) if resume else contextlib.nullcontext()
    try:
        with guard, ray_compat.graceful_interrupt() as interrupted, ray_compat.hide_full_disk_tracebacks(_full_warning):
            results = tuner.fit()
    except Exception as exc:  # a full disk in the driver (a callback, a snapshot) ends Tune with a traceback
        full = _full_disk(exc)
        if full is None:
            raise
        raise StorageFull(_storage_full_message(full, run_dir)) from exc
    outcome = RunOutcome(run_dir=Path(run_dir), grid=grid, wall_s=time.time() - started, set_aside=set_aside)
    outcome.interrupted = interrupted()
    snapshot = RunReader(run_dir).statuses() if outcome.interrupted and local else {}
    for result in results:
        cfg = flat_params(result.config or {})
        metrics = result.metrics or {}
        trial_id = metrics.get("trial_id") or Path(result.path).name
        err = None if result.error is None else f"{type(result.error).__name__}: {result.error}"
        status = "ERROR" if result.error is not None else "TERMINATED"
        if outcome.interrupted and status == "TERMINATED":
            # Ray's last snapshot (taken before it stopped the actors) says whether the trial had finished;
            # on remote storage the trial's last report does
            unfinished = snapshot.get(trial_id, "RUNNING") != "TERMINATED" if local else not metrics.get("done")
            status = INTERRUPTED if unfinished else status
        if outcome.storage_full is None and result.error is not None:
            full = _full_disk(result.error)
            if full is not None or "No space left on device" in str(result.error):
                outcome.storage_full = _storage_full_message(full, run_dir)
        outcome.trials.append(TrialOutcome(trial_id, _label(cfg, grid), status, cfg, metrics, err))
    if outcome.interrupted:
        stopped = [t.trial_id for t in outcome.unfinished]
        write_text(f"{run_dir}/{INTERRUPTED_FILE}", json.dumps({"trials": stopped, "time": time.time()}, indent=1))
    if grid.search == "optuna":
        outcome.best_config = save_best(results, grid, run_dir)
    return outcome


def _full_warning(line: str) -> None:
    _log.warning("the storage is full (%s); trials that cannot save are retried, then stop", line)


def _choose_snapshot(run_dir: str) -> dict[str, str]:
    """Resume from the newest complete snapshot; say which torn files were set aside and why."""
    try:
        choice = choose_snapshot(run_dir)
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


def _label(params: dict[str, Any], grid: Grid) -> str:
    return ",".join(f"{k}={axis_text(params.get(k))}" for k in grid.axis_names())


def summary_rows(outcome: RunOutcome) -> list[dict[str, Any]]:
    """One row per trial: the axes, status, steps and final R² (for the end-of-run table)."""
    rows = []
    for t in outcome.trials:
        row: dict[str, Any] = {}
        for k in outcome.grid.axis_names():
            v = t.params.get(k)
            row[k] = axis_text(v) if isinstance(v, dict | list) else v
        row["status"] = t.status
        row["step"] = t.last.get("step")
        r2 = t.last.get("r2")
        row["r2"] = None if r2 is None or (isinstance(r2, float) and math.isnan(r2)) else round(float(r2), 4)
        rows.append(row)
    return rows
