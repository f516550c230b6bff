"""The lease that keeps one writer on a store without locks (issue 47, "The record on object storage by
compare-and-swap"): :class:`ablate.service.records.store.lease.Lease` over a store in memory, a local folder and a real S3
server (moto's, on 127.0.0.1: tests/s3_server.py). Its safety rests on conditional puts alone: time is injected as
a fake monotonic clock (how long a waiter has watched) and a wall clock that only what is shown to people reads,
except where processes race, pause or heartbeat in real time. No Ray."""

from __future__ import annotations

import copy
import json
import logging
import multiprocessing
import os
import pickle
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest
import s3_server
from s3_server import fresh_s3_uri

import ablate.service.records.store.lease as lease_module
from ablate.service.records.driver_lock import busy_message
from ablate.service.records.store import CREATE, CloudStore, LocalStore, Match, MemoryStore, Store
from ablate.service.records.store.flock import LockHeld
from ablate.service.records.store.lease import Lease, LeaseLost, holder

KEY = "ablate_driver.lock"
TTL = 60.0
LOGGER = "ablate.service.records.store.lease"
ELSEWHERE = "another-boot-id/pid:[4026531836]"

s3_query = s3_server.s3_query  # the module's S3 server (a fixture)


@pytest.fixture(params=["memory", "local", "s3"])
def store(request, tmp_path) -> Store:
    """An empty run directory's store: in memory, a local folder, or a fresh prefix of a bucket on the S3 server."""
    if request.param == "memory":
        return MemoryStore(f"memory://lease-{uuid.uuid4().hex[:8]}")
    if request.param == "local":
        return LocalStore(tmp_path / "run")
    return CloudStore(fresh_s3_uri(request.getfixturevalue("s3_query")))


