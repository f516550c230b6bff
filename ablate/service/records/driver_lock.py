"""One driver per run directory: :func:`ablate.service.execution.runner.run_grid` holds the run's lock for its whole run.

Two ``ablate run`` (or a ``--resume``) on one run directory at once would each start Ray, write their own trial
folders and experiment state over the other's and export every point twice. The first takes an exclusive lock
on ``<run_dir>/ablate_driver.lock`` (:data:`ablate.service.records.rundir.DRIVER_LOCK`, :mod:`ablate.service.records.pidlock`) before it writes
anything or starts Ray; a second is refused with the first one's pid, host and start time. The kernel releases
the lock when the driver's process ends however it ends, so a dead driver never blocks a ``--resume``, and
``ablate status`` reads "running" only while the lock is held.

Remote storage (``s3://``, ``gs://``) cannot be locked: there nothing stops a second driver from writing the
same run directory, and nothing tells whether its driver is alive.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ablate.service.records.pidlock import LockHeld, PidLock
from ablate.service.records.rundir import DRIVER_LOCK, RunError, check_writable, is_remote

__all__ = ["busy_message", "one_driver"]


def busy_message(run_dir: str, holder: dict[str, Any]) -> str:
    """The refusal of a second driver: who writes ``run_dir`` (from :class:`ablate.service.records.pidlock.LockHeld`)."""
    pid, host, since = (holder.get(k) for k in ("pid", "host", "since"))
    who = f"ablate pid {pid} on host {host} since {since}" if pid else "another ablate process (starting up)"
    return f"{run_dir} is being written by {who}; wait for it or stop it"


def one_driver(run_dir_of: Callable[[Any, Any], str]):
    """Decorate ``run(grid, opts, **kwargs)`` (``opts`` a RunOptions: ``storage``, ``name``, ``resume``) to hold
    the driver lock of the run directory ``run_dir_of(grid, opts)`` for the whole call.

    Taken after the storage proved writable and before the call writes anything or starts Ray; a second
    driver gets a :class:`RunError` naming the holder. A run folder the call created is removed again when the
    call fails before writing anything into it (bad input leaves no empty run). A ``--resume`` of a folder
    that does not exist goes through unlocked (the call says why).
    """

    def decorate(run):
        @functools.wraps(run)
        def locked(grid, opts, **kwargs):
            run_dir = run_dir_of(grid, opts)
            if is_remote(run_dir) or (opts.resume and not Path(run_dir).exists()):
                return run(grid, opts, **kwargs)
            check_writable(opts.storage)
            fresh = not Path(run_dir).exists()
            lock = PidLock(Path(run_dir, DRIVER_LOCK))
            try:
                lock.acquire()
            except LockHeld as exc:
                raise RunError(busy_message(run_dir, exc.holder)) from None
            try:
                return run(grid, opts, **kwargs)
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
