"""The run directory: its file names, its marker, its errors, how to write into it and how to read it back.

A run lives in ``<storage>/<name>``, a local folder or a pyarrow filesystem URI (``s3://``, ``gs://``).
ablate writes :data:`RUN_MARKER` there first (the grid, its scale and the YAML text): ``--resume``,
``status``, ``export``, ``claims`` and ``report`` refuse a directory without it, so nothing is ever read
(let alone unpickled) from a directory ablate did not write. Every other module names the files of a run
through the constants here and writes through :func:`atomic_write` / :func:`write_text`.

Layout of a run directory::

    ablate_run.json            the marker (RUN_MARKER)
    trial_<id>/params.json     a trial's settings (PARAMS_FILE), as the marker's ``points`` record them
    trial_<id>/result.json     one JSON line per report (RESULT_FILE)
    trial_<id>/checkpoint_<step>/state.pt   the trial's own checkpoints (ablate.service.records.trial)
    trial_<id>/error.json      the last error of a trial that failed for good (ERROR_FILE)
    trial_<id>/stopped.json    a search's trial its scheduler stopped early (STOPPED_FILE)
    best_config.json           an Optuna grid's best setting (BEST_CONFIG_FILE)
    optuna.db                  an Optuna grid's study (OPTUNA_DB, SQLite)
    report.html                the report (REPORT_FILE)
    ablate_provenance.jsonl    what produced the run: one line per start and resume (PROVENANCE_FILE)
    ablate_environment.txt     the installed distributions at the newest start or resume (ENVIRONMENT_FILE)
    ablate_interrupted.json    present while a run stopped by Ctrl-C waits for --resume (INTERRUPTED_FILE)
    ablate_driver.lock         locked by the live `ablate run` writing the run: pid, host, start (DRIVER_LOCK)
    trial_pack-<key>/pack.json a pack's folder (checkpoints of its members' stacked state): its members' ids

Ray Tune's own files (experiment snapshots, tuner.pkl, error.pkl) never enter a run directory (see the runner).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from ablate.files import (  # re-exported: the run directory's writes
    WriteError,
    atomic_write,
    is_remote,
    local_path,
    remove_file,
    sweep_stale_temps,
    write_text,
)
from ablate.marker import marker_problem
from ablate.messages import quote
from ablate.service.records.pidlock import lock_holder
from ablate.service.records.trial_log import ERROR_KEY, failure_count, finished, intact_rows, trial_status

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
    "TRIAL_PREFIX",
    "RunError",
    "RunReader",
    "WriteError",
    "atomic_write",
    "check_run_name",
    "check_writable",
    "is_remote",
    "member_id",
    "optuna_storage_url",
    "read_marker",
    "remove_file",
    "resolve_run_dir",
    "run_name",
    "sweep_stale_temps",
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
#: The driver's lock (ablate.service.records.pidlock): `ablate run` holds it for its whole life; no lock held = no live driver.
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
    """``<storage>/<name>`` (local paths made absolute); ``name`` must be one folder name (:func:`check_run_name`)."""
    check_run_name(name)
    if is_remote(storage):
        return storage.rstrip("/") + "/" + name
    return str(local_path(storage).expanduser().resolve() / name)


def optuna_storage_url(run_dir: str | os.PathLike) -> str:
    """SQLAlchemy URL of a local run's Optuna study (``sqlite:///RUN_DIR/optuna.db``)."""
    return f"sqlite:///{local_path(run_dir).resolve() / OPTUNA_DB}"


def check_writable(storage: str) -> None:
    """Fail early with a clear message when a local ``storage`` folder cannot be written."""
    if is_remote(storage):
        return
    root = local_path(storage).expanduser()
    probe = root / f".ablate-write-test-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok")
    except OSError as exc:
        raise RunError(f"storage {root}: not writable ({exc.strerror}); choose another --storage") from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)


