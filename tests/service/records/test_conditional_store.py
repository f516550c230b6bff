"""A bucket that ignores conditional writes is refused, and one that honours them works behind a slow hop (issue 47):
moto's S3 server (tests/s3_server.py) behind :func:`benchmarks.s3_proxy.s3_proxy`, a real HTTP proxy on 127.0.0.1
that drops ``If-None-Match``/``If-Match`` (an old S3-compatible store) or adds 30 ms to every request. No Ray."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import s3_server
from s3_server import fresh_s3_uri

from ablate.service.records.rundir import RunError, check_writable
from ablate.service.records.store import CREATE, CloudStore, Conflict, Match
from benchmarks.s3_proxy import s3_proxy
from benchmarks.s3_server import CREDENTIALS

s3_query = s3_server.s3_query  # the module's S3 server (a fixture)


def test_a_store_that_drops_conditions_is_refused_in_one_line_and_the_probe_is_removed(s3_query):
    with s3_proxy(s3_query, drop_conditions=True) as proxied:
        uri = fresh_s3_uri(proxied)
        with pytest.raises(RunError) as refused:
            check_writable(uri)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"storage {uri}: cannot keep a run's record safely"), message
    assert "If-None-Match" in message and "conditional writes" in message, message
    assert proxied.dropped["PUT"] >= 2, proxied.dropped  # the probe's two creates went out without their condition

    direct = CloudStore(uri.replace(proxied, s3_query))  # the same prefix, not through the proxy
    assert direct.list(dirs=False) == [] and not direct.exists(""), "the probe object was left behind"


def test_a_store_behind_a_slow_proxy_passes_the_check_and_keeps_conditional_puts(s3_query):
    with s3_proxy(s3_query, delay_s=0.03) as proxied:
        uri = fresh_s3_uri(proxied)
        check_writable(uri)
        store = CloudStore(uri)
        data = bytes(range(256)) * 4096  # 1 MiB: a body streamed both ways
        before, start = sum(proxied.counts.values()), time.monotonic()
        first = store.put("record.json", data, CREATE)
        with pytest.raises(Conflict):
            store.put("record.json", b"second", CREATE)
        with pytest.raises(Conflict):
            store.put("record.json", b"stale", Match(first + "0"))
        assert store.get("record.json") == (data, first)
        second = store.put("record.json", b"matched", Match(first))
        with pytest.raises(Conflict):  # the version read before is gone now
            store.put("record.json", b"late", Match(first))
        assert second != first and store.get("record.json") == (b"matched", second)
        elapsed, sent = time.monotonic() - start, sum(proxied.counts.values()) - before
    assert proxied.counts["PUT"] >= 5 + 3 and proxied.counts["GET"] >= 2, proxied.counts  # the check's probe: 3 PUTs
    assert not proxied.dropped and sent == 7 and elapsed >= 7 * 0.03, (proxied.counts, elapsed)


def test_the_proxy_relays_a_chunked_upload_and_keeps_the_connection(s3_query):
    """obstore sends its PUTs with a Content-Length; a client that streams one chunked goes through as well."""
    auth = {"Authorization": "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/s3/aws4_request, "
            "SignedHeaders=host, Signature=0", "x-amz-content-sha256": "UNSIGNED-PAYLOAD",
            "x-amz-date": "20260101T000000Z"}  # fmt: skip
    parts = [b"a" * 70_000, b"b" * 5, b"c" * 100_000]
    with s3_proxy(s3_query) as proxied:
        conn = http.client.HTTPConnection("127.0.0.1", proxied.port, timeout=30)
        try:
            conn.request("PUT", "/runs/chunked/blob", body=iter(parts), headers=auth, encode_chunked=True)
            assert conn.getresponse().read() == b""
            conn.request("HEAD", "/runs/chunked/blob", headers=auth)  # one connection: each reply framed
            head = conn.getresponse()
            assert (head.status, head.read(), head.getheader("Content-Length")) == (200, b"", "170005")
            conn.request("GET", "/runs/chunked/blob", headers=auth)
            got = conn.getresponse()
            assert (got.status, got.read()) == (200, b"".join(parts))
        finally:
            conn.close()
    assert proxied.chunked == {"PUT": 1} and proxied.counts == {"PUT": 1, "HEAD": 1, "GET": 1}


def test_ablate_run_on_a_store_that_drops_conditions_fails_in_one_line_before_ray(s3_query, tmp_path):
    env = {**os.environ, **CREDENTIALS, "RAY_TMPDIR": str(tmp_path / "raytmp")}  # where a Ray session would appear
    with s3_proxy(s3_query, drop_conditions=True) as proxied:
        storage = f"s3://runs/x?{proxied}"
        done = subprocess.run(
            [str(Path(sys.executable).with_name("ablate")), "run", "batch_vs_dim", "--scale", "smoke",
             "--storage", storage],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    last = done.stderr.rstrip().splitlines()[-1]
    assert done.returncode != 0 and "Traceback" not in done.stderr + done.stdout, done.stderr
    assert last.startswith(f"ablate: error: storage {storage}: cannot keep a run's record safely"), done.stderr
    assert "If-None-Match" in last, last
    assert not list((tmp_path / "raytmp").glob("ray/session_*")), "Ray started"
    assert not CloudStore(f"s3://runs/x?{s3_query}").exists(""), "the refused run left objects in the bucket"


def test_a_store_that_cannot_be_reached_is_one_line_in_every_command(tmp_path):
    """Nothing listens at the endpoint (a store down, a wrong port): after the client's retries (the URI's
    ``retry_timeout``, 1 s here) ``status``, ``export`` and ``run --resume`` each say so in one line naming the
    object, exit non-zero, and show no traceback. No Ray starts (the storage is checked first)."""
    import socket

    with socket.socket() as s:  # a port with nothing behind it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    storage = f"s3://runs/lab?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1&retry_timeout=1"
    run = storage.replace("/lab?", "/lab/batch_vs_dim-smoke?")
    ablate = str(Path(sys.executable).with_name("ablate"))
    env = {**os.environ, **CREDENTIALS, "RAY_TMPDIR": str(tmp_path / "ray")}
    for argv in (["status", run], ["export", run], ["run", "batch_vs_dim", "--scale", "smoke", "--storage", storage,
                                                    "--resume"]):  # fmt: skip
        proc = subprocess.run([ablate, *argv], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, (argv, proc.stderr[-3000:])
        assert lines and lines[-1].startswith("ablate: error: ") and f"127.0.0.1:{port}" in lines[-1], (argv, lines)
    assert not (tmp_path / "ray").exists()
