"""Every place where ablate relies on Ray internals (private APIs, file formats, log messages), in one module.

Tested with Ray 2.60 (pyproject pins ``ray>=2.60,<2.61``). Each function says what it touches and why no public
API does the job, so a Ray upgrade is checked here and nowhere else. Nothing here imports Ray at import time.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "EXPERIMENT_STATE_PREFIX",
    "EXPERIMENT_STATE_RE",
    "SEARCHER_FILES",
    "SNAPSHOT_FILES",
    "dashboard_url",
    "graceful_interrupt",
    "hide_full_disk_tracebacks",
    "json_encoder",
    "live_clusters",
    "parse_experiment_state",
    "refresh_auth_config",
    "refuse_silent_restart",
    "set_tune_environment",
    "quiet_exit_on_sigterm",
    "snapshot_paths",
    "trial_folder",
]

# ------------------------------------------------------------------ Tune's experiment snapshot (file formats)
#: Ray Tune names its experiment snapshot ``experiment_state-<session>.json`` (ray/tune/execution/tune_controller).
EXPERIMENT_STATE_PREFIX = "experiment_state"
EXPERIMENT_STATE_RE = re.compile(r"^experiment_state-(?P<session>.+)\.json$")
#: The files of one snapshot session: name template → encoding. The searcher state is
#: ``basic-variant-state-S.json`` for a grid, ``search_gen_state-S.json`` + ``searcher-state-S.pkl`` for Optuna,
#: and ``callback-states-S.pkl`` holds callbacks' state (Ray 2.60's Tuner/TuneController writers).
SNAPSHOT_FILES = {
    "experiment_state-{}.json": "json",
    "basic-variant-state-{}.json": "pickle",
    "search_gen_state-{}.json": "pickle",
    "searcher-state-{}.pkl": "pickle",
    "callback-states-{}.pkl": "pickle",
}
#: One of these must exist for a session to be resumable (its search algorithm's state).
SEARCHER_FILES = ("basic-variant-state-{}.json", "search_gen_state-{}.json")


def parse_experiment_state(text: str) -> dict[str, dict[str, Any]]:
    """trial_id → {status, params, failures} from the JSON fields of a Ray Tune experiment snapshot.

    Ray has no public reader for a run that is still going (``ExperimentAnalysis`` unpickles trials): its
    ``trial_data`` is a list of ``[trial JSON, runtime metadata JSON]`` pairs. Only those JSON fields are read.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return {}
    out = {}
    for entry in data.get("trial_data", []) if isinstance(data, dict) else []:
        try:
            info = json.loads(entry[0])
            meta = json.loads(entry[1]) if len(entry) > 1 else {}
        except (TypeError, IndexError, json.JSONDecodeError):
            continue
        out[info["trial_id"]] = {
            "status": info.get("status", "UNKNOWN"),
            "params": info.get("evaluated_params", {}),
            "config": info.get("config") if isinstance(info.get("config"), dict) else {},
            "failures": meta.get("num_failures", 0),
        }
    return out


# ------------------------------------------------------------------ Tune's storage context (callbacks)
def snapshot_paths(trials: list) -> tuple[str, str] | None:
    """(staging folder, run directory) of the driver's experiment snapshot, or None for remote storage.

    Ray writes the snapshot whole into ``StorageContext.experiment_driver_staging_path`` and copies it to
    ``experiment_fs_path`` in the background; ablate backs up the staging copy (ablate.service.snapshots).
    These attributes of ``trial.storage`` are internal to Ray Train's StorageContext.
    """
    storage = trials[0].storage
    if storage.storage_filesystem.type_name != "local":
        return None
    return storage.experiment_driver_staging_path, storage.experiment_fs_path


def trial_folder(trial) -> str:
    """The trial's folder in the run directory (``StorageContext.trial_fs_path``, internal to Ray Train)."""
    return trial.storage.trial_fs_path


