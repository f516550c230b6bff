"""One writer at a time on storage that cannot be locked (``s3://``, ``gs://``): a lease object with a heartbeat.

The lease is a small JSON object at a key of a :class:`~ablate.service.records.store.Store`: its holder's ``host``,
``pid``, a random ``token``, when it was taken (``taken``, epoch seconds; ``since``, the same as
:class:`~ablate.service.records.pidlock.PidLock` writes it), its newest ``heartbeat`` (epoch seconds) and its
``ttl_s``. A lease is *fresh* while ``now - heartbeat <= ttl_s``, ``now`` read from the reader's clock; a fresh lease
of another holder refuses :meth:`Lease.acquire` with the same :class:`~ablate.service.records.pidlock.LockHeld` a
``flock`` refusal raises (so :func:`ablate.service.records.driver_lock.busy_message` words both). A stale one (its
holder died, or stopped renewing) is taken over, with a warning naming the old holder; so is a damaged one.

**A holder that died on this machine.** A lease names its holder's process namespace (:func:`machine`: the
kernel's boot id and the pid namespace, on Linux). A fresh lease whose holder ran in this very namespace, and whose
pid no longer exists, is taken over at once (warned), as the kernel frees a dead holder's ``flock``: a ``--resume``
right after a ``kill -9`` on the same machine, or Ray's retry of a trial whose worker died, do not wait for the ttl.
Elsewhere (another node, another container) a pid cannot be checked, and the ttl decides.

**Clocks.** Freshness compares the writer's heartbeat with the reader's clock: the hosts' clocks must agree within a
small fraction of ``ttl_s`` (NTP gives milliseconds). A reader whose clock runs ahead by more than the ttl takes over
a live lease; make ``ttl_s`` larger where clocks are looser.

**The race.** Object stores offer no conditional put here (pyarrow cannot send one), so :meth:`Lease.acquire` reads
the object, writes its own when none is fresh, waits ``settle_s`` and reads it back: the last write wins on S3, and
a starter that reads back someone else's token has lost. This assumes a store whose reads see every write completed
before them (strong read-after-write consistency, also for overwrites): AWS S3 has provided it since December 2020 and
Google Cloud Storage documents it; some S3-compatible stores do not by default (check yours). Under that assumption
two starters cannot both win unless one of them took longer than ``settle_s`` from its first read to the end of its
write: say A's write lands first; B won only if its own write landed after A's read-back (or A would have seen it),
which is at least ``settle_s`` after A's write, while B's first read came before A's write (or B would have seen A's
fresh lease and stopped). So ``settle_s`` must exceed the slowest read-then-PUT of a tiny object, process pauses
included. What it does not guarantee: a holder that stops renewing (suspended, partitioned) past ``ttl_s`` while
still alive may be taken over and keep writing until its next :meth:`Lease.renew` finds out (:class:`LeaseLost`);
renew and release read then write (or delete) and are not atomic either, so a takeover racing them is found by one
side at its next renew, not prevented. A holder must stop writing when :meth:`Lease.check` raises.
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ablate.service.records.pidlock import LockHeld
from ablate.service.records.store import Store

__all__ = ["SETTLE_S", "TTL_S", "Lease", "LeaseLost", "holder", "machine"]

_log = logging.getLogger("ablate.service.records.lease")

#: Default lifetime of a heartbeat: a lease not renewed for this long is stale and may be taken over.
TTL_S = 60.0
#: Default wait between writing a lease and reading it back (longer than a slow read-then-PUT of a tiny object).
SETTLE_S = 2.0
#: How often a lease that reads as damaged is read before it counts as stale (see :func:`_read`).
READ_TRIES = 3


class LeaseLost(RuntimeError):
    """A held lease is no longer ours (taken over, removed, or not renewed within its ttl): stop writing.
    ``where`` names the lease object; ``holder`` is who holds it now ({pid, host, since, …}), or None."""

    def __init__(self, where: str, reason: str, holder: dict[str, Any] | None = None):
        self.where, self.holder = where, holder
        super().__init__(f"lost the lease {where}: {reason}")


def _since(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(t))


def _who(info: dict[str, Any]) -> str:
    return f"pid {info.get('pid')} on host {info.get('host')} since {info.get('since')}"


def _read(store: Store, key: str, tries: int = READ_TRIES) -> dict[str, Any] | None:
    """The lease object at ``key``; None when there is none; {} when it is damaged (warned: it counts as stale).

    Damage is read again first: a read that overlaps a rewrite (a renewal) on a store that cannot promise a whole
    copy gives a cut or padded one, which is not JSON (:meth:`ArrowStore.read_bytes
    <ablate.service.records.store.ArrowStore.read_bytes>` checks its reads' size for this; a stale-looking lease must
    never come from one torn read)."""
    for _ in range(tries):
        data = store.read_bytes(key)
        if data is None:
            return None
        try:
            info = json.loads(data)
            if not isinstance(info["token"], str):
                raise TypeError("its token is not a string")
            if not math.isfinite(float(info["heartbeat"])):
                raise ValueError("its heartbeat is not a time")
            return info
        except (ValueError, TypeError, KeyError) as exc:
            error = exc
    _log.warning("the lease %s is damaged (%s: %.80r); it counts as stale", store.join(key), type(error).__name__, data)
    return {}


def _age(info: dict[str, Any], now: float) -> float:
    return now - float(info["heartbeat"])


def _fresh(info: dict[str, Any] | None, now: float, ttl_s: float) -> bool:
    """Whether ``info`` is a lease heartbeating within its own ttl (``ttl_s`` when it names none) at ``now``."""
    if not info:
        return False
    try:
        ttl_s = float(info.get("ttl_s", ttl_s))
    except (TypeError, ValueError):
        pass
    return _age(info, now) <= ttl_s


def machine() -> str | None:
    """This process's namespace of process ids: the kernel's boot id and the pid namespace (Linux's
    ``/proc/sys/kernel/random/boot_id`` and ``/proc/self/ns/pid``), or None where they cannot be read. Two
    processes with the same value see the same pids, so one can tell whether the other's pid is alive."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def _gone_here(info: dict[str, Any]) -> bool:
    """Whether ``info``'s holder ran in this process's pid namespace (:func:`machine`) and its pid is gone."""
    here, pid = machine(), info.get("pid")
    if here is None or info.get("machine") != here or not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's live process
        return False
    return False


