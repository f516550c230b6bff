"""Every place where ablate relies on Ray internals (private APIs, file formats, log messages), in one module.

Tested with Ray 2.60 (pyproject pins ``ray>=2.60,<2.61``). Each function says what it touches and why no public
API does the job, so a Ray upgrade is checked here and nowhere else. Nothing here imports Ray at import time.
"""

from __future__ import annotations

import contextlib
import fnmatch
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
    "DICT_CHECKPOINT_FILE",
    "EXPERIMENT_STATE_PREFIX",
    "EXPERIMENT_STATE_RE",
    "SEARCHER_FILES",
    "SNAPSHOT_FILES",
    "Terminated",
    "TUNER_FILE",
    "checkpoint_to_restore",
    "dashboard_url",
    "graceful_interrupt",
    "hide_full_disk_tracebacks",
    "json_encoder",
    "live_clusters",
    "new_auth_token",
    "parse_experiment_state",
    "refresh_auth_config",
    "reopen_trials",
    "refuse_silent_restart",
    "set_tune_environment",
    "quiet_exit_on_sigterm",
    "reclaim_sigterm",
    "snapshot_paths",
    "tracked_checkpoints",
    "trial_folder",
    "training_result",
    "unpickled_on_restore",
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
#: Ray's pickled Tuner in the run directory: ``Tuner.restore`` unpickles it first (ray/tune/impl/tuner_internal).
TUNER_FILE = "tuner.pkl"
#: A class Trainable's checkpoint that Ray 2.60 unpickles on restore when the folder holds it
#: (``ray.tune.trainable.trainable._DICT_CHECKPOINT_FILE_NAME``); ablate's checkpoints never do.
DICT_CHECKPOINT_FILE = "_dict_checkpoint.pkl"


def unpickled_on_restore(name: str) -> bool:
    """Whether Ray 2.60 may unpickle a file with this name at the root of a run directory when it resumes it.

    ``Tuner.restore`` unpickles ``tuner.pkl``; ``TuneController.resume`` and ``ExperimentAnalysis`` decode the
    newest ``experiment_state-*.json`` with ``_loads_with_cloudpickle`` (its trials are cloudpickled, hex in
    JSON); then Ray copies every root ``.json``/``.pkl`` into its staging folder and the search algorithm and
    callbacks load the newest file of each :data:`SNAPSHOT_FILES` template with cloudpickle/pickle.
    """
    return name == TUNER_FILE or any(fnmatch.fnmatchcase(name, t.format("*")) for t in SNAPSHOT_FILES)


def parse_experiment_state(text: str) -> dict[str, dict[str, Any]]:
    """trial_id → {status, params, config, failures, iteration} from the JSON fields of an experiment snapshot.

    Ray has no public reader for a run that is still going (``ExperimentAnalysis`` unpickles trials): its
    ``trial_data`` is a list of ``[trial JSON, runtime metadata JSON]`` pairs. Only those JSON fields are read.
    """
    out = {}
    for info, meta in _trial_data(_json_or_empty(text)):
        out[info["trial_id"]] = {
            "status": info.get("status", "UNKNOWN"),
            "params": info.get("evaluated_params", {}),
            "config": info.get("config") if isinstance(info.get("config"), dict) else {},
            "failures": meta.get("num_failures", 0),
            "iteration": _last_iteration(meta),
        }
    return out


def _last_iteration(meta: dict[str, Any]) -> int | None:
    """``training_iteration`` of the trial's last result as Ray recorded it (plain JSON in its run metadata)."""
    it = (meta.get("last_result") or {}).get("training_iteration")
    return it if isinstance(it, int) else None