def json_encoder() -> type[json.JSONEncoder]:
    """Ray Tune's JSON encoder for results (numpy scalars, NaN): ``ray.tune.utils.util.SafeFallbackEncoder``,
    the one Ray's own JsonLoggerCallback uses, so ablate's result.json reads exactly like Ray's."""
    from ray.tune.utils.util import SafeFallbackEncoder

    return SafeFallbackEncoder


def set_tune_environment(num_cpus: int | None) -> None:
    """Tune settings read from the environment (Ray Tune's documented env variables), unless already set."""
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # ablate adds its own result log
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "0")  # snapshot after every report: a killed driver replays ≤ 1
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the classic progress table (CLIReporter)
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    os.environ.setdefault("TUNE_MAX_PENDING_TRIALS_PG", str(max(4, (num_cpus or os.cpu_count() or 2) * 2)))


# ------------------------------------------------------------------ resume: Ray's silent restart
#: What Ray 2.60's TuneController logs (then starts an *empty* experiment) when it cannot read a snapshot.
RESTORE_FAILED_MESSAGE = "Failed to restore the run state"
_RESTORE_LOGGER = "ray.tune.execution.tune_controller"


class _RestoreFailed(logging.Filter):
    def __init__(self, on_failure: Callable[[BaseException | None], None]):
        super().__init__()
        self.on_failure = on_failure

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith(RESTORE_FAILED_MESSAGE):
            self.on_failure(record.exc_info[1] if record.exc_info else None)
        return True


@contextlib.contextmanager
def refuse_silent_restart(on_failure: Callable[[BaseException | None], None]) -> Iterator[None]:
    """While resuming, call ``on_failure(exception)`` (which raises) when Ray logs that it could not restore.

    Ray offers no hook or exception for this case: it logs :data:`RESTORE_FAILED_MESSAGE` and starts a new
    experiment from an empty search space. ablate's own snapshot check (ablate.service.snapshots) runs first,
    so this is a backstop; it depends on the English message and the logger name of Ray 2.60.
    """
    logger = logging.getLogger(_RESTORE_LOGGER)
    guard = _RestoreFailed(on_failure)
    logger.addFilter(guard)
    try:
        yield
    finally:
        logger.removeFilter(guard)


