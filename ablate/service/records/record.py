"""The run directory's owner on the driver and in the trials: :class:`RunRecord` and its :class:`TrialRecord`.

Code that runs a grid (the driver's result log, the Trainables, the scheduler's rungs, the search) reaches a trial's
folder only through these: where the folder is, its params, its result log (read, append, rewrite), its error and
stopped files, its lock (a lease on object storage) and its checkpoints. They write through the run directory's
:class:`~ablate.service.records.store.Store` (a path, a URI or a store: :func:`~ablate.service.records.store.open_store`).
Every write is of a whole file, atomic (on disk :func:`ablate.files.atomic_write`, on object storage one upload),
but the result log's append, which is the store's: O(1) a report on disk (a line; a kill may cut it, and the next
append cuts it back) and in a bucket (one create-only entry, merged as they pile up:
:mod:`ablate.service.records.store.segments`). The layout is
:mod:`ablate.service.records.rundir`'s (file names) and :mod:`ablate.service.records.trial`'s (ids, checkpoints).

Nothing here imports Ray.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from ablate.service.records import trial as checkpoints
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
from ablate.service.records.store import FolderStore, Listing, Store, as_store
from ablate.service.records.store.flock import LockHeld, PidLock
from ablate.service.records.store.lease import Lease
from ablate.service.records.trial_log import (
    cut_text,
    intact_rows,
    json_text,
    last_row_in,
    parse_rows,
)

__all__ = [
    "TRIAL_LOCK",
    "RunRecord",
    "TrialRecord",
    "folder_name",
    "own_record",
    "trial_records",
]

#: The lock a trial holds on its folder while it trains (the store's: an ``flock`` on disk,
#: :mod:`ablate.service.records.store.flock`; a lease in a bucket, :mod:`ablate.service.records.store.lease`).
TRIAL_LOCK = ".trial.lock"
#: How long a trial's lease keeps one version before a waiter takes it over (renewed every third of it).
TRIAL_TTL_S = 60.0


def folder_name(trial_id: str) -> str:
    """The name of a trial's folder: ``trial_<id>``."""
    return f"{TRIAL_PREFIX}{trial_id}"


def _write_json(store: Store, key: str, value: Any, **dumps: Any) -> None:
    store.write_text(key, json.dumps(value, default=str, **dumps))