class Clock:
    """Seconds that move only when a test moves them."""

    def __init__(self, now: float = 1_700_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def ticks() -> Clock:
    """The monotonic clock of every lease in a test: how long a waiter has watched."""
    return Clock(1000.0)


def lease(store: Store, ticks: Clock, *, wall: float = 0.0, **kwargs) -> Lease:
    """A lease on ``KEY`` on the monotonic clock ``ticks``, with a wall clock ``wall`` seconds off this host's."""
    return Lease(store, KEY, **{"ttl_s": TTL, "monotonic": ticks, "clock": lambda: time.time() + wall, **kwargs})


def elsewhere(monkeypatch, take):
    """``take()`` as a process on another machine would do it: its lease names another pid namespace, so this
    process cannot check its pid and only watching decides."""
    with monkeypatch.context() as m:
        m.setattr(lease_module, "machine", lambda: ELSEWHERE)
        return take()


def stored(store: Store) -> dict:
    return json.loads(store.read_text(KEY))


def test_acquire_writes_who_holds_it_and_release_marks_it_released(store, ticks):
    a = lease(store, ticks).acquire()
    info = stored(store)
    assert info["host"] == socket.gethostname() and info["pid"] == os.getpid() and info["token"] == a.token
    assert info["beat"] == 0 and info["ttl_s"] == TTL and info["since"] and a.held
    assert holder(store, KEY) == {k: v for k, v in info.items() if k != "token"}
    a.release()
    assert stored(store)["released"] is True and holder(store, KEY) is None and not a.held
    a.release()  # twice is fine

    with lease(store, ticks) as b:  # a released lease is taken at once, without watching
        assert stored(store)["token"] == b.token and not stored(store).get("released")
    assert stored(store)["released"] is True


def test_a_live_lease_refuses_a_second_acquire_naming_its_holder(store, ticks):
    a = lease(store, ticks).acquire()
    ticks.now += 10 * TTL  # its holder is this very process: alive, however long nobody renewed
    with pytest.raises(LockHeld) as refused:
        lease(store, ticks).acquire()
    who = refused.value.holder
    assert refused.value.alive
    assert (who["pid"], who["host"], who["since"]) == (os.getpid(), socket.gethostname(), stored(store)["since"])
    assert store.join(KEY) in str(refused.value) and f"pid {os.getpid()}" in str(refused.value)
    assert busy_message("s3://runs/lab", who).startswith(f"s3://runs/lab is being written by ablate pid {os.getpid()}")
    assert stored(store)["token"] == a.token
    with pytest.raises(RuntimeError, match="already held"):
        a.acquire()


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_lease_of_a_dead_process_on_this_machine_is_taken_over_at_once(store, ticks, caplog):
    """A driver killed outright (kill -9) leaves its lease: on its own machine (the same pid namespace) the next
    driver sees its pid gone and takes the lease at once, as the kernel frees a dead holder's flock."""
    lease(store, ticks).acquire()
    store.write_text(KEY, json.dumps({**stored(store), "pid": _dead_pid()}))
    dead = stored(store)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        b = lease(store, ticks).acquire()
    assert stored(store)["token"] == b.token
    assert f"pid {dead['pid']}" in caplog.text and "no longer exists on this machine" in caplog.text


def test_a_lease_from_another_machine_is_taken_once_seen_unchanged_for_its_ttl(store, ticks, caplog, monkeypatch):
    a = elsewhere(monkeypatch, lease(store, ticks).acquire)
    waiter = lease(store, ticks)
    with pytest.raises(LockHeld) as first:
        waiter.acquire()  # first look: watching starts
    assert not first.value.alive
    ticks.now += TTL - 1
    a.renew()  # the holder is alive: the version moves, and the watch starts again
    with pytest.raises(LockHeld) as seen_renewed:
        waiter.acquire()
    assert seen_renewed.value.alive
    ticks.now += TTL - 1
    with pytest.raises(LockHeld):
        waiter.acquire()  # the same version, but not for a whole ttl yet
    ticks.now += 1
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        waiter.acquire()
    assert "taking over the stale lease" in caplog.text and "unchanged for 60.0 s" in caplog.text
    assert stored(store)["token"] == waiter.token != a.token


def test_a_lease_whose_holder_the_cluster_found_dead_is_taken_at_once(store, ticks, caplog, monkeypatch):
    """A trial's lease on another node: the holder writes its Ray node into the lease (``owner``); a waiter whose
    cluster lists that node as dead (``dead``) takes the lease at its first look, not after the ttl; a node not known
    dead, or a question that fails, leaves the lease watched as before."""
    a = elsewhere(monkeypatch, lease(store, ticks, owner={"ray_node": "n1"}).acquire)
    assert stored(store)["ray_node"] == "n1"

    def broken(info: dict) -> bool:
        raise RuntimeError("no cluster to ask")

    for dead in (lambda info: False, broken):
        with pytest.raises(LockHeld):
            lease(store, ticks, dead=dead).acquire()
    waiter = lease(store, ticks, dead=lambda info: info.get("ray_node") == "n1")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        waiter.acquire()
    assert "its node is dead" in caplog.text and stored(store)["token"] == waiter.token != a.token


@pytest.mark.parametrize("who_is_off", ["holder", "waiter"])
@pytest.mark.parametrize("off_s", [600.0, -600.0])
def test_a_clock_ten_minutes_off_neither_takes_a_live_lease_nor_keeps_a_dead_one(store, ticks, monkeypatch,
                                                                                 who_is_off, off_s):  # fmt: skip
    """Wall clocks are written for people and never compared: a host whose clock is 10 minutes off is judged by
    what the store shows (a version that moves, or one that does not) on the waiter's own monotonic clock."""
    holder_wall, waiter_wall = (off_s, 0.0) if who_is_off == "holder" else (0.0, off_s)
    a = elsewhere(monkeypatch, lambda: lease(store, ticks, wall=holder_wall).acquire())
    waiter = lease(store, ticks, wall=waiter_wall)
    for _ in range(5):  # alive: renewed every third of its ttl, for many ttls
        with pytest.raises(LockHeld):
            waiter.acquire()
        ticks.now += TTL / 3
        a.renew()
    with pytest.raises(LockHeld):
        waiter.acquire()
    ticks.now += TTL  # dead: not renewed any more
    waiter.acquire()
    with pytest.raises(LeaseLost, match="now held by pid"):
        a.renew()
    assert stored(store)["token"] == waiter.token


def test_a_holder_paused_past_its_ttl_learns_at_check_that_it_lost_before_it_writes(store, ticks, monkeypatch):
    a = elsewhere(monkeypatch, lease(store, ticks).acquire)
    ticks.now += TTL / 2 + 1  # a pause no heartbeat covered: check() renews first, and nobody took it
    a.check()
    assert stored(store)["beat"] == 1 and a.held
    successor = lease(store, ticks)
    with pytest.raises(LockHeld):
        successor.acquire()
    ticks.now += TTL  # paused again, long enough for the successor to take it
    successor.acquire()
    with pytest.raises(LeaseLost, match="now held by pid") as lost:
        a.check()
    assert lost.value.holder["pid"] == os.getpid() and not a.held
    with pytest.raises(LeaseLost):
        a.check()  # kept: the caller learns it wherever it looks
    a.release()  # leaves the successor's lease as it is
    assert stored(store)["token"] == successor.token
    lease(store, ticks).release()  # a lease never acquired releases nothing
    assert stored(store)["token"] == successor.token


def test_lease_lost_pickles_and_copies_whole():
    """A trial that loses its lease fails with this error, which Ray carries from the worker to the driver."""
    lost = LeaseLost("s3://runs/lab/trial_x/.trial.lock", "now held by pid 7 on host h", {"pid": 7})
    for back in (pickle.loads(pickle.dumps(lost)), copy.copy(lost)):
        assert str(back) == str(lost) and back.holder == {"pid": 7} and back.where == lost.where


def test_holder_reads_missing_held_released_and_dead(store, ticks, monkeypatch):
    assert holder(store, KEY) is None
    a = lease(store, ticks).acquire()
    assert holder(store, KEY)["pid"] == os.getpid()
    a.release()
    assert holder(store, KEY) is None
    b = elsewhere(monkeypatch, lease(store, ticks, ttl_s=5.0).acquire)
    assert holder(store, KEY)["pid"] == os.getpid()  # from elsewhere: shown while its heartbeat is recent
    assert holder(store, KEY, clock=lambda: time.time() + 6) is None  # its own ttl judges it, for the display only
    b.release()


@pytest.mark.parametrize("damage", [b"{not json", b"\xff\xfe", b"[1, 2]", b'{"token": 7}', b"null", b""])
def test_a_damaged_lease_is_taken_with_a_warning(store, ticks, caplog, damage):
    store.write_bytes(KEY, damage)
    assert holder(store, KEY) is None
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        a = lease(store, ticks).acquire()
    assert "is damaged" in caplog.text and stored(store)["token"] == a.token


class RetriedPuts(Store):
    """A store whose conditional puts land and then report a failed condition, as a put does whose reply was lost
    and that the client sent again (the retry's condition fails on the first try's own write)."""

    def __init__(self, inner: Store):
        self.inner, self.uri = inner, inner.uri

    def put(self, key, data, mode="overwrite"):
        version = self.inner.put(key, data, mode)
        if mode == CREATE or isinstance(mode, Match):
            raise self.conflict(key, mode)
        return version

    def join(self, *parts):
        return self.inner.join(*parts)

    def get(self, key):
        return self.inner.get(key)

    def delete(self, key):
        self.inner.delete(key)

    def delete_tree(self, prefix):
        self.inner.delete_tree(prefix)

    def list(self, prefix="", *, dirs):
        return self.inner.list(prefix, dirs=dirs)

    def exists(self, key):
        return self.inner.exists(key)


def test_a_put_retried_after_its_first_try_landed_is_known_as_ours(store, ticks):
    retried = RetriedPuts(store)
    a = lease(retried, ticks).acquire()
    a.renew()
    assert a.held and stored(store)["token"] == a.token and stored(store)["beat"] == 1
    with pytest.raises(LockHeld):
        lease(store, ticks).acquire()  # a second starter whose create really failed is refused


def test_the_heartbeat_keeps_a_lease_past_its_ttl_and_stops_on_release(store):
    a = Lease(store, KEY, ttl_s=0.5).acquire().start_heartbeat(0.03)
    time.sleep(0.8)
    a.check()
    assert stored(store)["beat"] >= 5
    beating = a._thread
    a.release()
    assert not beating.is_alive() and stored(store)["released"]
    with pytest.raises(ValueError, match="cannot keep"):
        Lease(store, KEY, ttl_s=0.3).start_heartbeat(0.3)


def test_the_heartbeat_reports_a_takeover_through_check_and_the_with_block(store, ticks, caplog, monkeypatch):
    a = elsewhere(monkeypatch, lease(store, ticks).acquire)
    b = lease(store, ticks)
    with pytest.raises(LockHeld):
        b.acquire()
    ticks.now += TTL
    b.acquire()
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        a.start_heartbeat(0.01)
        deadline = time.monotonic() + 10
        while a.held and time.monotonic() < deadline:
            time.sleep(0.01)
    assert not a.held and "lost the lease" in caplog.text
    with pytest.raises(LeaseLost, match="now held by pid"):
        a.__exit__(None, None, None)  # the end of a with block that raised nothing itself
    assert stored(store)["token"] == b.token  # a's release left b's lease


def test_a_store_that_does_not_answer_is_waited_for_and_the_lease_kept(store, ticks, caplog, monkeypatch):
    """Nobody can take a lease while the store does not answer: the heartbeat says so and tries again, and its
    first renewal after the store came back proves nobody did (long past the ttl)."""
    a = lease(store, ticks).acquire()

    def unreachable(*args, **kwargs):
        raise OSError("connection refused")

    monkeypatch.setattr(store, "put", unreachable)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        a.start_heartbeat(0.01)
        ticks.now += 3 * TTL
        time.sleep(0.1)
        assert a.held and "could not renew the lease" in caplog.text and "connection refused" in caplog.text
        with pytest.raises(OSError, match="connection refused"):
            a.check()  # a write now would fail as the renewal did
    monkeypatch.undo()
    a.check()
    assert a.held and stored(store)["token"] == a.token
    a.release()
    assert stored(store)["released"]


def _race_rounds(store: Store, rounds: int, barrier, results) -> None:
    """One racer: ``rounds`` times, wait for the other at ``barrier`` and try to take the lease ``race/<round>``."""
    for i in range(rounds):
        racer = Lease(store, f"race/{i}", ttl_s=TTL)
        barrier.wait(timeout=60)
        try:
            results.put((i, "won", racer.acquire().token))
        except LockHeld as exc:
            results.put((i, "held", exc.holder.get("pid")))
        except Exception as exc:  # reported, so that the test shows it
            results.put((i, "failed", repr(exc)))


def test_two_processes_racing_for_a_lease_100_times_one_wins_each_time(store):
    """Two processes released together by a barrier, 100 times, with no settle wait: the store's create-only put
    lets exactly one of them hold the lease each time, and the other's refusal names a holder. (In memory: two
    threads, as a memory store lives in one process.)"""
    rounds = 100
    if isinstance(store, MemoryStore):
        import queue

        barrier, results = threading.Barrier(2), queue.Queue()
        racers = [threading.Thread(target=_race_rounds, args=(store, rounds, barrier, results)) for _ in "ab"]
    else:
        ctx = multiprocessing.get_context("spawn")  # no fork of a process whose S3 client runs threads
        barrier, results = ctx.Barrier(2), ctx.Queue()
        racers = [ctx.Process(target=_race_rounds, args=(store, rounds, barrier, results)) for _ in "ab"]
    for r in racers:
        r.start()
    outcomes = [results.get(timeout=120) for _ in range(2 * rounds)]
    for r in racers:
        r.join(30)
    by_round: dict[int, list] = {}
    for i, kind, what in outcomes:
        by_round.setdefault(i, []).append((kind, what))
    for i in range(rounds):
        kinds = sorted(kind for kind, _ in by_round[i])
        assert kinds == ["held", "won"], (i, by_round[i])
        won = next(what for kind, what in by_round[i] if kind == "won")
        assert json.loads(store.read_text(f"race/{i}"))["token"] == won


PAUSED_HOLDER = textwrap.dedent(
    """
    import sys, time
    from ablate.service.records.store.lease import Lease, LeaseLost
    from ablate.service.records.store import Conflict, Match, open_store
    store = open_store(sys.argv[1])
    lease = Lease(store, "writer.lock", ttl_s=float(sys.argv[2])).acquire().start_heartbeat()
    version = store.put("log", b"holder 0")
    print("holding", flush=True)
    i = 0
    while True:
        i += 1
        try:
            lease.check()
            version = store.put("log", f"holder {i}".encode(), Match(version))  # fenced on what it last wrote
        except LeaseLost as exc:
            print(f"stopped: {exc}", flush=True)
            sys.exit(3)
        except Conflict as exc:
            print(f"fenced: {exc}", flush=True)
            sys.exit(4)
        time.sleep(0.02)
    """
)


@pytest.mark.parametrize("store", ["s3"], indirect=True)
def test_a_holder_stopped_past_its_ttl_and_continued_never_overwrites_its_successor(store, monkeypatch):
    """kill -STOP a process writing under a lease (every write after check(), matched on the version it last
    wrote) past the lease's ttl; a successor takes the lease and writes; kill -CONT: the old holder's next write
    fails (its renewal, or the write's own condition) and it stops in one line; the successor's write stands.
    (On a bucket: on disk a run's locks are flocks, and a process stopped inside a matched write holds its folder's
    flock, as a stopped holder of any flock blocks the next one.)"""
    ttl = 2.0
    uri = store.uri if isinstance(store, CloudStore) else str(store.root)
    monkeypatch.setattr(lease_module, "machine", lambda: ELSEWHERE)  # as from another machine: watching decides
    proc = subprocess.Popen([sys.executable, "-c", PAUSED_HOLDER, uri, str(ttl)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "holding"
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGSTOP)
        successor = Lease(store, "writer.lock", ttl_s=ttl)
        deadline = time.monotonic() + 30
        while True:
            try:
                successor.acquire()
                break
            except LockHeld as held:
                assert not held.alive or time.monotonic() < deadline, held  # its version stopped moving
                time.sleep(0.1)
        got = store.get("log")
        mine = store.put("log", b"successor", Match(got.version))
        os.kill(proc.pid, signal.SIGCONT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (3, 4), out
    assert ("stopped: lost the lease" in out) or ("fenced:" in out and "not written" in out), out
    assert store.get("log") == (b"successor", mine)
    successor.release()
