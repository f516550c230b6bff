"""Reading a run directory back, on local disk or in a bucket (``s3://``, ``gs://``), through its
:class:`~ablate.service.records.store.Store`: :class:`RunReader` (the marker, the points, each trial's params, log
and status) and :func:`read_marker`. Nothing here writes.

A reader reads the trials as one scan of the run found them (:meth:`RunReader.files`, at its first read of a
trial): a file the scan did not see is not asked for, and a log's pieces are not listed again, so reading a run
costs a request or two a trial in a bucket (its params, its log; its error and stopped files only where they are).
"""

from __future__ import annotations

import json
import os
from typing import Any

from ablate.marker import marker_problem
from ablate.service.records.rundir import (
    DRIVER_LOCK,
    ERROR_FILE,
    INTERRUPTED_FILE,
    PACK_FILE,
    PACK_PREFIX,
    PARAMS_FILE,
    PROVENANCE_FILE,
    RESULT_FILE,
    RUN_MARKER,
    STOPPED_FILE,
    TRIAL_PREFIX,
    RunError,
)
from ablate.service.records.store import Listing, Store, open_store
from ablate.service.records.store.lease import TTL_S
from ablate.service.records.trial_log import ERROR_KEY, failure_count, finished, intact_rows, parse_rows, trial_status

__all__ = ["RunReader", "read_marker"]


class RunReader:
    """Reads the text files of a run directory on local disk or in a bucket (s3://, gs://), through
    its store (:func:`~ablate.service.records.store.open_store`)."""

    def __init__(self, run_dir: str | os.PathLike | Store, grid: str | None = None):
        """``run_dir``: a path, a URI or a :class:`~ablate.service.records.store.Store`; ``grid``: read the points of
        that grid of a run that holds several (default: the grid it ran last)."""
        self.store = run_dir if isinstance(run_dir, Store) else open_store(run_dir)
        self.uri, self.grid = self.store.uri, grid
        self._listing: Listing | None = None
        self._logged: dict[str, list[dict[str, Any]]] = {}

    def files(self) -> Listing:
        """Every file of the run as this reader's one scan found them (made at the first read of a trial)."""
        if self._listing is None:
            self._listing = self.store.scan()
        return self._listing

    def read_text(self, *parts: str) -> str | None:
        """A file's text, or None if it does not exist."""
        return self.store.read_text("/".join(parts))

    def read_listed(self, *parts: str) -> str | None:
        """A file's text as :meth:`read_text`, asked for only when the reader's scan (:meth:`files`) found it."""
        key = "/".join(parts)
        return self.store.read_text(key) if self.store.present(self.files(), key) else None

    def list_dirs(self, prefix: str = "") -> list[str]:
        """Names of sub-folders of the run directory starting with ``prefix``."""
        return [n for n in self.store.listed(self.files(), dirs=True) if n.startswith(prefix)]

    def list_files(self, prefix: str) -> list[str]:
        """Names of files in the run directory starting with ``prefix``."""
        return [n for n in self.store.listed(self.files(), dirs=False) if n.startswith(prefix)]

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
            return [n for n in names if self.read_listed(n, PACK_FILE) is None and self.read_listed(n, PARAMS_FILE)]
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
                text = self.read_listed(f"{TRIAL_PREFIX}{trial_id}", PARAMS_FILE)
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
        text = self.read_listed(trial_dir, PARAMS_FILE)
        return _parsed(text) if text else None

    def driver(self) -> dict[str, Any] | None:
        """The live `ablate run` writing the run ({pid, host, since, …}), or None: the holder of :data:`DRIVER_LOCK`
        as the store tells it (:meth:`~ablate.service.records.store.Store.lock_holder`: an ``flock``'s holder on disk;
        in a bucket a lease not released whose holder is alive on this machine, or heartbeating within its ttl by
        this machine's clock elsewhere)."""
        return self.store.lock_holder(DRIVER_LOCK, ttl_s=TTL_S)

    def driver_live(self) -> bool:
        """Whether an `ablate run` is writing the run now: it holds the driver's lock (a fresh lease on object
        storage, :meth:`driver`) and no Ctrl-C stopped it."""
        return self.driver() is not None and self.read_text(INTERRUPTED_FILE) is None

    def trial_states(self) -> dict[str, dict[str, Any]]:
        """trial_id → {status, params, config, failures, iteration, pack, error, stopped_early} of each point of the
        run, from ablate's files alone (:func:`ablate.service.records.trial_log.trial_status`; a driver is live while it holds the
        run's lock or lease, :meth:`driver`, and no Ctrl-C stopped it). ``stopped_early``: the step of the last report of
        a trial its scheduler stopped before its stop settings (TERMINATED, with :data:`STOPPED_FILE` beside its
        log), else None."""
        points = self.points() or {n.removeprefix(TRIAL_PREFIX): self.params(n) or {} for n in self.trial_dirs()}
        live, packs = self.driver_live(), self._packs()
        out = {}
        for trial_id, params in points.items():
            name = f"{TRIAL_PREFIX}{trial_id}"
            rows = self.results(name)
            error = _parsed(self.read_listed(name, ERROR_FILE))
            variant = params.get("variant") if isinstance(params.get("variant"), dict) else {}
            max_steps = variant.get("max_steps", params.get("max_steps"))
            target = variant.get("target_r2", params.get("target_r2"))
            stopped = self.read_listed(name, STOPPED_FILE) is not None
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
            info = _parsed(self.read_listed(name, PACK_FILE))
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
        """Every whole JSON row of a trial's result.json, intact or not (``ablate status`` compares the two); a line
        that is torn or not a JSON object is skipped (:func:`ablate.service.records.trial_log.parse_rows`)."""
        if trial_dir not in self._logged:
            key = f"{trial_dir}/{RESULT_FILE}"
            data = self.store.read_log(key, self.files())
            text = data.decode("utf-8", errors="replace") if data else ""
            self._logged[trial_dir] = parse_rows(text, self.store.join(key))
        return [dict(r) for r in self._logged[trial_dir]]


def read_marker(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The run marker of a directory ablate wrote; :class:`RunError` for any other directory."""
    return RunReader(run_dir).marker()


def _parsed(text: str | None) -> Any:
    """JSON ``text`` parsed, or None when it is missing or damaged."""
    try:
        return None if text is None else json.loads(text)
    except json.JSONDecodeError:
        return None