# ------------------------------------------------------------------ Ctrl-C: Tune's graceful stop, and knowing it fired
@contextlib.contextmanager
def graceful_interrupt() -> Iterator[Callable[[], bool]]:
    """While Tune runs, turn the first Ctrl-C into Tune's graceful stop and remember that it happened.

    Ray Tune 2.60 stops a run gracefully (last snapshot saved, trials left resumable) on SIGINT or SIGUSR1
    (``ray.tune.tune._setup_signal_catching``), but only logs that it did: ``Tuner.fit`` returns as after a
    finished run. Here ``TUNE_DISABLE_SIGINT_HANDLER=1`` (a documented Tune env variable) keeps Tune off
    SIGINT; ablate's handler records the interrupt and sends this process SIGUSR1, which Tune always handles
    the same way. A second Ctrl-C raises KeyboardInterrupt (skipping Tune's last snapshot, as Tune's own
    handler does). Yields a function that says whether the run was interrupted. Main thread only: elsewhere
    signals cannot be handled and nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    fired = threading.Event()

    def on_sigint(sig: int, frame: Any) -> None:
        if fired.is_set():
            raise KeyboardInterrupt
        fired.set()
        os.kill(os.getpid(), signal.SIGUSR1)

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGUSR1)}
    env_before = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield fired.is_set
    finally:
        for sig, handler in before.items():
            if handler is not None:  # None: a handler not set from Python, which cannot be put back
                signal.signal(sig, handler)
        if env_before is None:
            os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
        else:
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = env_before


# ------------------------------------------------------------------ a full disk: Ray's tracebacks
#: Ray 2.60's loggers that print a traceback per failed write when the storage is full: the storage syncer
#: (every snapshot copy), the controller (each trial that failed), Tune's loop (the last snapshot).
FULL_DISK_LOGGERS = ("ray.train._internal.syncer", "ray.tune.execution.tune_controller", "ray.tune.tune")
FULL_DISK_TEXT = ("No space left on device", "[Errno 28]", "Disk quota exceeded", "[Errno 122]")


class _FullDisk(logging.Filter):
    def __init__(self, on_first: Callable[[str], None]):
        super().__init__()
        self.on_first = on_first
        self.hidden = 0

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if record.exc_info:
            text += "".join(traceback.format_exception(*record.exc_info))
        if not any(t in text for t in FULL_DISK_TEXT):
            return True
        if not self.hidden:
            self.on_first(text.strip().splitlines()[-1])
        self.hidden += 1
        return False


@contextlib.contextmanager
def hide_full_disk_tracebacks(on_first: Callable[[str], None]) -> Iterator[None]:
    """While Tune runs, drop Ray's log records about a full disk (a 25-line traceback per failed write, several
    a second) and call ``on_first(last line)`` once instead. Depends on the logger names of Ray 2.60 and on
    the text of the OSError (ENOSPC, EDQUOT); other records pass untouched."""
    guard = _FullDisk(on_first)
    loggers = [logging.getLogger(name) for name in FULL_DISK_LOGGERS]
    for logger in loggers:
        logger.addFilter(guard)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(guard)


# ------------------------------------------------------------------ a trial's actor stopped by SIGTERM
def _drop_sigterm_exit(unraisable: Any) -> None:
    if isinstance(unraisable.exc_value, SystemExit):
        return
    sys.__unraisablehook__(unraisable)


def quiet_exit_on_sigterm() -> None:
    """In a trial's actor process: let Ray's SIGTERM exit stay silent when it lands in a weakref callback.

    When a run ends early (a full disk, Ctrl-C), Ray stops the trials' actors with SIGTERM; Ray 2.60's handler
    (``ray._private.worker.sigterm_handler``) raises ``SystemExit``. If the signal arrives while Python runs a
    weakref callback, the exception cannot propagate and Python prints "Exception ignored in ..." with a
    10-line traceback, which Ray forwards to the driver's terminal. The process exits either way; this hook
    drops only such ``SystemExit`` records and passes every other unraisable exception to Python's default.
    """
    sys.unraisablehook = _drop_sigterm_exit


# ------------------------------------------------------------------ ray.init, auth and the dashboard
def dashboard_url() -> str | None:
    """The dashboard URL of the connected Ray, with ``http://``; None without a dashboard.

    The runtime context has no public dashboard URL in Ray 2.60; ``ray._private.worker.get_dashboard_url`` is
    what ``ray.init`` itself prints.
    """
    import ray

    try:
        ctx = ray.get_runtime_context()
        url = ctx.dashboard_url if hasattr(ctx, "dashboard_url") else None
    except Exception:
        url = None
    if not url:
        try:
            url = ray._private.worker.get_dashboard_url()  # noqa: SLF001 - see the docstring
        except Exception:
            url = None
    if url and not url.startswith("http"):
        url = "http://" + url
    return url or None


def refresh_auth_config() -> None:
    """Make Ray re-read ``RAY_AUTH_MODE`` after ablate set it: Ray caches its config in ``ray._raylet.Config``
    and calls ``Config.initialize("")`` itself when it turns token authentication on for ``address=auto``."""
    try:
        from ray._raylet import Config

        Config.initialize("")
    except (ImportError, AttributeError):
        pass


def live_clusters() -> set[str]:
    """GCS addresses of the Ray clusters whose processes run on this machine.

    ``ray._private.services.find_gcs_addresses`` is what ``ray.init(address="auto")`` uses to find them; ablate
    calls it directly so a stale address file of a stopped cluster is never followed.
    """
    from ray._private.services import find_gcs_addresses

    find_gcs_addresses.cache_clear()
    return set(find_gcs_addresses())
