"""An Optuna search's study, kept in its run directory: on a file system the SQLite file ``optuna.db``
(:data:`~ablate.service.records.rundir.OPTUNA_DB`, which optuna-dashboard and ``optuna.load_study`` open), on object
storage, which has no file locks and no append, Optuna's journal ``optuna.journal`` (:data:`STUDY_JOURNAL`): one
JSON line per operation on the study, in the format of Optuna's ``JournalFileBackend``, so a downloaded copy opens
with ``JournalStorage(JournalFileBackend("optuna.journal"))``.

On object storage the study has one writer, the driver that holds the run's lease
(:mod:`ablate.service.records.driver_lock`); :class:`StoreJournal` keeps the journal in memory and uploads it whole
(one request, an atomic replace) after each operation that creates a trial, sets its settings or ends it, so a
driver killed at any moment leaves a journal that is a prefix of the operations it made, cut after the last such
one. Only the intermediate values Optuna is told at each report (which every trial's own result log also holds)
wait, at most :data:`FLUSH_S` seconds, for the next upload. Each upload first asks the driver whether it still
holds the lease (``check``), so a driver whose lease was taken over never overwrites the next one's study.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import optuna
from optuna.storages.journal import BaseJournalBackend, JournalStorage

from ablate.service.records.rundir import STUDY_JOURNAL, has_study, is_remote, optuna_storage_url
from ablate.service.records.store import Store, as_store

__all__ = ["FLUSH_S", "StoreJournal", "flush_study", "load_study", "study_storage"]

#: The longest an intermediate value (a trial's report told to Optuna) waits before the journal is uploaded again.
FLUSH_S = 10.0
#: Journal operations that only add a trial's intermediate value: uploaded with the next other one, or after FLUSH_S.
_DEFERRED = {int(optuna.storages.journal._storage.JournalOperation.SET_TRIAL_INTERMEDIATE_VALUE)}


def study_storage(
    run_dir: str | os.PathLike, *, check: Callable[[], None] | None = None
) -> optuna.storages.BaseStorage:
    """The Optuna storage of the run's study: SQLite (``sqlite:///RUN_DIR/optuna.db``) on a file system, the
    :class:`StoreJournal` on object storage, whose uploads call ``check()`` first (it raises when the driver lost
    its lease)."""
    if is_remote(str(run_dir)):
        return JournalStorage(StoreJournal(as_store(str(run_dir)), check=check))
    return optuna.storages.RDBStorage(optuna_storage_url(run_dir))


def load_study(run_dir: str | os.PathLike, study_name: str, storage: optuna.storages.BaseStorage | None = None):
    """The run's study named ``study_name`` (the grid's name), or None when the run has no study file or it holds no
    study of that name. ``storage``: one :func:`study_storage` made already (one writer in one process)."""
    if storage is None and not has_study(run_dir):
        return None
    try:
        return optuna.load_study(study_name=study_name, storage=storage or study_storage(run_dir))
    except KeyError:  # the study file holds no study of that name
        return None


class StoreJournal(BaseJournalBackend):
    """Optuna's journal of a study as one object, ``key`` in ``store``, written whole (see the module's text).

    Read once, then kept in memory: the driver that holds the run's lease is its only writer. A reader (a report,
    ``ablate status``) sees the journal as it was when first read. A line that is not JSON is a damaged file: a
    ValueError naming it, never a study read in part."""

    def __init__(self, store: Store, key: str = STUDY_JOURNAL, *, check: Callable[[], None] | None = None):
        self._store, self._key, self._check = store, key, check
        self._lines: list[str] | None = None  # each operation's JSON text, in order
        self._logs: list[dict[str, Any]] = []
        self._uploaded = 0  # operations in the object
        self._uploaded_at = time.monotonic()

    def _load(self) -> list[str]:
        if self._lines is None:
            text = self._store.read_text(self._key) or ""
            lines = text.split("\n")
            if lines[-1]:  # each upload ends with a newline: a last line without one is not a journal's
                raise ValueError(f"{self._store.join(self._key)}: not an Optuna journal (its last line is cut)")
            lines.pop()
            try:
                self._logs = [json.loads(line) for line in lines]
            except ValueError as exc:
                raise ValueError(f"{self._store.join(self._key)}: not an Optuna journal ({exc})") from None
            self._lines, self._uploaded = lines, len(lines)
        return self._lines

    def read_logs(self, log_number_from: int) -> Iterable[dict[str, Any]]:
        """The operations from number ``log_number_from`` on (0: all)."""
        self._load()
        return self._logs[log_number_from:]

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        """Add ``logs`` and upload the journal, unless they only add intermediate values and the last upload is less
        than :data:`FLUSH_S` seconds old."""
        lines = self._load()
        lines.extend(json.dumps(log, separators=(",", ":")) for log in logs)
        self._logs.extend(logs)
        waits = all(log.get("op_code") in _DEFERRED for log in logs)
        if not waits or time.monotonic() - self._uploaded_at >= FLUSH_S:
            self.flush()

    def flush(self) -> None:
        """Upload the journal if it holds operations the object does not (after ``check()``)."""
        lines = self._load()
        if self._uploaded == len(lines):
            return
        if self._check is not None:
            self._check()
        self._store.write_text(self._key, "\n".join(lines) + "\n")
        self._uploaded, self._uploaded_at = len(lines), time.monotonic()

    def __getstate__(self) -> dict[str, Any]:  # Ray Tune pickles its searcher (and so this) into its snapshots
        self.flush()
        return {"uri": self._store.uri, "key": self._key, "check": self._check}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(as_store(state["uri"]), state["key"], check=state["check"])


def flush_study(storage: optuna.storages.BaseStorage) -> None:
    """Upload what a study on object storage holds and its journal does not yet (nothing to do for SQLite)."""
    backend = getattr(storage, "_backend", None)
    if isinstance(backend, StoreJournal):
        backend.flush()
