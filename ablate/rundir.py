"""The run directory: its file names, its marker, its errors, how to write into it and how to read it back.

A run lives in ``<storage>/<name>``, a local folder or a pyarrow filesystem URI (``s3://``, ``gs://``).
ablate writes :data:`RUN_MARKER` there first (the grid, its scale and the YAML text): ``--resume``,
``status``, ``export``, ``claims`` and ``report`` refuse a directory without it, so nothing is ever read
(let alone unpickled) from a directory ablate did not write. Every other module names the files of a run
through the constants here and writes through :func:`atomic_write` / :func:`write_text`.

Layout of a run directory::

    ablate_run.json            the marker (RUN_MARKER)
    trial_<id>/params.json     a trial's settings (PARAMS_FILE)
    trial_<id>/result.json     one JSON line per report (RESULT_FILE)
    trial_<id>/checkpoint_*/   Ray's checkpoints (state.pt and config.json)
    experiment_state-*.json    Ray's experiment snapshots (see ablate.service.snapshots)
    best_config.json           an Optuna grid's best setting (BEST_CONFIG_FILE)
    optuna.db                  an Optuna grid's study (OPTUNA_DB, SQLite)
    report.html                the report (REPORT_FILE)
    ablate_interrupted.json    present while a run stopped by Ctrl-C waits for --resume (INTERRUPTED_FILE)
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ablate import ray_compat

__all__ = [
    "BEST_CONFIG_FILE",
    "INTERRUPTED",
    "INTERRUPTED_FILE",
    "MARKER_TIME_FORMAT",
    "OPTUNA_DB",
    "PARAMS_FILE",
    "REPORT_FILE",
    "RESULT_FILE",
    "RUN_MARKER",
    "TRIAL_PREFIX",
    "RunError",
    "RunReader",
    "atomic_write",
    "check_writable",
    "is_remote",
    "optuna_storage_url",
    "read_marker",
    "remove_file",
    "resolve_run_dir",
    "run_name",
    "write_text",
]

#: The marker ablate writes first into every run directory.
RUN_MARKER = "ablate_run.json"
#: A second copy of the marker. After a resume, Ray's storage sync copies its staging folder (a copy of the run
#: directory, marker included) over the run directory file by file, not atomically: a kill in that moment can
#: tear one file, never both copies.
RUN_MARKER_BACKUP = "ablate_run.backup.json"
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
#: The report `ablate report` writes by default.
REPORT_FILE = "report.html"
#: Trial folders are named ``trial_<trial id>``.
TRIAL_PREFIX = "trial_"
#: Written when Ctrl-C stopped a run (the trials it stopped, the resume command); removed when --resume starts.
INTERRUPTED_FILE = "ablate_interrupted.json"
#: The status ablate shows for a trial that a Ctrl-C stopped before it finished (Ray's snapshot says RUNNING).
INTERRUPTED = "INTERRUPTED"
#: Ray's statuses of a trial that has not finished.
_UNFINISHED = ("RUNNING", "PENDING", "PAUSED")


class RunError(RuntimeError):
    """A run cannot start, resume or be read; the message says why and what to do."""


def is_remote(uri: str | os.PathLike) -> bool:
    """True for a pyarrow filesystem URI (``s3://``, ``gs://``); False for a local path or ``file://``."""
    text = str(uri)
    return "://" in text and not text.startswith("file://")


def _local(uri: str | os.PathLike) -> Path:
    return Path(str(uri).removeprefix("file://"))


def run_name(grid: str, scale: str, preset: str | None = None) -> str:
    """A run's name when ``--name`` is not given: ``<grid>-<scale>``, or ``<grid>-<scale>-<preset>``."""
    return f"{grid}-{scale}" + (f"-{preset}" if preset else "")


def resolve_run_dir(storage: str, name: str) -> str:
    """``<storage>/<name>`` (local paths made absolute)."""
    if is_remote(storage):
        return storage.rstrip("/") + "/" + name
    return str(_local(storage).expanduser().resolve() / name)


def optuna_storage_url(run_dir: str | os.PathLike) -> str:
    """SQLAlchemy URL of a local run's Optuna study (``sqlite:///RUN_DIR/optuna.db``)."""
    return f"sqlite:///{_local(run_dir).resolve() / OPTUNA_DB}"


def atomic_write(path: str | os.PathLike, write: Callable[[Path], Any]) -> None:
    """Call ``write(tmp)`` on a temporary name beside ``path``, then rename it into place, so a reader (or a
    resume after a kill) sees the old file or the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


def write_text(target: str | os.PathLike, text: str) -> str:
    """Write ``text`` to a local path (atomically, creating folders) or a remote URI; return the target."""
    target = str(target)
    if is_remote(target):
        import pyarrow.fs as pafs

        fs, path = pafs.FileSystem.from_uri(target)
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with fs.open_output_stream(path) as f:
            f.write(text.encode())
        return target
    path = _local(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))
    return target


def remove_file(target: str | os.PathLike) -> None:
    """Delete a file at a local path or a remote URI; a missing file is fine."""
    target = str(target)
    if is_remote(target):
        import pyarrow.fs as pafs

        fs, path = pafs.FileSystem.from_uri(target)
        if fs.get_file_info(path).type == pafs.FileType.File:
            fs.delete_file(path)
        return
    _local(target).unlink(missing_ok=True)


def check_writable(storage: str) -> None:
    """Fail early with a clear message when a local ``storage`` folder cannot be written."""
    if is_remote(storage):
        return
    root = _local(storage).expanduser()
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".ablate-write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise RunError(f"storage {root}: not writable ({exc.strerror}); choose another --storage") from None


class RunReader:
    """Reads the text files of a run directory on local disk or any pyarrow filesystem URI (s3://, gs://)."""

    def __init__(self, run_dir: str | os.PathLike):
        self.uri = str(run_dir)
        if is_remote(self.uri):
            import pyarrow.fs as pafs

            self.fs, self.root = pafs.FileSystem.from_uri(self.uri)
        else:
            self.fs, self.root = None, str(_local(self.uri))

    def _join(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def read_text(self, *parts: str) -> str | None:
        """A file's text, or None if it does not exist."""
        path = self._join(*parts)
        if self.fs is None:
            p = Path(path)
            return p.read_text() if p.is_file() else None
        import pyarrow.fs as pafs

        if self.fs.get_file_info(path).type != pafs.FileType.File:
            return None
        with self.fs.open_input_stream(path) as f:
            return f.read().decode()

    def _entries(self, prefix: str, directories: bool) -> list[str]:
        if self.fs is None:
            root = Path(self.root)
            if not root.is_dir():
                return []
            return sorted(
                p.name
                for p in root.iterdir()
                if (p.is_dir() if directories else p.is_file()) and p.name.startswith(prefix)
            )
        import pyarrow.fs as pafs

        kind = pafs.FileType.Directory if directories else pafs.FileType.File
        infos = self.fs.get_file_info(pafs.FileSelector(self.root))
        return sorted(i.base_name for i in infos if i.type == kind and i.base_name.startswith(prefix))

    def list_dirs(self, prefix: str = "") -> list[str]:
        """Names of sub-folders of the run directory starting with ``prefix``."""
        return self._entries(prefix, directories=True)

    def list_files(self, prefix: str) -> list[str]:
        """Names of files in the run directory starting with ``prefix``."""
        return self._entries(prefix, directories=False)

    def trial_dirs(self) -> list[str]:
        """Names of the trial folders (``trial_<id>``)."""
        return self.list_dirs(TRIAL_PREFIX)

    def marker(self) -> dict[str, Any]:
        """The run marker (its backup copy where a kill tore it); refuses a directory ablate did not write."""
        text = self.read_text(RUN_MARKER)
        if text is None:
            raise RunError(
                f"{self.uri}: not an ablate run directory (no {RUN_MARKER}); ablate reads only runs it wrote itself"
            )
        try:
            info = json.loads(text)
        except json.JSONDecodeError as exc:
            info = _parsed(self.read_text(RUN_MARKER_BACKUP))
            if info is None:
                raise RunError(f"{self.uri}/{RUN_MARKER}: damaged run marker ({exc}), and no intact backup") from None
        if not isinstance(info, dict) or "grid" not in info:
            raise RunError(f"{self.uri}/{RUN_MARKER}: not an ablate run marker")
        return info

    def params(self, trial_dir: str) -> dict[str, Any] | None:
        """A trial's params.json, or None when it is missing or damaged."""
        text = self.read_text(trial_dir, PARAMS_FILE)
        return _parsed(text) if text else None

    def trial_states(self) -> dict[str, dict[str, Any]]:
        """trial_id → {status, params, failures} from the newest experiment state (JSON fields only).

        The newest is the one with the latest session timestamp in its name: Ray's storage sync rewrites
        every file at the end of a run, so modification times cannot tell.
        A run that Ctrl-C stopped (:data:`INTERRUPTED_FILE` present) has no driver left: its unfinished trials
        read as :data:`INTERRUPTED`, not as the RUNNING of Ray's last snapshot.
        """
        names = self.list_files(ray_compat.EXPERIMENT_STATE_PREFIX)
        if not names:
            return {}
        states = ray_compat.parse_experiment_state(self.read_text(names[-1]) or "{}")
        if self.read_text(INTERRUPTED_FILE) is not None:
            for state in states.values():
                if state["status"] in _UNFINISHED:
                    state["status"] = INTERRUPTED
        return states

    def statuses(self) -> dict[str, str]:
        """trial_id → Ray status, from the newest experiment state."""
        return {k: v["status"] for k, v in self.trial_states().items()}

    def results(self, trial_dir: str) -> list[dict[str, Any]]:
        """A trial's reports from its result.json (a line being written right now is skipped)."""
        rows = []
        for line in (self.read_text(trial_dir, RESULT_FILE) or "").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return rows


def read_marker(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The run marker of a directory ablate wrote; :class:`RunError` for any other directory."""
    return RunReader(run_dir).marker()


def write_marker(run_dir: str, info: dict[str, Any]) -> None:
    """Write the run marker and its backup copy (each atomically on local disk)."""
    for name in (RUN_MARKER, RUN_MARKER_BACKUP):
        write_text(f"{run_dir.rstrip('/')}/{name}", json.dumps(info, indent=1))


def _parsed(text: str | None) -> Any:
    """JSON ``text`` parsed, or None when it is missing or damaged."""
    try:
        return None if text is None else json.loads(text)
    except json.JSONDecodeError:
        return None
