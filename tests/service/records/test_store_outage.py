"""A store that stops answering mid-run is waited for (issue 47: "the store unreachable for 90 s mid-run (the server
paused with SIGSTOP, then continued): the run waits with a line saying so and goes on, nothing lost, since no one
took its lease"). The store is moto's S3 server on 127.0.0.1 (tests/s3_server.py), paused with SIGSTOP and continued
with SIGCONT: connections are still accepted by the kernel, nothing answers, and the requests sent meanwhile are
served once it goes on (a PUT whose client gave up lands then). The URIs set short ``request_timeout`` and
``retry_timeout`` so that a pause of seconds outlasts obstore's own retries and ablate's wait (``outage_s``) is what
keeps the requests going (ablate/service/records/store/cloud.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import select
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import s3_server
from conftest import smoke_cmd
from s3_server import fresh_s3_uri
from test_object_storage import _released, _reports

import benchmarks.s3_proxy as s3_proxy_module
from ablate.service.records.rundir import DRIVER_LOCK, resolve_run_dir
from ablate.service.records.store import CREATE, CloudStore, Conflict, Match, StoreError
from ablate.service.records.store.cloud import client_config, outage_of
from benchmarks.s3_proxy import s3_proxy
from benchmarks.s3_server import CREDENTIALS

s3_query = s3_server.s3_query  # the module's S3 server (a fixture), paused by the tests
_CLOUD_LOG = "ablate.service.records.store.cloud"
#: obstore gives a silent request up after 1 s and retries for 2 s: a pause of 6 s outlasts both.
_SHORT = "request_timeout=1&retry_timeout=2"


@contextlib.contextmanager
def paused(query, seconds: float | None = None):
    """The server stopped (SIGSTOP) for the block, or for ``seconds`` from its start (then continued in a timer);
    continued whatever happens. Yields the monotonic time it was stopped."""
    os.kill(query.pid, signal.SIGSTOP)
    timer = threading.Timer(seconds, os.kill, (query.pid, signal.SIGCONT)) if seconds is not None else None
    try:
        if timer is not None:
            timer.start()
        yield time.monotonic()
    finally:
        if timer is not None:
            timer.cancel()
        os.kill(query.pid, signal.SIGCONT)


def _lines(caplog, start: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == _CLOUD_LOG and r.getMessage().startswith(start)]


def test_the_options_of_the_wait_are_read_and_checked():
    uri = "s3://runs/lab?region=us-east-1&outage_s=90&request_timeout=2.5&retry_timeout=3"
    _config, client, retry = client_config(uri)
    assert outage_of(uri) == 90 and client["timeout"].total_seconds() == 2.5 and retry["retry_timeout"].seconds == 3
    assert outage_of("gs://b/lab") == 900 and outage_of("gs://b/lab?outage_s=0") == 0
    for bad in ("outage_s=-1", "outage_s=soon", "request_timeout=0", "outage_s=86401"):
        with pytest.raises(ValueError, match=bad.split("=")[0]):
            CloudStore(f"s3://runs/lab?{bad}")


def test_a_get_and_puts_sent_while_the_store_is_paused_finish_once_it_goes_on(s3_query, caplog):
    """Paused 6 s (three times the URI's retry_timeout): a GET, a create-only PUT and an overwrite sent meanwhile
    from three threads all finish after it goes on, each with the right data; one warning for the wait, one line
    when the store answers again."""
    caplog.set_level(logging.INFO, logger=_CLOUD_LOG)
    store = CloudStore(f"{fresh_s3_uri(s3_query)}&{_SHORT}")
    first = store.put("a", b"before")
    with ThreadPoolExecutor(3) as pool, paused(s3_query, 6.0) as stopped:
        created = pool.submit(store.put, "b", b"during", CREATE)
        replaced = pool.submit(store.put, "a", b"after")
        got = store.get("a")  # in the main thread: handed to a helper thread, waited for in slices
        results = created.result(), replaced.result()
        took = time.monotonic() - stopped
    assert took >= 5.5, took  # nothing answered before SIGCONT
    assert got in ((b"before", first), (b"after", results[1])), got
    assert store.get("b") == (b"during", results[0]) and store.get("a") == (b"after", results[1])
    warned = _lines(caplog, f"{store._base}/")
    assert len(warned) == 1 and "no answer from http://127.0.0.1:" in warned[0], caplog.text
    assert "; waiting up to 900 s for the store (retries every ~10 s)" in warned[0], warned
    assert len(_lines(caplog, f"{store.uri}: http://127.0.0.1:")) == 1, caplog.text  # "... answers again after N s"
    with pytest.raises(Conflict):  # the create is there once: a second one is refused
        store.put("b", b"again", CREATE)


def _drop_first_put(monkeypatch, then=None):
    """Make :func:`benchmarks.s3_proxy.s3_proxy` forward the first PUT to the server and then close the client's
    connection without its answer (the write landed, its answer was lost), after calling ``then()``."""
    make, dropped = s3_proxy_module._handler, []

    def handler(*args):
        class Dropping(make(*args)):
            def _relay_response(self, response):
                if self.command == "PUT" and not dropped:
                    dropped.append(self.path)
                    response.read()
                    if then is not None:
                        then()
                    self.close_connection = True
                    return
                super()._relay_response(response)

        return Dropping

    monkeypatch.setattr(s3_proxy_module, "_handler", handler)
    return dropped


@pytest.mark.parametrize("retry", ["retry_timeout=0", "retry_timeout=60"], ids=["ablate-retries", "obstore-retries"])
def test_a_conditional_put_whose_answer_was_lost_is_known_as_ours(s3_query, monkeypatch, retry):
    """The first try of a create-only put lands but its answer is lost; its retry (ablate's, when obstore's are off;
    obstore's own otherwise) fails its condition on that very write: the object holds the bytes sent, so the put
    succeeded. The same for a put matched on a version. A create-only put that was sure of itself still conflicts."""
    dropped = _drop_first_put(monkeypatch)
    with s3_proxy(s3_query) as proxied:
        store = CloudStore(f"{fresh_s3_uri(proxied)}&{retry}")
        version = store.put("entry", b"ours", CREATE)
        assert dropped and store.get("entry") == (b"ours", version) and proxied.counts["PUT"] == 2, proxied.counts
        with pytest.raises(Conflict):  # no try was lost: the condition failing is a conflict, same bytes or not
            store.put("entry", b"ours", CREATE)
        dropped.clear()
        matched = store.put("entry", b"ours, renewed", Match(version))
        assert dropped and store.get("entry") == (b"ours, renewed", matched) and matched != version


def test_a_lost_answer_followed_by_another_s_write_is_still_a_conflict(s3_query, monkeypatch):
    """The first try lands, its answer is lost, and another writer replaces the object before the retry: the object
    no longer holds the bytes sent, so the retry's failed condition is a conflict."""
    holder: list[CloudStore] = []
    dropped = _drop_first_put(monkeypatch, then=lambda: holder[0].put("entry", b"another's"))
    with s3_proxy(s3_query) as proxied:
        store = CloudStore(f"{fresh_s3_uri(proxied)}&retry_timeout=0")
        holder.append(CloudStore(store.uri.replace(proxied, s3_query)))  # straight to the server
        with pytest.raises(Conflict):
            store.put("entry", b"ours", CREATE)
        assert dropped and store.get("entry").data == b"another's"


def test_a_store_silent_past_outage_s_fails_in_one_line_and_one_never_reached_does_not_wait(s3_query, caplog):
    caplog.set_level(logging.INFO, logger=_CLOUD_LOG)
    store = CloudStore(f"{fresh_s3_uri(s3_query)}&{_SHORT}&outage_s=3")
    store.put("a", b"1")
    with paused(s3_query) as stopped:
        with pytest.raises(StoreError) as silent:
            store.get("a")
        took = time.monotonic() - stopped
    message = str(silent.value)
    assert message.startswith(f"{store.join('a')}: no answer from http://127.0.0.1:") and "\n" not in message
    waited = re.search(r"; waited (\d+) s for the store \(outage_s\)$", message)
    assert waited and 3 <= int(waited[1]) <= took < 3 + 3 + 2, (message, took)  # the wait, then at most one try
    assert store.get("a").data == b"1" and len(_lines(caplog, f"{store.uri}: http://")) == 1, caplog.text

    with socket.socket() as s:  # nothing listens here, and nothing ever answered: not waited for
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nowhere = CloudStore(
        f"s3://runs/lab?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1&retry_timeout=1"
    )
    caplog.clear()
    start = time.monotonic()
    with pytest.raises(StoreError, match=f"no answer from http://127.0.0.1:{port} in"):
        nowhere.get("a")
    assert time.monotonic() - start < 10 and not _lines(caplog, "s3://"), caplog.text


_WAITER = """
import signal, sys
from ablate.service.records.store import CloudStore
store = CloudStore(sys.argv[1])
store.put("a", b"1")
# Ctrl-C as an interactive Python takes it: a shell that runs the suite in the background (CI) hands its children
# SIGINT ignored, and Python then leaves it ignored, so the child would not hear it
signal.signal(signal.SIGINT, signal.default_int_handler)
if sys.argv[2] == "SIGTERM":  # as `ablate run` handles it: an exception in the main thread
    def stop(sig, frame):
        raise SystemExit(143)
    signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
sys.stdin.readline()
try:
    store.get("a")
    print("answered", flush=True)
except BaseException as exc:  # the moment the wait ends, before the interpreter's own teardown
    print(type(exc).__name__, flush=True)
    raise
"""


@pytest.mark.parametrize("sig, timeout", [("SIGINT", 30), ("SIGTERM", 1)], ids=["in-a-request", "between-tries"])
def test_a_signal_stops_a_process_waiting_for_the_store(s3_query, tmp_path, sig, timeout):
    """A process whose main thread waits for a paused store stops at once on Ctrl-C or SIGTERM: while obstore holds
    a request that gets no answer (a 30 s request_timeout), and between ablate's tries (a 1 s one)."""
    uri = f"{fresh_s3_uri(s3_query)}&request_timeout={timeout}&retry_timeout=0"
    env = {**os.environ, **CREDENTIALS, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}  # the repository
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_WAITER), uri, sig], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        assert proc.stdout.readline() == "ready\n", proc.stderr.read()
        with paused(s3_query):
            proc.stdin.write("go\n")
            proc.stdin.flush()
            time.sleep(3)  # in a request (30 s) or in ablate's wait after a few tries (1 s)
            start = time.monotonic()
            proc.send_signal(getattr(signal, sig))
            ready, _, _ = select.select([proc.stdout], [], [], 20)
            said = proc.stdout.readline() if ready else ""
            took = time.monotonic() - start
            code = proc.wait(timeout=60)  # the interpreter's teardown after it, not part of the promise
        out, err = proc.communicate()
    finally:
        proc.kill()
    stopped_by = "KeyboardInterrupt" if sig == "SIGINT" else "SystemExit"
    assert said == f"{stopped_by}\n" and "answered" not in out and took < 2, (said, took, err[-2000:])
    if sig == "SIGINT":
        assert code == -signal.SIGINT and "KeyboardInterrupt" in err, err[-2000:]  # as Python ends on one
    else:
        assert code == 143 and "waiting up to 900 s for the store" in err, err[-2000:]


