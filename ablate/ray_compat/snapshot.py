"""Ray Tune's files and storage context: the experiment snapshot's format, a class Trainable's restore request,
the trial folders and Tune's environment (Ray 2.60 internals; see :mod:`ablate.ray_compat`)."""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import re
from collections.abc import Iterator
from typing import Any

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