class TrialRecord:
    """One trial's folder, ``<run>/trial_<id>`` (a pack's: ``trial_pack-<key>``, its checkpoints only), in the run
    directory ``run_dir`` (a path, a URI or its store).

    ``folder`` and ``log``: the folder's and the log's local paths on a local store, else their URIs (as messages name
    them; ``str(folder)`` keys a trial in the driver). ``local``: the folder's path, None on object storage."""

    def __init__(self, run_dir: str | os.PathLike | Store, trial_id: str):
        store = self.store = as_store(run_dir)
        self.id, self.name = trial_id, folder_name(trial_id)
        self.run_dir: str = store.join()
        self.folder: str = store.join(self.name)
        self.log: str = store.join(self.name, RESULT_FILE)

    def __repr__(self) -> str:
        return f"TrialRecord({str(self.folder)!r})"

    def _key(self, name: str) -> str:
        return f"{self.name}/{name}"

    @functools.cached_property
    def checkpoints(self) -> Store:
        """The store of the trial's folder, where its checkpoints are (:mod:`ablate.service.records.trial`)."""
        return FolderStore(self.store, self.name)

    def scan(self) -> Listing:
        """Every file in the trial's folder now (in a bucket one LIST): read its log and its checkpoints from it
        (``listing=``) without a request per file."""
        return self.store.scan(self.name)

    def make(self) -> None:
        """Create the folder (and the run directory's) where folders are real; in a bucket the writes into it make
        it."""
        self.store.make_folder(self.name)

    # ---------------------------------------------------------------- params
    def has_params(self) -> bool:
        return self.store.exists(self._key(PARAMS_FILE))

    def read_params(self) -> dict[str, Any] | None:
        """The trial's params.json, or None when it is missing or not a JSON object."""
        try:
            text = self.store.read_text(self._key(PARAMS_FILE))
            value = None if text is None else json.loads(text)
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def write_params(self, params: dict[str, Any]) -> None:
        """Write params.json (sorted keys, indented), creating the folder."""
        self.make()
        _write_json(self.store, self._key(PARAMS_FILE), params, indent=2, sort_keys=True)

    # ---------------------------------------------------------------- result log
    def _log_text(self, listing: Listing | None = None) -> str | None:
        data = self.store.read_log(self._key(RESULT_FILE), listing)
        return None if data is None else data.decode("utf-8", errors="replace")

    def rows(self, listing: Listing | None = None) -> list[dict[str, Any]]:
        """The log's intact rows (steps rising; a torn or damaged line ends them). ``listing``: a scan that covers
        the folder (:meth:`scan`), to read the log without listing its pieces."""
        return intact_rows(self.raw_rows(listing))

    def raw_rows(self, listing: Listing | None = None) -> list[dict[str, Any]]:
        """Every row of the log that parses, in order (what the coverage of a checkpoint is judged on)."""
        return parse_rows(self._log_text(listing) or "", self.log)

    def last_row(self) -> dict[str, Any] | None:
        """The log's last whole row that has a step (read from its tail), or None."""
        tail = self.store.log_tail(self._key(RESULT_FILE))
        return None if tail is None else last_row_in(tail)

    def last_step(self) -> int | None:
        """The step of the log's last row (None without one)."""
        row = self.last_row()
        return None if row is None else row["step"]

    def append(self, row: dict[str, Any]) -> None:
        """Append one report (the store's append: on disk a line, a row cut by a kill dropped first; in a bucket
        one create-only entry, :mod:`ablate.service.records.store.segments`)."""
        self.store.append_log(self._key(RESULT_FILE), (json_text(row) + "\n").encode("utf-8"))

    def rewrite(self, rows: list[dict[str, Any]]) -> None:
        """Replace the log by ``rows``, atomically."""
        self.store.replace_log(self._key(RESULT_FILE), "".join(json_text(r) + "\n" for r in rows).encode("utf-8"))

    def compact(self) -> None:
        """Make the log one piece where it is kept in pieces (a bucket's entries: one PUT of the whole log, so a
        reader reads it in one request); nothing on disk."""
        self.store.compact_log(self._key(RESULT_FILE))

    def cut(self, step: int, listing: Listing | None = None) -> tuple[int, int]:
        """Keep the log's intact rows up to ``step`` (a continued trial reports the rest again); (rows before,
        rows kept)."""
        text = self._log_text(listing)
        kept, new = cut_text(text, lambda r: r["step"] <= step)
        if new is not None:
            self.store.replace_log(self._key(RESULT_FILE), new.encode("utf-8"))
        return len(parse_rows(text or "")), len(kept)

    # ---------------------------------------------------------------- a pack's folder
    def read_pack(self) -> list[str] | None:
        """The members' trial ids a pack's folder names (``pack.json``), or None when it holds no readable list."""
        try:
            members = json.loads(self.store.read_text(self._key(PACK_FILE)) or "")["members"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return members if isinstance(members, list) and all(isinstance(m, str) for m in members) else None

    def write_pack(self, members: list[str]) -> None:
        self.make()
        _write_json(self.store, self._key(PACK_FILE), {"members": members}, indent=2)

    # ---------------------------------------------------------------- error and stopped files
    def write_error(self, error: str, failures: int, trace: str | None = None) -> None:
        """The trial's error beside its log (``error.json``: its last line, how often it failed in this driver and,
        when given, the traceback of its last failure); nothing when the folder is gone, and a full disk is let pass
        (the run's outcome names the error)."""
        there = self.store.exists(self.name)
        if there:
            with contextlib.suppress(OSError):
                info: dict = {"error": error[-2000:], "failures": failures}
                if trace:
                    info["trace"] = trace[-20000:]
                _write_json(self.store, self._key(ERROR_FILE), info, indent=1)

    def clear_error(self, listing: Listing | None = None) -> None:
        """Remove error.json (``listing``: only when the scan shows one)."""
        if self.store.present(listing, self._key(ERROR_FILE)):
            self.store.delete(self._key(ERROR_FILE))

    def write_stopped(self, by: str, step: int) -> None:
        """Say beside the log that ``by`` stopped the trial at ``step`` before its stop settings."""
        _write_json(self.store, self._key(STOPPED_FILE), {"by": by, "step": step}, indent=1)

    def clear_stopped(self, listing: Listing | None = None) -> None:
        """Remove stopped.json (``listing``: only when the scan shows one)."""
        if self.store.present(listing, self._key(STOPPED_FILE)):
            self.store.delete(self._key(STOPPED_FILE))

    # ---------------------------------------------------------------- lock and checkpoints
    def hold(
        self,
        on_wait: Callable[[LockHeld, float], None] | None = None,
        *,
        say_every_s: float = 300.0,
        ttl_s: float = TRIAL_TTL_S,
        owner: dict[str, Any] | None = None,
        dead: Callable[[dict[str, Any]], bool] | None = None,
    ) -> PidLock | Lease:
        """Take the trial's lock (creating the folder), waiting while another process holds it; ``on_wait(held,
        seconds waited)`` at once and every ``say_every_s`` while it waits. What it returns is let go with
        ``release()``; ``check()`` before a write raises when it was lost (only a lease can be).

        There is no time limit, by design: a held lock is a live process training this very setting (a search that
        suggests a setting its run is training now), and waiting for it is the right thing to do. On disk it is an
        ``flock``, released by the kernel when its holder dies (:mod:`ablate.service.records.store.flock`); in a bucket a
        lease (:mod:`ablate.service.records.store.lease`, ``ttl_s``) renewed by a heartbeat thread, taken over once this
        process has seen it unchanged for its ttl, or at once when its holder died on this machine or ``dead`` says its
        holder is gone (a Ray trial: the holder's node, written in the lease by ``owner``, is one Ray found dead)."""
        self.make()
        lock = self.store.lock(self._key(TRIAL_LOCK), ttl_s=ttl_s, owner=owner, dead=dead)
        started, said = time.monotonic(), -math.inf
        while True:
            try:
                return lock.acquire().start_heartbeat()
            except LockHeld as held:
                now = time.monotonic()
                if on_wait is not None and now - said >= say_every_s:
                    on_wait(held, now - started)
                    said = now
                time.sleep(1.0)

    def write_checkpoint(self, state: dict[str, Any], keep: int, logged: int | None = None) -> str:
        """:func:`ablate.service.records.trial.write_checkpoint` in this folder."""
        return checkpoints.write_checkpoint(self.checkpoints, state, keep, logged)

    def resume_point(
        self, covered: Callable[[dict[str, Any]], bool], map_location: Any = "cpu", listing: Listing | None = None
    ) -> dict[str, Any] | None:
        """The newest checkpoint that loads and that ``covered`` accepts (:func:`~ablate.service.records.trial.resume_point`)."""
        return checkpoints.resume_point(self.checkpoints, covered, map_location, listing)

    def drop_checkpoints_after(self, step: int | None, listing: Listing | None = None) -> list[str]:
        """:func:`ablate.service.records.trial.drop_checkpoints_after` in this folder."""
        return checkpoints.drop_checkpoints_after(self.checkpoints, step, listing)


class RunRecord:
    """A run directory (a path, a URI or its store): its trials' records. ``dir``: its local path on a local store,
    else its URI."""

    def __init__(self, run_dir: str | os.PathLike | Store):
        self.store = as_store(run_dir)
        self.dir: str = self.store.join()

    def trial(self, trial_id: str) -> TrialRecord:
        return TrialRecord(self.store, trial_id)

    def scan(self) -> Listing:
        """Every file of the run now (in a bucket one LIST a thousand files): the plan reads the run from it."""
        return self.store.scan()

    def trials(self, listing: Listing | None = None) -> Iterator[TrialRecord]:
        """Every trial folder's record, in name order (packs' folders included)."""
        for name in self.store.listed(listing, dirs=True):
            if name.startswith(TRIAL_PREFIX):
                yield self.trial(name.removeprefix(TRIAL_PREFIX))

    def points(self, listing: Listing | None = None) -> Iterator[TrialRecord]:
        """The records of the run's points: its trial folders but the packs'."""
        return (t for t in self.trials(listing) if not t.name.startswith(PACK_PREFIX))

    def packs(self, listing: Listing | None = None) -> Iterator[TrialRecord]:
        """The records of the run's packs' own folders."""
        return (t for t in self.trials(listing) if t.name.startswith(PACK_PREFIX))

    def write_best(self, info: dict[str, Any]) -> None:
        """A search's best setting (``best_config.json``), atomically."""
        _write_json(self.store, BEST_CONFIG_FILE, info, indent=1)


def own_record(record: dict[str, Any]) -> TrialRecord:
    """The folder of the Ray trial that ``record`` (its config's record, :func:`ablate.service.records.trial.record_of`)
    describes: a point's, or a pack's own (its checkpoints)."""
    return TrialRecord(record["dir"], record["id"])


def trial_records(record: dict[str, Any]) -> list[TrialRecord]:
    """The points' records a Ray trial writes reports into: its own, or each member's of a pack."""
    return [TrialRecord(record["dir"], i) for i in record.get("members") or [record["id"]]]