def _holder(info: dict[str, Any]) -> dict[str, Any]:
    """A lease's holder in :class:`LockHeld`'s shape ({pid, host, since} always there) plus its other fields."""
    return {"pid": None, "host": None, "since": None, **{k: v for k, v in info.items() if k != "token"}}


def holder(store: Store, key: str, *, clock: Callable[[], float] = time.time, ttl_s: float = TTL_S) -> dict | None:
    """Who holds a fresh lease at ``key`` ({pid, host, since, taken, heartbeat, ttl_s}), or None when the lease is
    missing, stale or damaged. ``ttl_s`` judges a lease that names no ttl of its own."""
    info = _read(store, key)
    return _holder(info) if info and _fresh(info, clock(), ttl_s) else None


class Lease:
    """The lease at ``key`` of ``store``, held from :meth:`acquire` to :meth:`release` (or as a context manager).

    ``ttl_s``: how long a heartbeat keeps the lease fresh; ``settle_s``: the wait before the read-back (see the
    module's note on the race); ``clock`` (epoch seconds) and ``sleep`` are injectable for tests. Keep the lease
    fresh with :meth:`renew` or :meth:`start_heartbeat`, and call :meth:`check` before writing.
    """

    def __init__(
        self,
        store: Store,
        key: str,
        *,
        ttl_s: float = TTL_S,
        settle_s: float = SETTLE_S,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if not ttl_s > 0 or not settle_s >= 0:
            raise ValueError(f"a lease needs ttl_s > 0 and settle_s >= 0, not {ttl_s} and {settle_s}")
        self.store, self.key, self.ttl_s, self.settle_s = store, key, float(ttl_s), float(settle_s)
        self.clock, self.sleep = clock, sleep
        self.token: str | None = None
        self._info: dict[str, Any] = {}
        self._lost: LeaseLost | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mutex = threading.Lock()

    @property
    def where(self) -> str:
        """The lease object's location, as messages name it (a path or a URI)."""
        return self.store.join(self.key)

    @property
    def held(self) -> bool:
        """Whether this lease was acquired, is not released, and has not been found lost."""
        return self.token is not None and self._lost is None

    def acquire(self) -> Lease:
        """Take the lease: :class:`LockHeld` naming the holder when another's is fresh, or when another starter's
        write won the race; a stale or damaged lease is taken over (warned). Waits ``settle_s``."""
        if self.token is not None:
            raise RuntimeError(f"the lease {self.where} is already held by this Lease")
        now = self.clock()
        old = _read(self.store, self.key)
        if _fresh(old, now, self.ttl_s) and not _gone_here(old):
            raise LockHeld(self.where, _holder(old))
        if old and _fresh(old, now, self.ttl_s):
            _log.warning("taking over the lease %s of %s: that process no longer exists on this machine",
                         self.where, _who(old))  # fmt: skip
        elif old:
            _log.warning("taking over the stale lease %s of %s (last heartbeat %.1f s ago, ttl %s s)",
                         self.where, _who(old), _age(old, now), old.get("ttl_s"))  # fmt: skip
        token = secrets.token_hex(16)
        info = {"host": socket.gethostname(), "pid": os.getpid(), "machine": machine(), "token": token,
                "since": _since(now), "taken": now, "heartbeat": now, "ttl_s": self.ttl_s}  # fmt: skip
        self.store.write_text(self.key, json.dumps(info))
        self.sleep(self.settle_s)
        back = _read(self.store, self.key)
        if not back or back.get("token") != token:
            raise LockHeld(self.where, _holder(back or {}))
        self.token, self._info, self._lost = token, info, None
        return self

    def renew(self) -> None:
        """Write a new heartbeat if the lease there is still ours; :class:`LeaseLost` (also kept for :meth:`check`)
        when another holds it, it is gone, or our previous heartbeat is older than the ttl (anyone may be taking
        it over meanwhile)."""
        with self._mutex:
            self.check()
            if self.token is None:
                raise RuntimeError(f"the lease {self.where} is not held")
            now = self.clock()
            there = _read(self.store, self.key)
            if not there or there.get("token") != self.token:
                reason = f"now held by {_who(there)}" if there else "its object is gone or damaged"
                self._lose(reason, _holder(there) if there else None)
            if _age(self._info, now) > self.ttl_s:
                self._lose(f"not renewed for {_age(self._info, now):.1f} s, over its ttl of {self.ttl_s} s")
            info = {**self._info, "heartbeat": now}
            self.store.write_text(self.key, json.dumps(info))
            self._info = info

    def _lose(self, reason: str, by: dict[str, Any] | None = None) -> None:
        self._lost = LeaseLost(self.where, reason, by)
        raise self._lost

    def check(self) -> None:
        """Raise the :class:`LeaseLost` that :meth:`renew` (or the heartbeat thread) found, if any."""
        if self._lost is not None:
            raise self._lost

    def start_heartbeat(self, every_s: float | None = None) -> Lease:
        """Renew every ``every_s`` seconds (default a third of the ttl) in a daemon thread until :meth:`release`.
        A lost lease stops it and is raised by :meth:`check`; a failed read or write is warned and retried, and
        counts as lost once the last heartbeat is older than the ttl."""
        every = self.ttl_s / 3 if every_s is None else float(every_s)
        if not 0 < every < self.ttl_s:
            raise ValueError(f"a heartbeat every {every} s cannot keep a lease of ttl {self.ttl_s} s fresh")
        if not self.held:
            raise RuntimeError(f"the lease {self.where} is not held")
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._beat, args=(every,), name=f"lease {self.key}", daemon=True)
            self._thread.start()
        return self

    def _beat(self, every: float) -> None:
        while not self._stop.wait(every):
            try:
                self.renew()
            except LeaseLost:
                _log.error("%s", self._lost)
                return
            except Exception as exc:  # a store failure: try again, until the lease has lapsed
                now = self.clock()
                if _age(self._info, now) > self.ttl_s:
                    with self._mutex:
                        self._lost = LeaseLost(self.where, f"could not renew it for {_age(self._info, now):.1f} s "
                                                           f"(ttl {self.ttl_s} s): {exc}")  # fmt: skip
                    _log.error("%s", self._lost)
                    return
                _log.warning("could not renew the lease %s (%s); trying again in %s s", self.where, exc, every)

    def release(self) -> None:
        """Stop the heartbeat and delete the lease object if it is still ours (another's is left alone)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        with self._mutex:
            token, self.token = self.token, None
            if token is None:
                return
            there = _read(self.store, self.key)
            if there and there.get("token") == token:
                self.store.delete(self.key)
            elif self._lost is None:
                _log.warning("the lease %s is no longer ours at release (%s): left as it is", self.where,
                             _who(there) if there else "gone or damaged")  # fmt: skip

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        """Release; then, when the body raised nothing, raise a :class:`LeaseLost` found meanwhile."""
        self.release()
        if exc_type is None:
            self.check()
