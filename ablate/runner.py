"""Runs a grid through Ray Tune: ray.init (local or cluster), the Tuner, storage, resume, Optuna.

A run lives in ``<storage>/<name>``. ablate writes ``ablate_run.json`` there first (the grid, its
scale and the YAML text): ``--resume``, ``status``, ``export`` and ``report`` refuse a directory
without it, so nothing is ever unpickled from a directory ablate did not write.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate import __version__
from ablate.grids import Grid, GridError, axis_text, n_reports
from ablate.snapshots import BACKUP_DIR, DISCARDED_DIR, SnapshotError, choose_snapshot, has_snapshot

__all__ = ["RUN_MARKER", "RunError", "RunOutcome", "TrialOutcome", "check_run_dir", "probe_acceptance", "run_grid"]

RUN_MARKER = "ablate_run.json"
#: The SQLite file that holds an Optuna grid's study (opens in optuna-dashboard and optuna.load_study).
OPTUNA_DB = "optuna.db"
_log = logging.getLogger("ablate.runner")
#: Metrics shown in the live progress table.
PROGRESS_METRICS = ("step", "r2", "loss", "mcc")


class RunError(RuntimeError):
    """A run cannot start or resume; the message says why and what to do."""


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

    @property
    def failed(self) -> list[TrialOutcome]:
        """Trials that did not finish."""
        return [t for t in self.trials if t.status != "TERMINATED"]


def _is_remote(storage: str) -> bool:
    return "://" in storage


def resolve_run_dir(storage: str, name: str) -> str:
    """``<storage>/<name>`` (local paths made absolute)."""
    if _is_remote(storage):
        return storage.rstrip("/") + "/" + name
    return str(Path(storage).expanduser().resolve() / name)


def check_run_dir(run_dir: str | os.PathLike) -> dict[str, Any]:
    """Return the run marker of a directory ablate wrote; refuse any other directory."""
    from ablate.results import RunReader  # results imports this module

    return RunReader(run_dir).marker()


def probe_acceptance(grid: Grid) -> None:
    """Fail before any compute when a trial's Λ/threshold/d makes the rejection sampler hopeless."""
    import torch

    from ablate.dgp import LowAcceptanceError, sample_conditional, sample_uniform

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


def _check_writable(storage: str) -> None:
    if _is_remote(storage):
        return
    root = Path(storage).expanduser()
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".ablate-write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise RunError(f"storage {root}: not writable ({exc.strerror}); choose another --storage") from None


def _write_marker(run_dir: str, grid: Grid) -> None:
    info = {
        "ablate_version": __version__,
        "grid": grid.name,
        "scale": grid.scale,
        "preset": grid.preset,
        "grid_file": str(grid.path),
        "grid_yaml": Path(grid.path).read_text(),
        "search": grid.search,
        "axes": grid.axis_names(),
        "n_trials": grid.n_trials,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if _is_remote(run_dir):
        import pyarrow.fs as pafs

        fs, path = pafs.FileSystem.from_uri(run_dir)
        fs.create_dir(path, recursive=True)
        with fs.open_output_stream(path + "/" + RUN_MARKER) as f:
            f.write(json.dumps(info, indent=1).encode())
        return
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    tmp = Path(run_dir) / f".{RUN_MARKER}.tmp"
    tmp.write_text(json.dumps(info, indent=1))
    os.replace(tmp, Path(run_dir) / RUN_MARKER)


def init_ray(address: str | None, *, num_cpus: int | None = None, dashboard: bool = True,
             dashboard_host: str = "127.0.0.1") -> dict[str, Any]:
    """Start (or join) Ray; the local dashboard binds to 127.0.0.1 and keeps token authentication."""
    import ray

    if ray.is_initialized():
        return {"dashboard_url": _dashboard_url(), "joined": True}
    kwargs: dict[str, Any] = {"logging_level": "WARNING", "log_to_driver": True}
    if address:
        import ablate

        _keep_token_auth(address)

        # workers on the cluster get this package's code (they need torch and ray installed)
        kwargs["runtime_env"] = {"py_modules": [str(Path(ablate.__file__).parent)]}
        ray.init(address=address, **kwargs)
    else:
        # address="local": always a fresh embedded Ray, even if a stale cluster address is on disk
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=dashboard, dashboard_host=dashboard_host,
                 **kwargs)
    return {"dashboard_url": _dashboard_url(), "joined": bool(address)}


def _keep_token_auth(address: str) -> None:
    """Ray turns token auth on by itself only for ``address=auto``; do the same for an explicit address."""
    token = Path.home() / ".ray" / "auth_token"
    if address == "auto" or "RAY_AUTH_MODE" in os.environ or not token.is_file():
        return
    os.environ["RAY_AUTH_MODE"] = "token"
    try:  # refresh Ray's cached config, as Ray itself does when it enables token auth
        from ray._raylet import Config

        Config.initialize("")
    except (ImportError, AttributeError):
        pass


