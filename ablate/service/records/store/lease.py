"""One writer at a time on a store without locks (a bucket: ``s3://``, ``gs://``; ``memory://``): a lease object
taken, renewed and released by conditional puts (:class:`~ablate.service.records.store.Store`'s compare-and-swap).

The lease is a small JSON object: its holder's ``host``, ``pid``, process namespace (``machine``), a random
``token``, a heartbeat counter ``beat``, its ``ttl_s`` and, for people, ``since`` and ``heartbeat`` (wall-clock
times). Its safety rests on the store alone, never on waiting or on two hosts' clocks:

- **Taking it** is one create-only put (no lease there), or one put that matches the version read (a released,
  damaged or stale lease). Of two starters racing, the store lets exactly one write; the other gets
  :class:`~ablate.service.records.store.flock.LockHeld`, the refusal a ``flock`` raises.
- **Stale** means: this waiter has seen the *same version* of the lease for ``ttl_s`` on its own monotonic clock.
  A live holder renews every third of its ttl, so its version changes; the holder's wall-clock heartbeat is never
  compared with the waiter's clock (a host whose clock is off neither takes a live lease nor keeps a dead one).
- **Renewing** is one put matched on the version the holder last wrote; **releasing** is one matched put of a
  ``released`` tombstone (a store may not offer a conditional delete), which the next starter takes at once.
- **Fencing.** A holder whose lease was taken over fails its next renewal (the version moved) and raises
  :class:`LeaseLost`; :meth:`Lease.check`, called before every write under the lease, renews first when the last
  confirmation is older than half the ttl, so a holder that wakes from a pause past its ttl learns that it lost
  before it writes, not at its next heartbeat. A store that cannot be reached is waited for (its client retries):
  nobody can take the lease meanwhile without the store, and a renewal that then succeeds proves nobody did.
- **A holder whose node the cluster found dead** (``dead``, asked by a Ray trial of its cluster) is taken over at
  once, as is
- **a holder that died on this machine** (same boot id and pid namespace, :func:`machine`; pid gone) is taken over
  at once, as the kernel frees a dead holder's ``flock``: a ``--resume`` right after a ``kill -9`` does not wait.

What it does not close: a write already sent when the holder paused, landing after a successor took over (a
write's own condition closes that; the result log's segments are the next step, issue 47). A put whose reply was
lost and that the client retried is recognised by reading back the token.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ablate.service.records.store.base import CREATE, Conflict, Got, Match, PutMode, Store
from ablate.service.records.store.flock import LockHeld

__all__ = ["TTL_S", "Lease", "LeaseLost", "holder", "machine"]

_log = logging.getLogger("ablate.service.records.store.lease")

#: Default lifetime of a lease version: a waiter that sees one version this long calls the lease stale.
TTL_S = 60.0


class LeaseLost(RuntimeError):
    """A held lease is no longer ours (taken over, or released by another): stop writing. ``where`` names the lease
    object; ``holder`` is who holds it now ({pid, host, since, …}), or None. Picklable (a trial's error crosses
    from Ray's worker to its driver)."""

    def __init__(self, where: str, reason: str, holder: dict[str, Any] | None = None):
        self.where, self.reason, self.holder = where, reason, holder
        super().__init__(f"lost the lease {where}: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.where, self.reason, self.holder)


def _since(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(t))


def _who(info: dict[str, Any]) -> str:
    return f"pid {info.get('pid')} on host {info.get('host')} since {info.get('since')}"


def _parse(got: Got | None) -> dict[str, Any] | None:
    """The lease in ``got``: None when there is none, {} when it is damaged (it counts as free, warned)."""
    if got is None:
        return None
    try:
        info = json.loads(got.data)
        if not isinstance(info, dict) or not isinstance(info.get("token"), str):
            raise ValueError("not a lease")
        return info
    except (ValueError, UnicodeDecodeError):
        return {}


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


def _here(info: dict[str, Any]) -> bool | None:
    """Whether ``info``'s holder, which ran in this process's pid namespace, is alive: True or False; None when it
    ran elsewhere (its pid cannot be checked from here)."""
    here, pid = machine(), info.get("pid")
    if here is None or info.get("machine") != here or not isinstance(pid, int) or pid <= 0:
        return None
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's live process
        return True
    return True


def _holder(info: dict[str, Any]) -> dict[str, Any]:
    """A lease's holder in :class:`LockHeld`'s shape ({pid, host, since} always there) plus its other fields."""
    return {"pid": None, "host": None, "since": None, **{k: v for k, v in info.items() if k != "token"}}


def holder(store: Store, key: str, *, clock: Callable[[], float] = time.time, ttl_s: float = TTL_S) -> dict | None:
    """Who holds the lease at ``key`` as one read tells ({pid, host, since, heartbeat, ttl_s, …}), for ``ablate
    status``; None when there is none, it is released or damaged, or its holder is known dead. A holder on this
    machine is checked by its pid; one elsewhere is shown while its last heartbeat is within its ttl by this
    machine's clock. Only what is shown rests on that clock: taking a lease never does (:class:`Lease`)."""
    info = _parse(store.get(key))
    if not info or info.get("released"):
        return None
    alive = _here(info)
    if alive is None:
        try:
            alive = clock() - float(info["heartbeat"]) <= float(info.get("ttl_s", ttl_s))
        except (KeyError, TypeError, ValueError):
            alive = False
    return _holder(info) if alive else None


class Lease:
    """The lease at ``key`` of ``store``, held from :meth:`acquire` to :meth:`release` (or as a context manager).

    ``ttl_s``: how long a waiter watches one version before it calls the lease stale; ``clock`` (epoch seconds,
    written for people), ``monotonic`` and ``sleep`` are injectable for tests. ``owner``: more fields this holder
    writes into the lease (its Ray node); ``dead(info)``: whether a holder elsewhere is known dead (a Ray node that
    Ray found dead), so that a waiter takes its lease at once instead of after the ttl. Keep the lease with :meth:`renew` or
    :meth:`start_heartbeat`, and call :meth:`check` before each write under it.
    """

    def __init__(
        self,
        store: Store,
        key: str,
        *,
        ttl_s: float = TTL_S,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        owner: dict[str, Any] | None = None,
        dead: Callable[[dict[str, Any]], bool] | None = None,
    ):
        if not ttl_s > 0:
            raise ValueError(f"a lease needs ttl_s > 0, not {ttl_s}")
        self.store, self.key, self.ttl_s = store, key, float(ttl_s)
        self.owner, self.dead = dict(owner or {}), dead
        self.clock, self.monotonic = clock, monotonic
        self.token: str | None = None
        self.version: str | None = None
        self._info: dict[str, Any] = {}
        self._confirmed = -float("inf")
        self._seen: tuple[str, float] | None = None  # (version, when first seen): a waiter's watch
        self._lost: LeaseLost | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mutex = threading.RLock()

    @property
    def where(self) -> str:
        """The lease object's location, as messages name it."""
        return self.store.join(self.key)

    @property
    def held(self) -> bool:
        """Whether this lease was acquired, is not released, and has not been found lost."""
        return self.token is not None and self._lost is None

    def acquire(self) -> Lease:
        """Take the lease if it is free, released, damaged, stale (its version unchanged for its ttl since this
        Lease first saw it) or its holder died on this machine; else :class:`LockHeld` naming the holder, with
        ``alive`` True when the holder is known alive (its pid here, or a version change seen while watching)."""
        if self.token is not None:
            raise RuntimeError(f"the lease {self.where} is already held by this Lease")
        if self._seen is None:  # a first try: a lease not there yet (a new trial's) is one create-only put
            try:
                return self._put_new(CREATE)
            except _Taken as taken:
                got = taken.got
        else:
            got = self.store.get(self.key)
        info = _parse(got)
        if got is None or info is None:
            return self._take(CREATE)
        mode = Match(got.version)
        if not info:
            _log.warning("the lease %s is damaged (%.80r); taking it", self.where, got.data)
            return self._take(mode)
        if info.get("released"):
            return self._take(mode)
        alive = _here(info)
        if alive is None and self._known_dead(info):
            _log.warning("taking over the lease %s of %s: its node is dead", self.where, _who(info))
            return self._take(mode)
        if alive is False:
            _log.warning("taking over the lease %s of %s: that process no longer exists on this machine",
                         self.where, _who(info))  # fmt: skip
            return self._take(mode)
        changed = self._seen is not None and self._seen[0] != got.version
        if self._seen is None or changed:
            self._seen = (got.version, self.monotonic())
        watched = self.monotonic() - self._seen[1]
        ttl = _ttl(info, self.ttl_s)
        if alive is None and watched >= ttl:
            _log.warning("taking over the stale lease %s of %s (unchanged for %.1f s, ttl %s s)",
                         self.where, _who(info), watched, ttl)  # fmt: skip
            return self._take(mode)
        held = LockHeld(self.where, _holder(info))  # type: ignore[arg-type]
        held.alive = bool(alive) or changed
        raise held

    def _known_dead(self, info: dict[str, Any]) -> bool:
        """Whether ``dead`` (the cluster's word: a Ray node that Ray found dead) says the holder is gone."""
        if self.dead is None:
            return False
        try:
            return bool(self.dead(info))
        except Exception as exc:  # noqa: BLE001 - an unanswered question is no news: the lease is watched as before
            _log.debug("could not tell whether the holder of %s is dead: %s", self.where, exc)
            return False

    def _body(self, **extra: Any) -> bytes:
        return json.dumps({**self._info, **extra}).encode()

    def _take(self, mode: PutMode) -> Lease:
        """Write a new lease of ours under ``mode``; :class:`LockHeld` (``alive``) when another's got there first."""
        try:
            return self._put_new(mode)
        except _Taken as taken:
            held = LockHeld(self.where, _holder(_parse(taken.got) or {}))  # type: ignore[arg-type]
            held.alive = True  # it was written just now
            raise held from None

    def _put_new(self, mode: PutMode) -> Lease:
        """Write a new lease of ours under ``mode``; :class:`_Taken` with what is there when the condition fails
        and what is there is not ours."""
        now = self.clock()
        token = secrets.token_hex(16)
        self._info = {**self.owner, "host": socket.gethostname(), "pid": os.getpid(), "machine": machine(), "token": token,
                      "beat": 0, "since": _since(now), "heartbeat": now, "ttl_s": self.ttl_s}  # fmt: skip
        try:
            version = self.store.put(self.key, self._body(), mode)
        except Conflict:
            got = self.store.get(self.key)
            info = _parse(got) or {}
            if got is None or info.get("token") != token or info.get("beat") != 0:
                raise _Taken(got) from None
            version = got.version  # ours after all: a put the client retried after its first try landed
        self.token, self.version, self._lost, self._seen = token, version, None, None
        self._confirmed = self.monotonic()
        return self

    def _ours_after_all(self, token: str, beat: int) -> str | None:
        """The version of the lease there when it is the one we meant to write (a put the client retried after its
        first try landed: the retry's condition fails on our own write); else None."""
        got = self.store.get(self.key)
        info = _parse(got) or {}
        ours = got is not None and info.get("token") == token and info.get("beat") == beat
        return got.version if ours else None

    def renew(self) -> None:
        """One put of a new heartbeat matched on the version we last wrote; :class:`LeaseLost` (also kept for
        :meth:`check`) when the lease there is another's or released. A store error propagates (and is retried
        by the heartbeat): the lease is not lost until another has taken it."""
        with self._mutex:
            if self._lost is not None:
                raise self._lost
            if self.token is None or self.version is None:
                raise RuntimeError(f"the lease {self.where} is not held")
            beat = int(self._info.get("beat", 0)) + 1
            self._info = {**self._info, "beat": beat, "heartbeat": self.clock()}
            try:
                self.version = self.store.put(self.key, self._body(), Match(self.version))
            except Conflict:
                version = self._ours_after_all(self.token, beat)
                if version is None:
                    there = _parse(self.store.get(self.key))
                    reason = (
                        f"now held by {_who(there)}" if there and not there.get("released") else "released by another"
                    )
                    self._lost = LeaseLost(self.where, reason, _holder(there) if there else None)
                    raise self._lost from None
                self.version = version
            self._confirmed = self.monotonic()

    def check(self) -> None:
        """Before a write under the lease: raise the :class:`LeaseLost` found, if any; when the last confirmation is
        older than half the ttl (a pause, a store that did not answer), renew first, so a lease taken over meanwhile
        is found before the write."""
        if self._lost is not None:
            raise self._lost
        if self.token is not None and self.monotonic() - self._confirmed > self.ttl_s / 2:
            self.renew()

    def start_heartbeat(self, every_s: float | None = None) -> Lease:
        """Renew every ``every_s`` seconds (default a third of the ttl) in a daemon thread until :meth:`release`. A
        lost lease stops it (and is raised by :meth:`check`); a store error is warned and tried again."""
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
            except Exception as exc:  # the store did not answer: nobody can take the lease without it either
                since = self.monotonic() - self._confirmed
                _log.warning("could not renew the lease %s for %.0f s (%s); trying again in %.0f s",
                             self.where, since, exc, every)  # fmt: skip

    def release(self) -> None:
        """Stop the heartbeat and mark the lease released (one put matched on our version); another's is left."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        with self._mutex:
            token, self.token = self.token, None
            if token is None or self._lost is not None or self.version is None:
                return
            body = json.dumps({"released": True, "token": token, "host": self._info.get("host"),
                               "pid": self._info.get("pid"), "at": _since(self.clock())}).encode()  # fmt: skip
            try:
                self.store.put(self.key, body, Match(self.version))
            except Conflict:
                _log.warning("the lease %s is no longer ours at release: left as it is", self.where)
            except OSError as exc:
                _log.warning(
                    "could not release the lease %s (%s): the next holder takes it once stale", self.where, exc
                )

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        """Release; then, when the body raised nothing, raise a :class:`LeaseLost` found meanwhile."""
        lost = self._lost
        self.release()
        if exc_type is None and lost is not None:
            raise lost


class _Taken(Exception):
    """A new lease's put found another's there (``got``: what one read then found)."""

    def __init__(self, got: Got | None):
        super().__init__("taken")
        self.got = got


def _ttl(info: dict[str, Any], default: float) -> float:
    try:
        return float(info.get("ttl_s", default))
    except (TypeError, ValueError):
        return default