class RunReader:
    """Reads the text files of a run directory on local disk or any pyarrow filesystem URI (s3://, gs://)."""

    def __init__(self, run_dir: str | os.PathLike, grid: str | None = None):
        """``grid``: read the points of that grid of a run that holds several (default: the grid it ran last)."""
        self.uri, self.grid = str(run_dir), grid
        if is_remote(self.uri):
            import pyarrow.fs as pafs

            self.fs, self.root = pafs.FileSystem.from_uri(self.uri)
        else:
            self.fs, self.root = None, str(local_path(self.uri))

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

    @staticmethod
    def trial_name(trial_id: str) -> str:
        """A trial's folder name: ``trial_<id>``."""
        return f"{TRIAL_PREFIX}{trial_id}"

    @staticmethod
    def trial_id(name: str) -> str:
        """A trial folder's id (its name without ``trial_``)."""
        return name.removeprefix(TRIAL_PREFIX)

    def trial_dirs(self) -> list[str]:
        """Names of the trial folders whose settings agree with the run's record (never a pack's own folder):
        the marker's points that have a folder, or (a run without points in its marker) every trial folder."""
        points = self.points()
        names = [n for n in self.list_dirs(TRIAL_PREFIX) if not n.startswith(PACK_PREFIX)]
        if not points:  # a search's trials, or a run from before the points: the folders that hold settings
            return [n for n in names if self.read_text(n, PACK_FILE) is None and self.read_text(n, PARAMS_FILE)]
        bad = set(self.disagreeing())
        return [n for n in names if n.removeprefix(TRIAL_PREFIX) in points and n.removeprefix(TRIAL_PREFIX) not in bad]

    def points(self) -> dict[str, dict[str, Any]]:
        """trial id → its settings, as the run marker records every point run into the run ({} for older runs).
        Read once per reader."""
        if getattr(self, "_points", None) is None:
            info = self.marker()
            points = info.get("points") if isinstance(info.get("points"), dict) else {}
            runs = [r for r in info.get("runs") or [] if isinstance(r, dict)]
            if len({r.get("grid") for r in runs}) > 1:  # several grids in one run: the points of the one read
                ids = {i for r in runs if r.get("grid") == info["grid"] for i in r.get("points", [])}
                points = {k: v for k, v in points.items() if k in ids}
            self._points = points
        return self._points

    def disagreeing(self) -> list[str]:
        """Trial ids whose params.json differs from the settings the run marker records for them (edited by hand,
        or damaged): readers leave them out and say so. Read once per reader."""
        if getattr(self, "_disagreeing", None) is None:
            self._disagreeing = []
            for trial_id, recorded in self.points().items():
                text = self.read_text(f"{TRIAL_PREFIX}{trial_id}", PARAMS_FILE)
                if text is not None and _parsed(text) != recorded:
                    self._disagreeing.append(trial_id)
        return self._disagreeing

    def marker(self) -> dict[str, Any]:
        """The run marker; refuses a directory ablate did not write."""
        text = self.read_text(RUN_MARKER)
        if text is None:
            raise RunError(
                f"{self.uri}: not an ablate run directory (no {RUN_MARKER}); ablate reads only runs it wrote itself"
            )
        try:
            info = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RunError(f"{self.uri}/{RUN_MARKER}: damaged run marker ({exc})") from None
        if not isinstance(info, dict) or "grid" not in info:
            raise RunError(f"{self.uri}/{RUN_MARKER}: not an ablate run marker")
        bad = marker_problem(info)
        if bad is not None:
            raise RunError(
                f"{self.uri}/{RUN_MARKER}: not a run marker ablate wrote ({bad}); ablate reads only runs it wrote itself"
            )
        grids = info.get("grids") if isinstance(info.get("grids"), dict) else {}
        if self.grid is None or self.grid == info["grid"]:
            return info
        if self.grid not in grids:
            raise RunError(
                f"{self.uri}: holds no run of grid {self.grid!r}; its grids: {', '.join(grids) or info['grid']}"
            )
        return {**info, **grids[self.grid], "grid": self.grid}

    def provenance(self) -> list[dict[str, Any]]:
        """Every provenance record of the run (start, then each resume), oldest first; [] for older runs."""
        out = []
        for line in (self.read_text(PROVENANCE_FILE) or "").splitlines():
            record = _parsed(line)
            if isinstance(record, dict):
                out.append(record)
        return out

    def params(self, trial_dir: str) -> dict[str, Any] | None:
        """A trial's settings: the run marker's record of its point (None when its params.json disagrees with it);
        for a run without points in its marker, its params.json (None when missing or damaged)."""
        points = self.points()
        trial_id = trial_dir.removeprefix(TRIAL_PREFIX)
        if trial_id in points:
            return None if trial_id in set(self.disagreeing()) else points[trial_id]
        text = self.read_text(trial_dir, PARAMS_FILE)
        return _parsed(text) if text else None

    def driver_live(self) -> bool:
        """Whether an `ablate run` is writing the run now: it holds :data:`DRIVER_LOCK` and no Ctrl-C stopped it."""
        live = self.fs is None and lock_holder(self._join(DRIVER_LOCK)) is not None
        return live and self.read_text(INTERRUPTED_FILE) is None

    def trial_states(self) -> dict[str, dict[str, Any]]:
        """trial_id → {status, params, config, failures, iteration, pack, error, stopped_early} of each point of the
        run, from ablate's files alone (:func:`ablate.service.records.trial_log.trial_status`; a driver is live while it holds the
        run's lock, :data:`DRIVER_LOCK`, and no Ctrl-C stopped it). ``stopped_early``: the step of the last report of
        a trial its scheduler stopped before its stop settings (TERMINATED, with :data:`STOPPED_FILE` beside its
        log), else None."""
        points = self.points() or {n.removeprefix(TRIAL_PREFIX): self.params(n) or {} for n in self.trial_dirs()}
        live, packs = self.driver_live(), self._packs()
        out = {}
        for trial_id, params in points.items():
            name = f"{TRIAL_PREFIX}{trial_id}"
            rows = self.results(name)
            error = _parsed(self.read_text(name, ERROR_FILE))
            variant = params.get("variant") if isinstance(params.get("variant"), dict) else {}
            max_steps = variant.get("max_steps", params.get("max_steps"))
            target = variant.get("target_r2", params.get("target_r2"))
            stopped = self.read_text(name, STOPPED_FILE) is not None
            status = trial_status(rows, max_steps, target, error=isinstance(error, dict), stopped=stopped, live=live)
            reached = isinstance(max_steps, int) and finished(rows, max_steps, target)
            early = status == "TERMINATED" and stopped and not reached
            out[trial_id] = {
                "status": status,
                "params": params,
                "config": params,
                "failures": failure_count(error),
                "iteration": None,
                "pack": packs.get(trial_id),
                "error": error.get("error") if isinstance(error, dict) else (rows[-1].get(ERROR_KEY) if rows else None),
                "stopped_early": rows[-1].get("step") if early else None,
            }
        return out

    def _packs(self) -> dict[str, str]:
        """member trial id → its pack's id, from the pack folders' pack.json."""
        out = {}
        for name in self.list_dirs(TRIAL_PREFIX + PACK_PREFIX.removeprefix(TRIAL_PREFIX)):
            info = _parsed(self.read_text(name, PACK_FILE))
            for member in info.get("members", []) if isinstance(info, dict) else []:
                out[str(member)] = name.removeprefix(TRIAL_PREFIX)
        return out

    def statuses(self) -> dict[str, str]:
        """trial_id → status (:meth:`trial_states`)."""
        return {k: v["status"] for k, v in self.trial_states().items()}

    def results(self, trial_dir: str) -> list[dict[str, Any]]:
        """A trial's reports: the intact rows of its result.json (:func:`ablate.service.records.trial_log.intact_rows`, the leading
        rows whose steps rise), which every command reads and a resume keeps; a line being written right now, and
        rows after the first out of order (a line appended twice, a hand edit), are left out."""
        return intact_rows(self.logged_rows(trial_dir))

    def logged_rows(self, trial_dir: str) -> list[dict[str, Any]]:
        """Every whole JSON row of a trial's result.json, intact or not (``ablate status`` compares the two)."""
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
    """Write the run marker (atomically on local disk)."""
    write_text(f"{run_dir.rstrip('/')}/{RUN_MARKER}", json.dumps(info, indent=1))


def _parsed(text: str | None) -> Any:
    """JSON ``text`` parsed, or None when it is missing or damaged."""
    try:
        return None if text is None else json.loads(text)
    except json.JSONDecodeError:
        return None
