"""One driver per run directory: :func:`ablate.service.execution.runner.run_grid` holds the run's lock for its whole run.

Two ``ablate run`` (or a ``--resume``) on one run directory at once would each start Ray, write their own trial
folders and experiment state over the other's and export every point twice. The first takes an exclusive lock
on ``<run_dir>/ablate_driver.lock`` (:data:`ablate.service.records.rundir.DRIVER_LOCK`, :mod:`ablate.service.records.pidlock`) before it writes
anything or starts Ray; a second is refused with the first one's pid, host and start time. The kernel releases
the lock when the driver's process ends however it ends, so a dead driver never blocks a ``--resume``, and
``ablate status`` reads "running" only while the lock is held.

Object storage (``s3://``, ``gs://``) has no lock: there the driver holds a lease instead
(``<run_dir>/ablate_driver.lease``, :data:`~ablate.service.records.rundir.DRIVER_LEASE`,
:mod:`ablate.service.records.lease`), renewed by a heartbeat thread every :data:`DRIVER_TTL_S` / 3 seconds and
deleted at the end. A second driver is refused while the lease is fresh; a dead driver's lease goes stale after
:data:`DRIVER_TTL_S` seconds (a ``--resume`` sooner than that is refused, naming the holder), and is then taken over.
A driver whose lease was lost (taken over after it stopped renewing) stops writing: the run's result log checks
the lease at each result (:class:`DriverCheck`), and the run fails in one line.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ablate.service.records.lease import Lease, LeaseLost
from ablate.service.records.pidlock import LockHeld, PidLock
from ablate.service.records.rundir import DRIVER_LEASE, DRIVER_LOCK, RunError, check_writable, is_remote
from ablate.service.records.store import as_store

__all__ = ["DRIVER_TTL_S", "DriverCheck", "busy_message", "driver_lease", "lease_lost", "one_driver"]

#: How long a driver's lease on object storage stays fresh without a heartbeat (it renews every third of it).
DRIVER_TTL_S = 60.0


def busy_message(run_dir: str, holder: dict[str, Any]) -> str:
    """The refusal of a second driver: who writes ``run_dir`` (from :class:`ablate.service.records.pidlock.LockHeld`)."""
    pid, host, since = (holder.get(k) for k in ("pid", "host", "since"))
    who = f"ablate pid {pid} on host {host} since {since}" if pid else "another ablate process (starting up)"
    return f"{run_dir} is being written by {who}; wait for it or stop it"


def driver_lease(run_dir: str, **lease: Any) -> Lease:
    """Take the driver's lease of the run directory at ``run_dir`` (a URI) and start its heartbeat; a second driver
    gets a :class:`RunError` naming the holder. ``lease``: :class:`Lease`'s settings (ttl_s, settle_s, clock)."""
    taken = Lease(as_store(run_dir), DRIVER_LEASE, **{"ttl_s": DRIVER_TTL_S, **lease})
    try:
        taken.acquire()
    except LockHeld as exc:
        raise RunError(busy_message(run_dir, exc.holder)) from None
    return taken.start_heartbeat()


class DriverCheck:
    """Called before the driver writes into the run: raises the :class:`LeaseLost` its lease's heartbeat found (a
    local run's lock is never lost: nothing to check). Pickled into another process (Ray Client runs Tune's
    callbacks on the cluster), it reads the lease object instead and compares its token: one read a call."""

    def __init__(self, lease: Lease | None = None):
        self._lease = lease
        self._where = None if lease is None else (lease.store.uri, lease.key, lease.token)

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
            if not isinstance(there, dict) or there.get("token") != token:
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
    hold the driver lock (a lease on object storage) of the run directory ``run_dir_of(grid, opts)`` for the whole
    call; ``check`` (a :class:`DriverCheck`) is what the call runs before each write of the driver.

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
            if is_remote(run_dir):
                return _leased(run, run_dir, grid, opts, **kwargs)
            if opts.resume and not Path(run_dir).exists():
                return run(grid, opts, check=DriverCheck(), **kwargs)
            check_writable(opts.storage)
            fresh = not Path(run_dir).exists()
            lock = PidLock(Path(run_dir, DRIVER_LOCK))
            try:
                lock.acquire()
            except LockHeld as exc:
                raise RunError(busy_message(run_dir, exc.holder)) from None
            try:
                return run(grid, opts, check=DriverCheck(), **kwargs)
            except BaseException:
                with contextlib.suppress(OSError):
                    if fresh and [p.name for p in Path(run_dir).iterdir()] == [DRIVER_LOCK]:
                        Path(run_dir, DRIVER_LOCK).unlink()
                        Path(run_dir).rmdir()
                raise
            finally:
                lock.release()

        return locked

    return decorate


def _leased(run, run_dir: str, grid, opts, **kwargs):
    """``run`` holding the driver's lease of the run directory on object storage (whose folders are implicit: a
    failed start leaves nothing once its lease is deleted)."""
    if opts.resume and not as_store(run_dir).exists(""):
        return run(grid, opts, check=DriverCheck(), **kwargs)
    check_writable(opts.storage)
    lease = driver_lease(run_dir)
    try:
        return run(grid, opts, check=DriverCheck(lease), **kwargs)
    except Exception as exc:
        lost = lease_lost(exc)
        if lost is None:
            raise
        raise RunError(
            f"{lost}; this driver stopped writing {run_dir} (another may be writing it now: ablate status shows who)"
        ) from None
    finally:
        lease.release()