def _trial_data(data: Any) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(trial JSON, runtime metadata JSON) of each trial of a parsed snapshot; entries that are not, skipped."""
    for entry in data.get("trial_data", []) if isinstance(data, dict) else []:
        try:
            info, meta = json.loads(entry[0]), json.loads(entry[1]) if len(entry) > 1 else {}
        except (TypeError, IndexError, json.JSONDecodeError):
            continue
        if isinstance(info, dict) and "trial_id" in info and isinstance(meta, dict):
            yield info, meta


def tracked_checkpoints(text: str) -> dict[str, set[str]]:
    """trial_id → the checkpoint folder names Ray tracks (and deletes as newer ones come), from a snapshot's text.

    They live in the trial's pickled ``_CheckpointManager`` (hex in the JSON): its opcodes are walked with
    :mod:`pickletools`, which executes nothing, keeping the string arguments that name ``…/checkpoint_N``.
    """
    import pickletools

    out: dict[str, set[str]] = {}
    for info, meta in _trial_data(_json_or_empty(text)):
        manager = meta.get("checkpoint_manager")
        names = out.setdefault(info.get("trial_id"), set())
        with contextlib.suppress(Exception):  # a damaged pickle: nothing tracked that can be named
            for _op, arg, _pos in pickletools.genops(bytes.fromhex(manager["value"])):
                if isinstance(arg, str) and re.search(r"(^|/)checkpoint_\d+$", arg):
                    names.add(arg.rsplit("/", 1)[-1])
    return out


def reopen_trials(text: str, trial_ids: set[str]) -> str:
    """The snapshot ``text`` with these trials set to PENDING, so that a resume runs them again from their
    checkpoint (Ray 2.60 skips TERMINATED trials; ``status`` is a plain field of each trial's JSON)."""
    data = json.loads(text)
    for entry in data["trial_data"]:
        info = json.loads(entry[0])
        if info.get("trial_id") in trial_ids:
            info["status"] = "PENDING"
            entry[0] = json.dumps(info, indent=2)
    return json.dumps(data, indent=2)


def _json_or_empty(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return {}


# ------------------------------------------------------------------ a class Trainable's restore
def checkpoint_to_restore(request: Any) -> tuple[str | None, dict[str, Any]]:
    """(local folder, metrics) of what Ray 2.60 hands ``Trainable.restore``: a ``_TrainingResult``
    (ray.train._internal.session) whose metrics set Ray's iteration and time counters. None for a folder on
    remote storage."""
    if isinstance(request, str):
        return request, {}
    checkpoint = getattr(request, "checkpoint", request)
    if getattr(getattr(checkpoint, "filesystem", None), "type_name", None) != "local":
        return None, {}
    return checkpoint.path, dict(getattr(request, "metrics", None) or {})


def training_result(folder: str, metrics: dict[str, Any]) -> Any:
    """The ``Trainable.restore`` request for the checkpoint in the local ``folder`` with these ``metrics``."""
    from ray.train._internal.session import _TrainingResult
    from ray.tune import Checkpoint

    return _TrainingResult(checkpoint=Checkpoint.from_directory(folder), metrics=metrics)


# ------------------------------------------------------------------ Tune's storage context (callbacks)
def snapshot_paths(trials: list) -> tuple[str, str] | None:
    """(staging folder, run directory) of the driver's experiment snapshot, or None for remote storage.

    Ray writes the snapshot whole into ``StorageContext.experiment_driver_staging_path`` and copies it to
    ``experiment_fs_path`` in the background; ablate backs up the staging copy (ablate.service.snapshots).
    These attributes of ``trial.storage`` are internal to Ray Train's StorageContext. ablate signs the staging
    copy from ``Callback.get_state``, which Ray 2.60's ``TuneController.save_to_dir`` calls after writing the
    experiment and search algorithm state and before the copy starts (ablate.service.trust).
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
class Terminated(KeyboardInterrupt):
    """SIGTERM asked ``ablate run`` to stop at once (a second SIGTERM, or one outside Tune's graceful stop): what
    KeyboardInterrupt is to Ctrl-C, so the same cleanup runs; the command then exits 143 instead of 130."""


def reclaim_sigterm() -> None:
    """Give SIGTERM back to Python's handler after ``ray.init``.

    Ray 2.60's core worker installs its C++ crash handler (absl's failure signal handler) for SIGTERM in the
    driver: a batch scheduler's SIGTERM then dumps a stack and aborts (exit 134), and ``signal.getsignal`` cannot
    see the change. Setting Python's handler again (the CLI's, or the default: plain termination) undoes it.
    Main thread only; elsewhere nothing changes.
    """
    if threading.current_thread() is threading.main_thread():
        handler = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, signal.SIG_DFL if handler is None else handler)


@contextlib.contextmanager
def graceful_interrupt() -> Iterator[Callable[[], int]]:
    """While Tune runs, turn the first Ctrl-C or SIGTERM into Tune's graceful stop and remember which it was.

    Ray Tune 2.60 stops a run gracefully (last snapshot saved, trials left resumable) on SIGINT or SIGUSR1
    (``ray.tune.tune._setup_signal_catching``), but only logs that it did: ``Tuner.fit`` returns as after a
    finished run. Here ``TUNE_DISABLE_SIGINT_HANDLER=1`` (a documented Tune env variable) keeps Tune off
    SIGINT; ablate's handler records the interrupt and sends this process SIGUSR1, which Tune always handles
    the same way. A second Ctrl-C raises KeyboardInterrupt (skipping Tune's last snapshot, as Tune's own
    handler does). SIGTERM, what a batch scheduler sends before it preempts a job, is handled the same way
    (a second one raises :class:`Terminated`). Yields a function that returns the signal that interrupted the
    run (``signal.SIGINT`` or ``signal.SIGTERM``), or 0. Main thread only: elsewhere signals cannot be handled
    and nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield lambda: 0
        return
    received: list[int] = []

    def on_signal(sig: int, frame: Any) -> None:
        if received:
            raise Terminated if sig == signal.SIGTERM else KeyboardInterrupt
        received.append(sig)
        os.kill(os.getpid(), signal.SIGUSR1)

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    env_before = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        yield lambda: received[0] if received else 0
    finally:
        for sig, handler in before.items():
            if handler is None and sig == signal.SIGTERM:
                handler = signal.SIG_DFL  # Ray's C++ handler (see reclaim_sigterm): never leave ours behind
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


def new_auth_token() -> str:
    """A new dashboard auth token in Ray's own format
    (``ray._private.authentication.authentication_token_generator``; 256 random bits as hex in Ray 2.60)."""
    try:
        from ray._private.authentication.authentication_token_generator import generate_new_authentication_token
    except ImportError:  # pragma: no cover - the module moved: the same format
        import secrets

        return secrets.token_hex(32)
    return generate_new_authentication_token()


def live_clusters() -> set[str]:
    """GCS addresses of the Ray clusters whose processes run on this machine.

    ``ray._private.services.find_gcs_addresses`` is what ``ray.init(address="auto")`` uses to find them; ablate
    calls it directly so a stale address file of a stopped cluster is never followed.
    """
    from ray._private.services import find_gcs_addresses

    find_gcs_addresses.cache_clear()
    return set(find_gcs_addresses())