def _dashboard_url() -> str | None:
    import ray

    try:
        url = ray.get_runtime_context().dashboard_url if hasattr(ray.get_runtime_context(), "dashboard_url") else None
    except Exception:
        url = None
    if not url:
        try:
            url = ray._private.worker.get_dashboard_url()  # noqa: SLF001 - the only public-ish accessor
        except Exception:
            url = None
    if url and not url.startswith("http"):
        url = "http://" + url
    return url or None


def auth_hint() -> str:
    """How to authenticate to the dashboard under Ray's token authentication."""
    token = Path.home() / ".ray" / "auth_token"
    mode = os.environ.get("RAY_AUTH_MODE", "token (Ray's default for local clusters)")
    return (f"auth: {mode}; the dashboard asks for the token in {token} (print it with `ray get-auth-token`)")


def _callbacks(tensorboard: bool, local: bool) -> list:
    """Result loggers and the snapshot keeper. A local run directory gets ablate's append-only result log;
    remote storage (s3://, gs://) keeps Ray's JSON and CSV loggers, which reach it through Ray's sync."""
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    from ablate.tune_callbacks import ResultLog, SnapshotKeeper

    cbs: list = [ResultLog(), SnapshotKeeper()] if local else [JsonLoggerCallback(), CSVLoggerCallback()]
    if tensorboard:
        from ray.tune.logger import TBXLoggerCallback

        cbs.append(TBXLoggerCallback())
    return cbs


def _reporter(grid: Grid):
    from ray.tune import CLIReporter

    params = {k: k for k in grid.axis_names()}
    if "variant" in params:
        params["variant/name"] = "variant"
        del params["variant"]
    return CLIReporter(
        metric_columns={m: m for m in PROGRESS_METRICS},
        parameter_columns=params,
        max_report_frequency=30,
        print_intermediate_tables=True,
        sort_by_metric=False,
        max_progress_rows=40,
    )


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
    verbose: int = 1,
    on_start=None,
) -> RunOutcome:
    """Run ``grid`` through Ray Tune (or resume it) and return each trial's end state.

    Everything is validated before Ray starts: the grid, the sampler's acceptance, the storage.
    ``on_start(run_dir, dashboard_url)`` is called once Ray is up (the CLI prints it).
    """
    run_name = name or f"{grid.name}-{grid.scale}" + (f"-{grid.preset}" if grid.preset else "")
    run_dir = resolve_run_dir(storage, run_name)
    probe_acceptance(grid)
    _check_writable(storage)
    local = not _is_remote(run_dir)
    set_aside: dict[str, str] = {}
    state_exists = local and has_snapshot(run_dir)
    if resume:
        if local and not Path(run_dir).exists():
            raise RunError(f"--resume: nothing to resume at {run_dir} (no such run)")
        info = check_run_dir(run_dir) if local else None
        if info is not None and (info["grid"], info["scale"], info.get("preset")) != (grid.name, grid.scale,
                                                                                       grid.preset):
            raise RunError(
                f"--resume: {run_dir} was made from grid {info['grid']!r} at scale {info['scale']!r} with preset "
                f"{info.get('preset')!r}, not {grid.name!r} at {grid.scale!r} with preset {grid.preset!r}"
            )
        if local and not state_exists:
            raise RunError(f"--resume: nothing to resume at {run_dir} (no experiment state)")
        if local:
            set_aside = _choose_snapshot(run_dir)
    elif state_exists:
        raise RunError(f"{run_dir} already holds a run: add --resume to continue it, or choose another --name")

    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "0")  # snapshot after every report: a killed driver replays ≤ 1
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    os.environ.setdefault("TUNE_MAX_PENDING_TRIALS_PG", str(max(4, (num_cpus or os.cpu_count() or 2) * 2)))
    from ray import tune

    from ablate.trainable import AblateTrainable

    if not resume:
        _write_marker(run_dir, grid)
    ray_info = init_ray(address, num_cpus=num_cpus)
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
            tune_config=_tune_config(grid, max_concurrent, run_dir),
            run_config=tune.RunConfig(
                name=run_name,
                storage_path=storage if _is_remote(storage) else str(Path(storage).expanduser().resolve()),
                checkpoint_config=tune.CheckpointConfig(num_to_keep=keep_checkpoints, checkpoint_frequency=1,
                                                        checkpoint_at_end=True),
                failure_config=tune.FailureConfig(max_failures=max_failures),
                callbacks=_callbacks(tensorboard, local),
                progress_reporter=_reporter(grid),
                verbose=verbose,
            ),
        )
    with _refuse_silent_restart(run_dir) if resume else contextlib.nullcontext():
        results = tuner.fit()
    outcome = RunOutcome(run_dir=Path(run_dir), grid=grid, wall_s=time.time() - started,
                         set_aside=set_aside)
    for result in results:
        cfg = result.config or {}
        trial_id = (result.metrics or {}).get("trial_id") or Path(result.path).name
        err = None if result.error is None else f"{type(result.error).__name__}: {result.error}"
        status = "ERROR" if result.error is not None else "TERMINATED"
        outcome.trials.append(TrialOutcome(trial_id, _label(cfg, grid), status, cfg, result.metrics or {}, err))
    if grid.search == "optuna":
        outcome.best_config = _save_best(results, grid, run_dir)
    return outcome


