"""The run directory: its file names, its marker, its errors and how to write into it (reading it back:
:mod:`ablate.service.records.reader`).

A run lives in ``<storage>/<name>``, a local folder or a bucket's URI (``s3://``, ``gs://``).
ablate writes :data:`RUN_MARKER` there first (the grid, its scale and the YAML text): ``--resume``,
``status``, ``export``, ``claims`` and ``report`` refuse a directory without it, so nothing is ever read
(let alone unpickled) from a directory ablate did not write. Every other module names the files of a run
through the constants here and writes through the run directory's store
(:func:`ablate.service.records.store.as_store`: on disk atomically, on object storage one upload a file).

Layout of a run directory::

    ablate_run.json            the marker (RUN_MARKER)
    trial_<id>/params.json     a trial's settings (PARAMS_FILE), as the marker's ``points`` record them
    trial_<id>/result.json     one JSON line per report (RESULT_FILE)
    trial_<id>/checkpoint_<step>/state.pt   the trial's own checkpoints (ablate.service.records.trial)
    trial_<id>/error.json      the last error of a trial that failed for good (ERROR_FILE)
    trial_<id>/stopped.json    a search's trial its scheduler stopped early (STOPPED_FILE)
    best_config.json           an Optuna grid's best setting (BEST_CONFIG_FILE)
    optuna.journal             an Optuna grid's study as Optuna's journal (STUDY_JOURNAL; in a bucket its entries
                               optuna.journal.d/); optuna.db (OPTUNA_DB, SQLite) in a run made before 2026-11-29
    report.html                the report (REPORT_FILE)
    ablate_provenance.jsonl    what produced the run: one line per start and resume (PROVENANCE_FILE)
    ablate_environment.txt     the installed distributions at the newest start or resume (ENVIRONMENT_FILE)
    ablate_interrupted.json    present while a run stopped by Ctrl-C waits for --resume (INTERRUPTED_FILE)
    ablate_driver.lock         locked by the live `ablate run` writing the run: pid, host, start (DRIVER_LOCK; in a
                               bucket a lease object, taken and renewed by conditional puts)
    trial_<id>/.trial.lock     locked by the trial training in the folder (.trial.lease on object storage)
    trial_pack-<key>/pack.json a pack's folder (checkpoints of its members' stacked state): its members' ids

Ray Tune's own files (experiment snapshots, tuner.pkl, error.pkl) never enter a run directory (see the runner).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from ablate.files import (  # re-exported: the run directory's writes
    WriteError,
    atomic_write,
    sweep_stale_temps,
)
from ablate.messages import quote
from ablate.service.records.store import (
    as_store,
    child_location,
    open_store,
    parent_location,
    write_file,
)

__all__ = [
    "BEST_CONFIG_FILE",
    "DRIVER_LOCK",
    "INTERRUPTED",
    "INTERRUPTED_FILE",
    "MARKER_TIME_FORMAT",
    "OPTUNA_DB",
    "ENVIRONMENT_FILE",
    "PACK_FILE",
    "PROVENANCE_FILE",
    "PARAMS_FILE",
    "REPORT_FILE",
    "RESULT_FILE",
    "RUN_MARKER",
    "STOPPED_FILE",
    "STUDY_JOURNAL",
    "TRIAL_PREFIX",
    "RunError",
    "WriteError",
    "atomic_write",
    "check_run_name",
    "check_writable",
    "has_study",
    "member_id",
    "resolve_run_dir",
    "run_name",
    "split_run_dir",
    "sqlite_study",
    "study_file",
    "sweep_stale_temps",
    "write_marker",
    "write_text",
]

#: The marker ablate writes first into every run directory.
RUN_MARKER = "ablate_run.json"
#: The marker's ``created`` time: local time with its UTC offset (``time.strftime`` / ``datetime.strptime``).
MARKER_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S%z"
#: A trial's settings, written once when it starts.
PARAMS_FILE = "params.json"
#: A trial's reports, one JSON object per line, append-only.
RESULT_FILE = "result.json"
#: The best setting an Optuna grid found.
BEST_CONFIG_FILE = "best_config.json"
#: The SQLite file that holds an Optuna grid's study (opens in optuna-dashboard and optuna.load_study).
OPTUNA_DB = "optuna.db"
#: An Optuna grid's study on object storage, which has no file locks: Optuna's journal, one JSON line per operation
#: (ablate.service.records.study).
STUDY_JOURNAL = "optuna.journal"
#: The report `ablate report` writes by default.
REPORT_FILE = "report.html"
#: Trial folders are named ``trial_<trial id>``.
TRIAL_PREFIX = "trial_"
#: What produced the run, one JSON line per start and --resume (ablate.service.records.provenance). Not ``.json``: Ray copies the
#: run directory's ``.json`` files into its staging folder on a resume and back at each snapshot.
PROVENANCE_FILE = "ablate_provenance.jsonl"
#: The installed distributions (``name==version``) of the newest start or resume.
ENVIRONMENT_FILE = "ablate_environment.txt"
#: Marks a pack trial's folder (its members' ids and grid points); readers list its members, not the folder.
PACK_FILE = "pack.json"
#: A pack's folder is ``trial_pack-<key>`` (ablate.service.records.trial.pack_id).
PACK_PREFIX = "trial_pack-"
#: A trial that failed for good in a driver keeps its last error here (removed when it runs again).
ERROR_FILE = "error.json"
#: A search's trial that its scheduler (ASHA) stopped before its stop settings: finished, not interrupted.
STOPPED_FILE = "stopped.json"
#: Written when Ctrl-C stopped a run (the trials it stopped, the resume command); removed when --resume starts.
INTERRUPTED_FILE = "ablate_interrupted.json"
#: The driver's lock (ablate.service.records.store.flock): `ablate run` holds it for its whole life; no lock held = no live driver.
DRIVER_LOCK = "ablate_driver.lock"
#: The status ablate shows for a trial that a Ctrl-C stopped before it finished (Ray's snapshot says RUNNING).
INTERRUPTED = "INTERRUPTED"


def member_id(trial_id: str, index: int) -> str:
    """The trial id of member ``index`` of the pack trial ``trial_id`` (its folder is ``trial_<member id>``)."""
    return f"{trial_id}-m{index}"


class RunError(RuntimeError):
    """A run cannot start, resume or be read; the message says why and what to do."""


#: The longest folder name most file systems take (NAME_MAX, in bytes of UTF-8).
NAME_MAX_BYTES = 255


def check_run_name(name: str) -> str:
    """``name`` if it is one folder name (no ``/`` or ``\\``, not empty, ``.`` or ``..``, no control characters such
    as a newline, at most :data:`NAME_MAX_BYTES` bytes), else :class:`RunError`: a run lives directly in its
    storage, never outside it, and its name prints on one line."""
    size = len(name.encode("utf-8", "surrogatepass"))
    if (
        not name
        or name in (".", "..")
        or any(c in name for c in "/\\")
        or any(ord(c) < 32 or ord(c) == 127 for c in name)
        or size > NAME_MAX_BYTES
    ):
        shown = quote(name)
        raise RunError(
            f"run name {shown} ({size} bytes): a run name is one folder name inside --storage (not empty, '.' or "
            f"'..', no '/', '\\' or control characters such as a newline, at most {NAME_MAX_BYTES} bytes); "
            "choose another --name"
        )
    return name


def run_name(grid: str, scale: str, preset: str | None = None) -> str:
    """A run's name when ``--name`` is not given: ``<grid>-<scale>``, or ``<grid>-<scale>-<preset>``."""
    return f"{grid}-{scale}" + (f"-{preset}" if preset else "")


