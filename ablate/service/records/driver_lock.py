"""One driver per run directory: :func:`ablate.service.execution.runner.run_grid` holds the run's lock for its whole run.

Two ``ablate run`` (or a ``--resume``) on one run directory at once would each start Ray, write their own trial
folders and experiment state over the other's and export every point twice. The first takes an exclusive lock
on ``<run_dir>/ablate_driver.lock`` (:data:`ablate.service.records.rundir.DRIVER_LOCK`, :mod:`ablate.service.records.store.flock`) before it writes
anything or starts Ray; a second is refused with the first one's pid, host and start time. The kernel releases
the lock when the driver's process ends however it ends, so a dead driver never blocks a ``--resume``, and
``ablate status`` reads "running" only while the lock is held.

A bucket (``s3://``, ``gs://``) has no lock: there the same key holds a lease instead (the store's
:meth:`~ablate.service.records.store.Store.lock`, :mod:`ablate.service.records.store.lease`), taken and renewed by
conditional puts every :data:`DRIVER_TTL_S` / 3 seconds and marked released at the end. A second driver is refused
at once while the holder is known alive (its pid on this machine, or its lease seen renewed); a holder on another
machine is watched for up to :data:`DRIVER_TTL_S` seconds (said in one line), and a lease unchanged that long is
taken over. A driver whose lease was lost (taken over after it stopped renewing) stops writing: the run's result log
checks the lease at each result (:class:`DriverCheck`), and the run fails in one line.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from ablate.service.records.rundir import DRIVER_LOCK, RunError, check_writable
from ablate.service.records.store import as_store
from ablate.service.records.store.flock import LockHeld, PidLock
from ablate.service.records.store.lease import Lease, LeaseLost

__all__ = ["DRIVER_TTL_S", "DriverCheck", "busy_message", "driver_lock", "lease_lost", "one_driver"]

_log = logging.getLogger("ablate.service.records.driver_lock")

#: How long a driver's lease on object storage stays fresh without a heartbeat (it renews every third of it).
DRIVER_TTL_S = 60.0


def busy_message(run_dir: str, holder: dict[str, Any]) -> str:
    """The refusal of a second driver: who writes ``run_dir`` (from :class:`ablate.service.records.store.flock.LockHeld`)."""
    pid, host, since = (holder.get(k) for k in ("pid", "host", "since"))
    who = f"ablate pid {pid} on host {host} since {since}" if pid else "another ablate process (starting up)"
    return f"{run_dir} is being written by {who}; wait for it or stop it"


def driver_lock(run_dir: str, *, sleep: Callable[[float], None] = time.sleep) -> PidLock | Lease:
    """Take the driver's lock of the run directory at ``run_dir`` (its store's :meth:`~ablate.service.records.store.
    Store.lock`: an ``flock`` on disk, a lease in a bucket, whose heartbeat it starts); a second driver gets a
    :class:`RunError` naming the holder. A lease whose holder ran on another machine is watched until it is seen
    renewed (refused) or unchanged for its ttl (taken over), with one line saying so."""
    lock = as_store(run_dir).lock(DRIVER_LOCK, ttl_s=DRIVER_TTL_S)
    said = False
    while True:
        try:
            lock.acquire()
            break
        except LockHeld as exc:
            if exc.alive:
                raise RunError(busy_message(run_dir, exc.holder)) from None
            if not said:
                _log.warning("%s: its lease is held by %s; watching it for up to %.0f s to see whether that driver "
                             "is alive", run_dir, _who(exc.holder), DRIVER_TTL_S)  # fmt: skip
                said = True
            sleep(1.0)
    return lock.start_heartbeat()


def _who(holder: dict[str, Any]) -> str:
    return f"ablate pid {holder.get('pid')} on host {holder.get('host')} since {holder.get('since')}"


class DriverCheck:
    """Called before the driver writes into the run: raises the :class:`LeaseLost` its lease's heartbeat found (a
    local run's lock is never lost: nothing to check). Pickled into another process (Ray Client runs Tune's
    callbacks on the cluster), it reads the lease object instead and compares its token: one read a call."""

    def __init__(self, lock: PidLock | Lease | None = None):
        self._lease = lock
        token = getattr(lock, "token", None)
        self._where = None if token is None else (lock.store.uri, lock.key, token)

    def __call__(self) -> None:
        if self._lease is not None:
            self._lease.check()
        elif self._where is not None:
            uri, key, token = self._where
            store = as_store(uri)
            try:
                there = json.loads(store.read_text(key) or "null")
            except ValueError:
                there = None
            if not isinstance(there, dict) or there.get("token") != token or there.get("released"):
                raise LeaseLost(store.join(key), "its object is gone, damaged or another's")

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_lease": None}


def lease_lost(exc: BaseException | None) -> LeaseLost | None:
    """The :class:`LeaseLost` behind ``exc`` (following causes and contexts: Ray Tune may wrap a callback's error)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, LeaseLost):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def one_driver(run_dir_of: Callable[[Any, Any], str]):
    """Decorate ``run(grid, opts, *, check, **kwargs)`` (``opts`` a RunOptions: ``storage``, ``name``, ``resume``) to
    hold the driver lock (a lease in a bucket) of the run directory ``run_dir_of(grid, opts)`` for the whole call;
    ``check`` (a :class:`DriverCheck`) is what the call runs before each write of the driver.

    Taken after the storage proved writable and before the call writes anything or starts Ray; a second
    driver gets a :class:`RunError` naming the holder. A run folder the call created is removed again when the
    call fails before writing anything into it (bad input leaves no empty run). A ``--resume`` of a folder
    that does not exist goes through unlocked (the call says why). A lost lease ends the call with a
    :class:`RunError` saying so.
    """

    def decorate(run):
        @functools.wraps(run)
        def locked(grid, opts, **kwargs):
            run_dir = run_dir_of(grid, opts)
            store = as_store(run_dir)
            try:
                fresh = not store.exists("")
            except OSError:  # an unreachable store, a missing bucket: said in one line
                check_writable(opts.storage)
                raise
            if opts.resume and fresh:
                return run(grid, opts, check=DriverCheck(), **kwargs)
            check_writable(opts.storage)
            lock = driver_lock(run_dir)
            store.own_logs(True)  # no other process writes the run's logs while this one holds its lock
            try:
                return run(grid, opts, check=DriverCheck(lock), **kwargs)
            except BaseException as exc:
                lost = lease_lost(exc)
                if lost is not None:
                    raise RunError(f"{lost}; this driver stopped writing {run_dir} (another may be writing it now: "
                                   "ablate status shows who)") from None  # fmt: skip
                if fresh:
                    lock.release()
                    with contextlib.suppress(OSError):
                        if store.list(dirs=True) == [] and store.list(dirs=False) == [DRIVER_LOCK]:
                            store.delete(DRIVER_LOCK)
                            store.remove_root_if_empty()
                raise
            finally:
                store.own_logs(False)
                lock.release()

        return locked

    return decorate
