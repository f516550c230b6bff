"""A real S3 server on 127.0.0.1: moto's standalone server (as Ray's own storage tests use), reached through
obstore's S3 client with the endpoint in the URI (``s3://runs/lab?<query>``), as a researcher would name MinIO or a
cloud bucket (its buckets are created with pyarrow's S3 client). The object-storage tests start one per module
(tests/s3_server.py turns a missing moto into a test failure); ``python -m benchmarks --only object_store`` counts
the requests in its log (:func:`request_counts`)::

    with s3_server(log_dir) as query:
        store = CloudStore(f"s3://runs/lab?{query}")
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

#: The credentials moto accepts (any), set in the environment while the server runs: obstore and pyarrow read them
#: there.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
#: The server's log in ``log_dir``: werkzeug's line per request (``"PUT /runs/lab/… HTTP/1.1" 200 -``) among others.
LOG_FILE = "server.log"
_REQUEST = re.compile(r'"(GET|PUT|HEAD|POST|DELETE|PATCH|OPTIONS) \S+ HTTP/[\d.]+" \d{3}')


class ServerQuery(str):
    """The URI query that reaches the server (a ``str``), with its process id ``pid`` (a test pauses the server
    with SIGSTOP and SIGCONT: a store that stops answering)."""

    pid: int

    def __new__(cls, query: str, pid: int) -> ServerQuery:
        self = super().__new__(cls, query)
        self.pid = pid
        return self


def moto_server() -> str:
    """The path of moto's server program; RuntimeError when it is not installed."""
    server = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
    if not Path(server).exists():
        raise RuntimeError("moto_server is missing: `pip install -e .[test]` installs moto[server]")
    return server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def s3_server(log_dir: str | os.PathLike, buckets: tuple[str, ...] = ("runs",)) -> Iterator[str]:
    """Start moto's S3 server on a free port of 127.0.0.1 (its log ``log_dir/server.log``), create the empty
    ``buckets``, and yield the URI query that reaches it (``endpoint_override=127.0.0.1:PORT&scheme=http&region=
    us-east-1``, a :class:`ServerQuery` with the server's pid); the server stops (continued first, if paused) and
    the environment's credentials are restored on exit. RuntimeError when moto's server is not installed."""
    server = moto_server()
    port = _free_port()
    log = Path(log_dir) / LOG_FILE
    with open(log, "w") as out:
        proc = subprocess.Popen([server, "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT)
    saved = {k: os.environ.get(k) for k in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    try:
        import pyarrow.fs as pafs

        deadline = time.time() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, log.read_text()
                time.sleep(0.1)
        admin = pafs.S3FileSystem(
            endpoint_override=f"127.0.0.1:{port}", scheme="http", region="us-east-1", allow_bucket_creation=True
        )
        for bucket in buckets:
            admin.create_dir(bucket)
        yield ServerQuery(f"endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1", proc.pid)
    finally:
        proc.send_signal(signal.SIGCONT)  # a stopped process does not act on SIGTERM
        proc.terminate()
        proc.wait(timeout=30)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def request_counts(log_dir: str | os.PathLike, settle_s: float = 0.02) -> collections.Counter[str]:
    """HTTP method → how many requests the server started in ``log_dir`` has logged so far. Read until two reads
    ``settle_s`` apart agree: werkzeug logs a request as it answers it, which the client may see first."""
    log, last = Path(log_dir) / LOG_FILE, None
    while True:
        counts = collections.Counter(m.group(1) for m in _REQUEST.finditer(log.read_text(errors="replace")))
        if counts == last:
            return counts
        last = counts
        time.sleep(settle_s)