#: How long the end-to-end run's store is paused: ten times the URI's request and retry timeouts, and as long as the
#: leases' heartbeat period (a third of their 60 s ttl), so a renewal falls in it and waits too. Issue 47 names 90 s
#: (past the ttl): that passed as well (142 s for the test, against 65 s for this one).
RUN_PAUSE_S = 20.0


@pytest.mark.ray
def test_a_run_whose_store_is_paused_mid_run_waits_and_goes_on(s3_query, tmp_path):
    """`ablate run batch_vs_dim --scale smoke --storage s3://…` (a subprocess, its own Ray), the store paused for
    :data:`RUN_PAUSE_S` while the first trial reports (far past the URI's 2 s request and retry timeouts): the run
    says it waits, goes on when the store answers again, and exits 0 with every report in its trial's log once; no
    lease was lost or taken over, and the driver's is released."""
    storage = f"s3://runs/lab?{s3_query}&request_timeout=2&retry_timeout=2"
    flags = ["--name", "paused", "--no-report", "--no-dashboard", "--max-concurrent", "1", "--set", "max_steps=200"]
    flags += ["report_every=10", "--results-every", "0"]
    uri = resolve_run_dir(storage, "paused")
    log = tmp_path / "run.log"
    with log.open("w") as out:
        proc = subprocess.Popen(smoke_cmd(storage, *flags), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and proc.poll() is None and sum(map(len, _reports(uri).values())) < 5:
                time.sleep(0.2)
            assert proc.poll() is None, log.read_text()[-3000:]
            with paused(s3_query) as stopped:
                while time.monotonic() - stopped < RUN_PAUSE_S and proc.poll() is None:
                    time.sleep(0.5)
                assert proc.poll() is None, log.read_text()[-3000:]  # it waited instead of failing
            code = proc.wait(timeout=180)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    text = log.read_text()
    assert code == 0, text[-4000:]
    assert "; waiting up to 900 s for the store (retries every ~10 s)" in text, text[-4000:]
    for sign in ("could not renew", "lost the lease", "taking over", "Traceback"):  # waited: nothing failed
        assert sign not in text, text[-4000:]
    after = _reports(uri)
    assert len(after) == 4 and all(steps == list(range(10, 201, 10)) for steps in after.values()), after
    assert _released(uri, DRIVER_LOCK)
