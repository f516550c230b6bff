"""The lease that keeps one driver on a run directory without a lock (issue "The run record on object storage"):
:class:`ablate.service.records.lease.Lease` over a :class:`LocalStore` in a temporary folder and an
:class:`ArrowStore` on a real S3 server (moto's, on 127.0.0.1: tests/s3_server.py). Timing is injected: a fake
clock and no settle wait, except where threads race or heartbeat in real time. No Ray."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import socket
import threading
import time

import pytest
import s3_server
from s3_server import fresh_s3_uri

from ablate.service.records.driver_lock import busy_message
from ablate.service.records.lease import Lease, LeaseLost, holder
from ablate.service.records.pidlock import LockHeld
from ablate.service.records.store import ArrowStore, LocalStore, Store

KEY = "ablate_driver.lease"
TTL = 60.0
LOGGER = "ablate.service.records.lease"

s3_query = s3_server.s3_query  # the module's S3 server (a fixture)


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path) -> Store:
    """An empty run directory's store: a local folder, or a fresh prefix of a bucket on the S3 server."""
    if request.param == "local":
        return LocalStore(tmp_path / "run")
    return ArrowStore(fresh_s3_uri(request.getfixturevalue("s3_query")))


class FakeClock:
    """Epoch seconds that move only when a test moves them."""

    def __init__(self, now: float = 1_700_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def lease(store: Store, clock, **kwargs) -> Lease:
    """A lease on ``KEY`` that waits no settle time, on ``clock``."""
    return Lease(store, KEY, **{"ttl_s": TTL, "settle_s": 0.0, "clock": clock, **kwargs})


def stored(store: Store) -> dict:
    return json.loads(store.read_text(KEY))


def test_acquire_writes_who_holds_it_and_release_removes_it(store, clock):
    a = lease(store, clock).acquire()
    info = stored(store)
    assert info["host"] == socket.gethostname() and info["pid"] == os.getpid() and info["token"] == a.token
    assert info["taken"] == info["heartbeat"] == clock.now and info["ttl_s"] == TTL and info["since"]
    assert a.held and holder(store, KEY, clock=clock) == {k: v for k, v in info.items() if k != "token"}
    a.release()
    assert store.read_text(KEY) is None and holder(store, KEY, clock=clock) is None and not a.held
    a.release()  # twice is fine

    with lease(store, clock) as b:  # and again, as a context manager
        assert stored(store)["token"] == b.token
    assert store.read_text(KEY) is None


def test_a_fresh_lease_refuses_a_second_acquire_naming_its_holder(store, clock):
    a = lease(store, clock).acquire()
    clock.now += TTL  # still fresh: a heartbeat is good for ttl seconds
    with pytest.raises(LockHeld) as refused:
        lease(store, clock).acquire()
    who = refused.value.holder
    assert (who["pid"], who["host"], who["since"]) == (os.getpid(), socket.gethostname(), stored(store)["since"])
    assert store.join(KEY) in str(refused.value) and f"pid {os.getpid()}" in str(refused.value)
    assert busy_message("s3://runs/lab", who).startswith(f"s3://runs/lab is being written by ablate pid {os.getpid()}")
    assert stored(store)["token"] == a.token
    with pytest.raises(RuntimeError, match="already held"):
        a.acquire()


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = multiprocessing.get_context("fork").Process(target=int)
    proc.start()
    proc.join()
    return proc.pid


@pytest.mark.parametrize("where", ["this machine", "another machine"])
def test_a_fresh_lease_of_a_dead_process_is_taken_over_at_once_only_on_its_machine(store, clock, caplog, where):
    """A driver killed outright (kill -9) leaves its lease fresh: on its own machine (the same pid namespace) the
    next driver sees its pid gone and takes the lease at once, as the kernel frees a dead holder's flock;
    from another machine it cannot tell, and the ttl decides."""
    lease(store, clock).acquire()
    dead = {**stored(store), "pid": _dead_pid()}
    if where == "another machine":
        dead["machine"] = "another-boot-id/pid:[1]"
    store.write_text(KEY, json.dumps(dead))
    if where == "another machine":
        with pytest.raises(LockHeld):
            lease(store, clock).acquire()
        return
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        b = lease(store, clock).acquire()
    assert stored(store)["token"] == b.token
    assert f"pid {dead['pid']}" in caplog.text and "no longer exists on this machine" in caplog.text


def test_a_stale_lease_is_taken_over_with_a_warning_naming_its_holder(store, clock, caplog):
    a = lease(store, clock).acquire()
    old = stored(store)
    clock.now += TTL + 1
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        b = lease(store, clock).acquire()
    assert "taking over the stale lease" in caplog.text and f"pid {os.getpid()}" in caplog.text
    assert old["since"] in caplog.text and "61.0 s ago" in caplog.text
    assert stored(store)["token"] == b.token != a.token


def test_renew_after_a_takeover_raises_lease_lost_and_release_leaves_the_new_lease(store, clock, caplog):
    a = lease(store, clock).acquire()
    clock.now += TTL + 1
    b = lease(store, clock).acquire()
    with pytest.raises(LeaseLost, match="now held by pid") as lost:
        a.renew()
    assert lost.value.holder["taken"] == clock.now and not a.held
    with pytest.raises(LeaseLost):
        a.check()  # kept: the caller learns it wherever it looks
    a.release()
    assert stored(store)["token"] == b.token
    lease(store, clock).release()  # a lease never acquired releases nothing
    assert stored(store)["token"] == b.token and holder(store, KEY, clock=clock)["taken"] == clock.now


def test_renew_moves_the_heartbeat_and_a_lapsed_one_is_lost(store, clock):
    a = lease(store, clock).acquire()
    taken = clock.now
    clock.now += TTL - 1
    a.renew()
    assert stored(store)["heartbeat"] == clock.now and stored(store)["taken"] == taken
    clock.now += TTL  # fresh only thanks to the renewal
    assert holder(store, KEY, clock=clock) is not None
    clock.now += 1  # not renewed within the ttl: anyone may be taking it over now, even if nobody did
    with pytest.raises(LeaseLost, match="not renewed for 61.0 s"):
        a.renew()
    assert stored(store)["heartbeat"] == taken + TTL - 1  # nothing written


def test_holder_reads_fresh_stale_and_missing(store, clock):
    assert holder(store, KEY, clock=clock) is None
    a = lease(store, clock, ttl_s=5.0).acquire()
    assert holder(store, KEY, clock=clock)["pid"] == os.getpid()
    clock.now += 5.5  # the lease's own ttl judges it, not the reader's default
    assert holder(store, KEY, clock=clock, ttl_s=TTL) is None
    a.release()
    assert holder(store, KEY, clock=clock) is None


@pytest.mark.parametrize("damage", [b"{not json", b"\xff\xfe", b"[1, 2]", b'{"token": "x"}', b'{"token": 7, '
                                    b'"heartbeat": 1}', b'{"token": "x", "heartbeat": "soon"}', b'{"token": "x", "heartbeat": Infinity}', b""])  # fmt: skip
def test_a_damaged_lease_counts_as_stale_with_a_warning(store, clock, caplog, damage):
    store.write_bytes(KEY, damage)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert holder(store, KEY, clock=clock) is None
        assert "is damaged" in caplog.text and "counts as stale" in caplog.text
        caplog.clear()
        a = lease(store, clock).acquire()
    assert "is damaged" in caplog.text and stored(store)["token"] == a.token


def test_a_read_torn_by_a_rewrite_is_read_again(store, clock, caplog, monkeypatch):
    """pyarrow reads an S3 object as a HEAD and a GET of the HEAD's length: a read overlapping a renewal that
    changed the object's length gets a cut (or zero-padded) copy. Read again, it is whole: no warning, still held."""
    a = lease(store, clock).acquire()
    whole, read = store.read_bytes(KEY), store.read_bytes
    torn = iter([whole[:-3], whole + b"\x00"])
    monkeypatch.setattr(store, "read_bytes", lambda key: next(torn, None) or read(key))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert holder(store, KEY, clock=clock)["pid"] == os.getpid()
    assert "damaged" not in caplog.text and a.held


def test_the_heartbeat_keeps_a_lease_fresh_past_its_ttl_and_stops_on_release(store):
    a = Lease(store, KEY, ttl_s=0.5, settle_s=0.0).acquire().start_heartbeat(0.03)
    taken = stored(store)["taken"]
    time.sleep(0.8)
    a.check()
    assert holder(store, KEY) is not None and stored(store)["heartbeat"] > taken + 0.5
    beating = a._thread
    a.release()
    assert not beating.is_alive() and store.read_text(KEY) is None
    Lease(store, KEY, ttl_s=0.3, settle_s=0.0).acquire().release()
    with pytest.raises(ValueError, match="cannot keep"):
        Lease(store, KEY, ttl_s=0.3).start_heartbeat(0.3)


def test_the_heartbeat_reports_a_takeover_through_check_and_the_with_block(store, clock, caplog):
    with pytest.raises(LeaseLost, match="now held by pid"):
        with lease(store, clock) as a:
            clock.now += TTL + 1
            b = lease(store, clock).acquire()
            with caplog.at_level(logging.ERROR, logger=LOGGER):
                a.start_heartbeat(0.01)
                deadline = time.monotonic() + 10
                while a.held and time.monotonic() < deadline:
                    time.sleep(0.01)
            assert not a.held and "lost the lease" in caplog.text
    assert stored(store)["token"] == b.token  # a's release left b's lease


def _racer(store: Store, settle_s: float, barrier, report) -> None:
    """Wait at ``barrier`` for the other racer, then acquire; report what came of it."""
    racer = Lease(store, KEY, ttl_s=TTL, settle_s=settle_s)
    barrier.wait()
    try:
        report(("won", racer.acquire().token))
    except LockHeld as exc:
        report(("held", exc.holder))
    except Exception as exc:  # reported, so that the test shows it
        report(("failed", repr(exc)))


def race(store: Store, settle_s: float) -> list[tuple]:
    """Two racers acquire the lease at once, released together by a barrier; what each got. On S3 two threads
    (two uploads); on a local disk two processes, as two drivers would be: the local store's temporary file is
    named by process, so two threads of one process must not write one file at once."""
    if isinstance(store, LocalStore):
        ctx = multiprocessing.get_context("fork")
        barrier, queue = ctx.Barrier(2), ctx.Queue()
        racers = [ctx.Process(target=_racer, args=(store, settle_s, barrier, queue.put)) for _ in "ab"]
    else:
        barrier, got = threading.Barrier(2), []
        racers = [threading.Thread(target=_racer, args=(store, settle_s, barrier, got.append)) for _ in "ab"]
    for r in racers:
        r.start()
    for r in racers:
        r.join(30)
    return [queue.get(timeout=5) for _ in racers] if isinstance(store, LocalStore) else got


def test_the_heartbeat_retries_a_failing_store_until_the_lease_lapses(store, clock, caplog, monkeypatch):
    a = lease(store, clock).acquire()

    def unreachable(key):
        raise OSError("connection refused")

    monkeypatch.setattr(store, "read_bytes", unreachable)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        a.start_heartbeat(0.01)
        time.sleep(0.1)
        assert a.held and "could not renew the lease" in caplog.text and "connection refused" in caplog.text
        clock.now += TTL + 1
        deadline = time.monotonic() + 10
        while a.held and time.monotonic() < deadline:
            time.sleep(0.01)
    with pytest.raises(LeaseLost, match="could not renew it for 61.0 s .* connection refused"):
        a.check()
    monkeypatch.undo()
    a.release()  # nobody took it: still ours, so it goes
    assert store.read_text(KEY) is None


def test_two_racing_acquirers_exactly_one_wins(store):
    for _ in range(3):
        outcome = race(store, settle_s=0.2)
        won = [token for kind, token in outcome if kind == "won"]
        refused = [who for kind, who in outcome if kind == "held"]
        assert len(won) == len(refused) == 1, outcome
        there = stored(store)
        assert there["token"] == won[0]
        assert (refused[0]["pid"], refused[0]["taken"]) == (there["pid"], there["taken"])  # it names the winner
        store.delete(KEY)


def test_bad_timing_is_refused():
    for bad in ({"ttl_s": 0}, {"ttl_s": -1}, {"settle_s": -0.1}):
        with pytest.raises(ValueError, match="ttl_s > 0"):
            Lease(LocalStore("/nonexistent"), KEY, **bad)