def resolve_run_dir(storage: str, name: str) -> str:
    """``<storage>/<name>`` (local paths made absolute; a URI's query stays at its end, ``s3://b/runs/NAME?query``);
    ``name`` must be one folder name (:func:`check_run_name`)."""
    check_run_name(name)
    return child_location(storage, name)


def split_run_dir(run_dir: str) -> tuple[str, str]:
    """(storage, name) of a run directory :func:`resolve_run_dir` made (a URI's query stays with its storage)."""
    return parent_location(run_dir)


def write_text(target: str | os.PathLike, text: str) -> str:
    """Write ``text`` as the file at ``target`` (a local path, atomically; a URI, one upload); return the target."""
    return write_file(target, text.encode("utf-8"))


def sqlite_study(run_dir: str | os.PathLike) -> Path | None:
    """The SQLite study ``optuna.db`` of a run an earlier version of ablate made on a file system, else None."""
    found = as_store(str(run_dir)).local_file(OPTUNA_DB)
    return found if found is not None and found.is_file() else None


def study_file(run_dir: str | os.PathLike) -> str:
    """The name of the run's study file: ``optuna.journal``, or ``optuna.db`` in a run an earlier version of ablate
    made on a file system."""
    return OPTUNA_DB if sqlite_study(run_dir) else STUDY_JOURNAL


def has_study(run_dir: str | os.PathLike) -> bool:
    """Whether the run directory holds a study (:func:`study_file`)."""
    return sqlite_study(run_dir) is not None or as_store(str(run_dir)).has_log(STUDY_JOURNAL)


def check_writable(storage: str) -> None:
    """Fail early, in one line naming ``storage`` and the reason, when a run's record cannot be kept there: the
    store's probe (:meth:`~ablate.service.records.store.base.Store.probe`: on disk a probe file written and
    removed; in a bucket a probe object and its conditional writes: a missing bucket, no credentials, a wrong
    endpoint, a store that ignores If-None-Match)."""
    shown = repr(storage) if any(c in storage for c in "\r\n\t") else storage
    try:
        store = open_store(storage)
        shown = repr(store.join()) if any(c in store.join() for c in "\r\n\t") else store.join()
        store.probe()
    except (OSError, ValueError) as exc:  # OSError from the store, ValueError for the URI
        reason = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
        reason = re.sub(r"\s*\(Request ID: [^)]*\)", "", " ".join(str(reason).split()))  # one line, no request id
        raise RunError(f"storage {shown}: not writable ({reason}); choose another --storage") from None
    except RuntimeError as exc:
        raise RunError(f"storage {shown}: cannot keep a run's record safely: {exc}; ablate needs a store with "
                       "conditional writes (S3, GCS, or an S3-compatible store that honours If-None-Match and "
                       "If-Match)") from None  # fmt: skip


def write_marker(run_dir: str, info: dict[str, Any]) -> None:
    """Write the run marker through the run directory's store (atomically on local disk, one upload remotely)."""
    as_store(run_dir).write_text(RUN_MARKER, json.dumps(info, indent=1))
