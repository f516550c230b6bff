"""An Optuna search's study, kept in its run directory as Optuna's journal ``optuna.journal``
(:data:`STUDY_JOURNAL`): one JSON line per operation on the study, in the format of Optuna's ``JournalFileBackend``
(on a file system the file itself, which ``optuna-dashboard RUN_DIR/optuna.journal`` and ``optuna.load_study``
open). A run an earlier version of ablate made on a file system keeps its SQLite study ``optuna.db``
(:data:`~ablate.service.records.rundir.OPTUNA_DB`), read and written as it is.

The journal is the store's append-only log at that key (:meth:`~ablate.service.records.store.base.Store.append_log`):
in a bucket numbered entries ``optuna.journal.d/FFFFFFFFFF-LLLLLLLLLL``, each written once and create-only, merged
as they pile up (:mod:`ablate.service.records.store.segments`), and made one entry at the search's end
(:func:`flush_study`). :class:`StoreJournal` reads it once and appends only each operation's new lines (one request
each), so a search of ``n`` operations uploads O(journal) bytes in O(n) requests. A journal an earlier version of
ablate wrote whole, the object ``optuna.journal`` itself, is still read while no entry exists and becomes the first
entry at the next append.

**A downloaded copy.** The journal is the lines :meth:`Store.read_log` returns, as they are::

    from ablate.service.records.store import open_store
    data = open_store("s3://bucket/lab/run").read_log("optuna.journal")
    open("optuna.journal", "wb").write(data)
    optuna.load_study(study_name=NAME, storage=JournalStorage(JournalFileBackend("optuna.journal")))

After a search ended (its journal compacted) ``optuna.journal.d/`` holds one entry, which is that file as it is
(``aws s3 cp`` it); while a search runs, the entries a reader takes are concatenated in order (an entry whose
numbers lie inside another's is a merge's source, left over: skip it). An earlier version's whole object
``optuna.journal`` opens as it is.

On object storage the study has one writer, the driver that holds the run's lease
(:mod:`ablate.service.records.driver_lock`): an operation that creates a trial, sets its settings or ends it is
appended at once, so a driver killed at any moment leaves a journal that is a prefix of the operations it made, cut
after the last such one. Only the intermediate values Optuna is told at each report (which every trial's own result
log also holds) wait, at most :data:`FLUSH_S` seconds, for the next append. Each append first asks the driver
whether it still holds the lease (``check``); and the log itself is fenced: the first append of a driver writes the
whole journal as one entry reaching past every entry there, so an earlier driver still appending collides with the
new one's entries (:class:`~ablate.service.records.store.base.Conflict`) and stops with a
:class:`~ablate.service.records.store.lease.LeaseLost` naming the journal, never overwriting the next one's study.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import optuna
from optuna.storages.journal import BaseJournalBackend, JournalStorage

from ablate.service.records.rundir import STUDY_JOURNAL, has_study, sqlite_study
from ablate.service.records.store import Conflict, Store, as_store
from ablate.service.records.store.lease import LeaseLost

__all__ = ["FLUSH_S", "StoreJournal", "flush_study", "load_study", "study_storage"]

_log = logging.getLogger("ablate.service.records.study")

#: The longest an intermediate value (a trial's report told to Optuna) waits before the journal is appended to.
FLUSH_S = 10.0
#: Journal operations that only add a trial's intermediate value: appended with the next other one, or after FLUSH_S.
_DEFERRED = {int(optuna.storages.journal._storage.JournalOperation.SET_TRIAL_INTERMEDIATE_VALUE)}


def study_storage(
    run_dir: str | os.PathLike, *, check: Callable[[], None] | None = None
) -> optuna.storages.BaseStorage:
    """The Optuna storage of the run's study: Optuna's journal ``optuna.journal`` as the run's store keeps it
    (:class:`StoreJournal`), whose appends call ``check()`` first (it raises when the driver lost its lease); a run
    an earlier version of ablate made on a file system keeps its SQLite study ``optuna.db``."""
    legacy = sqlite_study(run_dir)
    if legacy is not None:
        return optuna.storages.RDBStorage(f"sqlite:///{legacy.resolve()}")
    return JournalStorage(StoreJournal(as_store(str(run_dir)), check=check))


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
    """Optuna's journal of a study as the store's log at ``key`` (see the module's text).

    Read once, then kept in memory: the driver that holds the run's lease is its only writer. A reader (a report,
    ``ablate status``) sees the journal as it was when first read. A last line without its newline is an append a
    killed writer cut: left out, with a warning naming the journal (the next append writes the journal without it).
    A line before it that is not JSON is a damaged file: a ValueError naming it, never a study read in part."""

    def __init__(self, store: Store, key: str = STUDY_JOURNAL, *, check: Callable[[], None] | None = None):
        self._store, self._key, self._check = store, key, check
        self._logs: list[dict[str, Any]] | None = None  # every operation, in order
        self._pending: list[bytes] = []  # the lines of operations not appended yet
        self._whole: bytes | None = None  # the journal's whole lines, while a cut last line must be written away
        self._appended_at = time.monotonic()
        self._lost: LeaseLost | None = None  # set once another driver's entries fenced this one off: it stops

    def _load(self) -> list[dict[str, Any]]:
        if self._logs is None:
            where = self._store.join(self._key)
            data = self._store.read_log(self._key) or b""
            whole = data[: data.rfind(b"\n") + 1]
            if len(whole) < len(data):
                _log.warning("%s: its last line is cut (an append a killed writer left): read without it", where)
                self._whole = whole
            try:
                self._logs = [json.loads(line) for line in whole.split(b"\n")[:-1]]
            except ValueError as exc:
                raise ValueError(f"{where}: not an Optuna journal ({exc})") from None
        return self._logs

    def read_logs(self, log_number_from: int) -> Iterable[dict[str, Any]]:
        """The operations from number ``log_number_from`` on (0: all)."""
        return self._load()[log_number_from:]

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        """Add ``logs`` and append them to the journal with those waiting, unless they only add intermediate values
        and the last append is less than :data:`FLUSH_S` seconds old."""
        known = self._load()
        self._raise_if_lost()
        self._pending.extend(f"{json.dumps(log, separators=(',', ':'))}\n".encode() for log in logs)
        known.extend(logs)
        waits = all(log.get("op_code") in _DEFERRED for log in logs)
        if not waits or time.monotonic() - self._appended_at >= FLUSH_S:
            self.flush()

    def flush(self) -> None:
        """Append the operations that wait, if any, as one append (after ``check()``). :class:`LeaseLost` naming the
        journal when another driver appended to it since this one began (it took over the run): never retried, and
        raised again by every later write."""
        self._raise_if_lost()
        if not self._pending:
            return
        if self._check is not None:
            self._check()
        lines = b"".join(self._pending)
        try:
            if self._whole is not None:  # a cut last line ends the log: the journal rewritten without it
                self._store.replace_log(self._key, self._whole + lines)
            else:
                self._store.append_log(self._key, lines)
        except Conflict as exc:
            self._lost = LeaseLost(self._store.join(self._key), f"another driver took over the run ({exc.mode})")
            self._raise_if_lost()
        self._pending, self._whole, self._appended_at = [], None, time.monotonic()

    def close(self) -> None:
        """At a search's end: :meth:`flush`, then make the journal one piece (one entry in a bucket, which a reader
        reads in one request and a downloaded copy is as it is), after ``check()``."""
        self.flush()
        if self._logs is None:
            return  # never read, never written
        if self._check is not None:
            self._check()
        self._store.compact_log(self._key)

    def _raise_if_lost(self) -> None:
        if self._lost is not None:
            raise LeaseLost(self._lost.where, self._lost.reason) from None

    def __getstate__(self) -> dict[str, Any]:  # Ray Tune pickles its searcher (and so this) into its snapshots
        if self._lost is None:
            self.flush()
        return {"uri": self._store.uri, "key": self._key, "check": self._check}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(as_store(state["uri"]), state["key"], check=state["check"])


def flush_study(storage: optuna.storages.BaseStorage) -> None:
    """Append what the study holds and its journal does not yet, and make the journal one piece
    (:meth:`StoreJournal.close`; the driver calls this at a search's end); nothing to do for an earlier run's
    SQLite study."""
    backend = getattr(storage, "_backend", None)
    if isinstance(backend, StoreJournal):
        backend.close()