def _choose_snapshot(run_dir: str) -> dict[str, str]:
    """Resume from the newest complete snapshot; say which torn files were set aside and why."""
    try:
        choice = choose_snapshot(run_dir)
    except SnapshotError as exc:
        raise RunError(f"--resume: {exc}") from exc
    if choice.discarded:
        source = f"ablate's backup in {BACKUP_DIR}/" if choice.from_backup else "the run directory"
        _log.warning("--resume: the newest snapshot was torn by a kill (%s); moved %s to %s/ and resuming from "
                     "session %s as saved in %s", "; ".join(sorted(set(choice.discarded.values()))),
                     ", ".join(choice.discarded), Path(run_dir, DISCARDED_DIR), choice.session, source)
    return choice.discarded


class _RestoreFailed(logging.Filter):
    """Turn Ray's "Failed to restore the run state" (after which it restarts from scratch) into an error."""

    def __init__(self, run_dir: str):
        super().__init__()
        self.run_dir = run_dir

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("Failed to restore the run state"):
            exc = record.exc_info[1] if record.exc_info else None
            cause = f" ({type(exc).__name__}: {exc})" if exc is not None else ""
            raise RunError(f"--resume: Ray could not read the experiment state in {self.run_dir}{cause}; "
                           "stopped instead of restarting the grid from scratch")
        return True


@contextlib.contextmanager
def _refuse_silent_restart(run_dir: str):
    """While resuming, a failed restore raises instead of letting Ray start an empty experiment."""
    logger = logging.getLogger("ray.tune.execution.tune_controller")
    guard = _RestoreFailed(run_dir)
    logger.addFilter(guard)
    try:
        yield
    finally:
        logger.removeFilter(guard)


def optuna_storage_url(run_dir: str | Path) -> str:
    """SQLAlchemy URL of a local run's Optuna study (``sqlite:///RUN_DIR/optuna.db``)."""
    return f"sqlite:///{Path(run_dir).resolve() / OPTUNA_DB}"


def _tune_config(grid: Grid, max_concurrent: int | None, run_dir: str | None = None):
    from ray import tune

    if grid.search != "optuna":
        return tune.TuneConfig(reuse_actors=True, max_concurrent_trials=max_concurrent,
                               trial_dirname_creator=_dirname)
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    opt = grid.optuna
    storage = None
    if run_dir is not None and not _is_remote(run_dir):  # a study on disk; remote runs keep it in memory
        import optuna

        storage = optuna.storages.RDBStorage(optuna_storage_url(run_dir))
    searcher = OptunaSearch(metric=opt["metric"], mode=opt["mode"], seed=grid.seeds[0], storage=storage,
                            study_name=grid.name if storage is not None else None)
    limit = max_concurrent or opt.get("max_concurrent") or 2
    if "time_budget_s" in opt:  # rungs in seconds of training: settings compete at equal wall time
        scheduler = ASHAScheduler(time_attr="time_total_s", max_t=opt["time_budget_s"],
                                  grace_period=opt["grace_period"], reduction_factor=opt["reduction_factor"])
    else:  # rungs in reports
        n_max = max(max(n_reports(t.config) for t in grid.trials), 1)
        scheduler = ASHAScheduler(time_attr="training_iteration", max_t=n_max,
                                  grace_period=min(opt["grace_period"], n_max), reduction_factor=opt["reduction_factor"])
    return tune.TuneConfig(
        metric=opt["metric"], mode=opt["mode"], search_alg=ConcurrencyLimiter(searcher, max_concurrent=limit),
        scheduler=scheduler, num_samples=opt["num_samples"], reuse_actors=True, trial_dirname_creator=_dirname,
    )


def _dirname(trial) -> str:
    return f"trial_{trial.trial_id}"


def _label(params: dict[str, Any], grid: Grid) -> str:
    return ",".join(f"{k}={axis_text(params.get(k))}" for k in grid.axis_names())


def _save_best(results, grid: Grid, run_dir: str) -> dict[str, Any] | None:
    opt = grid.optuna
    try:
        best = results.get_best_result(metric=opt["metric"], mode=opt["mode"], scope="last")
    except RuntimeError:
        return None
    if best is None or best.metrics is None:
        return None
    value = best.metrics.get(opt["metric"])
    info = {
        "metric": opt["metric"], "mode": opt["mode"], "value": value,
        "config": {k: best.config[k] for k in opt["space"] if k in best.config},
        "steps": best.metrics.get("step"), "trial_id": best.metrics.get("trial_id"),
    }
    if not _is_remote(run_dir):
        (Path(run_dir) / "best_config.json").write_text(json.dumps(info, indent=1, default=str))
    return info


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
