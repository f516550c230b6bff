"""One writer at a time: an exclusive ``fcntl.flock`` on a file that names its holder (pid, host, start time).

``ablate run`` holds such a lock on ``<run_dir>/ablate_driver.lock`` (:data:`ablate.service.records.rundir.DRIVER_LOCK`) for
its whole life (:mod:`ablate.service.execution.runner`), and ``ablate status`` asks :func:`lock_holder` whether a live
driver holds it. The kernel releases the lock when the holding process ends, however it ends (exit, Ctrl-C,
SIGTERM, ``kill -9``), so a lock is never left behind by a dead driver; the file itself stays, and its content is
believed only while the lock is held. The descriptor is not inherited by processes the holder starts (Python
opens it close-on-exec), so Ray's processes never keep a dead driver's lock.

Limits: a lock needs a local file system, or NFS (Linux emulates ``flock`` with NFS byte-range locks there).
Object stores (``s3://``, ``gs://``) have no locks at all: a run directory there is kept by a lease with a heartbeat
in their place (:mod:`ablate.service.records.store.lease`), which expires rather than being released by a kernel.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

__all__ = ["LockHeld", "PidLock", "lock_holder"]

#: How long :meth:`PidLock.acquire` retries before it gives up: a reader (:func:`lock_holder`) holds a shared lock
#: for microseconds, which must not turn a free lock into a refusal.
RETRY_S = 1.0


class LockHeld(RuntimeError):
    """Another live process holds the lock; ``holder`` is what it wrote ({pid, host, since}; values may be None).
    ``alive``: whether the holder is known to be alive (an ``flock``'s always is; a lease's may only be watched)."""

    alive: bool = True

    def __init__(self, path: Path, holder: dict[str, Any]):
        self.path, self.holder = path, holder
        pid, host, since = (holder.get(k) for k in ("pid", "host", "since"))
        who = f"pid {pid} on host {host} since {since}" if pid else "another process (it has not said who yet)"
        super().__init__(f"{path} is held by {who}")


def _read(fd: int) -> dict[str, Any]:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def lock_holder(path: str | os.PathLike) -> dict[str, Any] | None:
    """{pid, host, since} of the live process that holds the lock at ``path``; None when nobody holds it (or there
    is no such file). A file this process may not open counts as held (with unknown holder): nothing is known."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError:
        return {"pid": None, "host": None, "since": None}
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return {"pid": None, "host": None, "since": None, **_read(fd)}
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class PidLock:
    """An exclusive lock on ``path`` (created with its folder), held from :meth:`acquire` to :meth:`release`."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.fd: int | None = None

    def acquire(self) -> PidLock:
        """Take the lock and write this process's pid, host and start time into the file; :class:`LockHeld` when
        another live process holds it."""
        deadline = time.monotonic() + RETRY_S
        while True:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:  # its folder was removed meanwhile (a failed start cleaning up): again
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = {"pid": None, "host": None, "since": None, **_read(fd)}
                os.close(fd)
                if time.monotonic() > deadline:
                    raise LockHeld(self.path, holder) from None
                time.sleep(0.05)
                continue
            except BaseException:
                os.close(fd)
                raise
            if self._same_file(fd):
                break
            os.close(fd)  # the file was removed and made anew while we waited: lock the new one
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S %z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self.fd = fd
        return self

    def _same_file(self, fd: int) -> bool:
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return False
        held = os.fstat(fd)
        return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)

    def release(self) -> None:
        """Let the lock go (the file stays; its content is believed only while a lock is held)."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)  # closing the only descriptor releases the flock
            self.fd = None

    def start_heartbeat(self) -> PidLock:
        """Nothing to renew: an ``flock`` is held until released (as a lease's heartbeat keeps it)."""
        return self

    def check(self) -> None:
        """Nothing to check: an ``flock`` is held until released (as :meth:`Lease.check
        <ablate.service.records.store.lease.Lease.check>` is asked, before a write)."""

    def __enter__(self) -> PidLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
