"""The run directory's owner on the driver and in the trials: :class:`RunRecord` and its :class:`TrialRecord`.

Code that runs a grid (the driver's result log, the Trainables, the scheduler's rungs, the search) reaches a trial's
folder only through these: where the folder is, its params, its result log (read, append, rewrite), its error and
stopped files, its lock and its checkpoints. Every write is atomic (:func:`ablate.files.atomic_write`), but the
log's append, which a kill may cut and the next append cuts back (:func:`ablate.service.records.trial_log.append_row`). The layout
is :mod:`ablate.service.records.rundir`'s (file names) and :mod:`ablate.service.records.trial`'s (ids, checkpoints).

Nothing here imports Ray.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ablate.files import atomic_write
from ablate.service.records import trial as checkpoints
from ablate.service.records.pidlock import LockHeld, PidLock
from ablate.service.records.rundir import (
    BEST_CONFIG_FILE,
    ERROR_FILE,
    PACK_FILE,
    PACK_PREFIX,
    PARAMS_FILE,
    RESULT_FILE,
    STOPPED_FILE,
    TRIAL_PREFIX,
)
from ablate.service.records.trial_log import append_row, cut_log, intact_rows, json_text, last_row, last_step, read_rows

__all__ = ["TRIAL_LOCK", "RunRecord", "TrialRecord", "folder_name", "own_record", "trial_records"]

#: The lock a trial holds on its folder while it trains (:mod:`ablate.service.records.pidlock`).
TRIAL_LOCK = ".trial.lock"


def folder_name(trial_id: str) -> str:
    """The name of a trial's folder: ``trial_<id>``."""
    return f"{TRIAL_PREFIX}{trial_id}"


def _write_json(path: Path, value: Any, **dumps: Any) -> None:
    text = json.dumps(value, default=str, **dumps)
    atomic_write(path, lambda p: p.write_text(text))


class TrialRecord:
    """One trial's folder, ``<run>/trial_<id>`` (a pack's: ``trial_pack-<key>``, its checkpoints only)."""

    def __init__(self, run_dir: str | os.PathLike, trial_id: str):
        self.run_dir, self.id = Path(run_dir), trial_id
        self.folder = self.run_dir / folder_name(trial_id)
        self.log = self.folder / RESULT_FILE

    def __repr__(self) -> str:
        return f"TrialRecord({str(self.folder)!r})"

    def make(self) -> None:
        """Create the folder (and the run directory's, if need be)."""
        self.folder.mkdir(parents=True, exist_ok=True)

    # ---------------------------------------------------------------- params
    def has_params(self) -> bool:
        return (self.folder / PARAMS_FILE).exists()

    def read_params(self) -> dict[str, Any] | None:
        """The trial's params.json, or None when it is missing or not a JSON object."""
        try:
            value = json.loads((self.folder / PARAMS_FILE).read_text())
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def write_params(self, params: dict[str, Any]) -> None:
        """Write params.json (sorted keys, indented), creating the folder."""
        self.make()
        _write_json(self.folder / PARAMS_FILE, params, indent=2, sort_keys=True)

    # ---------------------------------------------------------------- result log
    def rows(self) -> list[dict[str, Any]]:
        """The log's intact rows (steps rising; a torn or damaged line ends them)."""
        return intact_rows(read_rows(self.log))

    def raw_rows(self) -> list[dict[str, Any]]:
        """Every row of the log that parses, in order (what the coverage of a checkpoint is judged on)."""
        return read_rows(self.log)

    def last_row(self) -> dict[str, Any] | None:
        return last_row(self.log)

    def last_step(self) -> int | None:
        """The step of the log's last row (None without one)."""
        return last_step(self.log)

    def append(self, row: dict[str, Any]) -> None:
        """Append one report (a row cut by a kill is dropped first)."""
        append_row(self.log, row)

    def rewrite(self, rows: list[dict[str, Any]]) -> None:
        """Replace the log by ``rows``, atomically."""
        text = "".join(json_text(r) + "\n" for r in rows)
        atomic_write(self.log, lambda p: p.write_text(text))

    def cut(self, step: int) -> tuple[int, int]:
        """Keep the log's intact rows up to ``step`` (a continued trial reports the rest again); (rows before,
        rows kept)."""
        before = len(read_rows(self.log))
        return before, len(cut_log(self.log, lambda r: r["step"] <= step))

    # ---------------------------------------------------------------- a pack's folder
    def read_pack(self) -> list[str] | None:
        """The members' trial ids a pack's folder names (``pack.json``), or None when it holds no readable list."""
        try:
            members = json.loads((self.folder / PACK_FILE).read_text())["members"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return members if isinstance(members, list) and all(isinstance(m, str) for m in members) else None

    def write_pack(self, members: list[str]) -> None:
        self.make()
        _write_json(self.folder / PACK_FILE, {"members": members}, indent=2)

    # ---------------------------------------------------------------- error and stopped files
    def write_error(self, error: str, failures: int) -> None:
        """The trial's error beside its log (``error.json``: its last line and how often it failed in this driver);
        nothing when the folder is gone, and a full disk is let pass (the run's outcome names the error)."""
        if self.folder.is_dir():
            with contextlib.suppress(OSError):
                _write_json(self.folder / ERROR_FILE, {"error": error[-2000:], "failures": failures}, indent=1)

    def clear_error(self) -> None:
        (self.folder / ERROR_FILE).unlink(missing_ok=True)

    def write_stopped(self, by: str, step: int) -> None:
        """Say beside the log that ``by`` stopped the trial at ``step`` before its stop settings."""
        _write_json(self.folder / STOPPED_FILE, {"by": by, "step": step}, indent=1)

    def clear_stopped(self) -> None:
        (self.folder / STOPPED_FILE).unlink(missing_ok=True)

    # ---------------------------------------------------------------- lock and checkpoints
    def hold(self, on_wait: Callable[[LockHeld, float], None] | None = None, *, say_every_s: float = 300.0) -> PidLock:
        """Take the trial's lock (creating the folder), waiting while another process holds it; ``on_wait(held,
        seconds waited)`` at once and every ``say_every_s`` while it waits.

        There is no time limit, by design: the lock is an ``flock``, released by the kernel when its holder dies
        (:mod:`ablate.service.records.pidlock`), so a held lock is a live process training this very setting (a
        search that suggests a setting its run is training now), and waiting for it is the right thing to do."""
        self.make()
        lock, started, said = PidLock(self.folder / TRIAL_LOCK), time.monotonic(), -math.inf
        while True:
            try:
                return lock.acquire()
            except LockHeld as held:
                now = time.monotonic()
                if on_wait is not None and now - said >= say_every_s:
                    on_wait(held, now - started)
                    said = now
                time.sleep(1.0)

    def resume_point(
        self, covered: Callable[[dict[str, Any]], bool], map_location: Any = "cpu"
    ) -> dict[str, Any] | None:
        """The newest checkpoint that loads and that ``covered`` accepts (:func:`~ablate.service.records.trial.resume_point`)."""
        return checkpoints.resume_point(self.folder, covered, map_location)

    def drop_checkpoints_after(self, step: int | None) -> list[str]:
        """:func:`ablate.service.records.trial.drop_checkpoints_after` in this folder."""
        return checkpoints.drop_checkpoints_after(self.folder, step)


class RunRecord:
    """A run directory: its trials' records."""

    def __init__(self, run_dir: str | os.PathLike):
        self.dir = Path(run_dir)

    def trial(self, trial_id: str) -> TrialRecord:
        return TrialRecord(self.dir, trial_id)

    def trials(self) -> Iterator[TrialRecord]:
        """Every trial folder's record, in name order (packs' folders included)."""
        for folder in sorted(self.dir.glob(f"{TRIAL_PREFIX}*")):
            if folder.is_dir():
                yield self.trial(folder.name.removeprefix(TRIAL_PREFIX))

    def points(self) -> Iterator[TrialRecord]:
        """The records of the run's points: its trial folders but the packs'."""
        return (t for t in self.trials() if not t.folder.name.startswith(PACK_PREFIX))

    def packs(self) -> Iterator[TrialRecord]:
        """The records of the run's packs' own folders."""
        return (t for t in self.trials() if t.folder.name.startswith(PACK_PREFIX))

    def write_best(self, info: dict[str, Any]) -> None:
        """A search's best setting (``best_config.json``), atomically."""
        _write_json(self.dir / BEST_CONFIG_FILE, info, indent=1)


def own_record(record: dict[str, Any]) -> TrialRecord:
    """The folder of the Ray trial that ``record`` (its config's record, :func:`ablate.service.records.trial.record_of`)
    describes: a point's, or a pack's own (its checkpoints)."""
    return TrialRecord(record["dir"], record["id"])


def trial_records(record: dict[str, Any]) -> list[TrialRecord]:
    """The points' records a Ray trial writes reports into: its own, or each member's of a pack."""
    return [TrialRecord(record["dir"], i) for i in record.get("members") or [record["id"]]]
