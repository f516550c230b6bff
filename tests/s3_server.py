"""A real S3 server for tests: moto's standalone server (as Ray's own storage tests use) on 127.0.0.1, reached
through pyarrow's S3 client with the endpoint in the URI (``s3://runs/lab?<query>``), as a researcher would name
MinIO or a cloud bucket. A test module starts its own, module-scoped::

    @pytest.fixture(scope="module")
    def s3_query(tmp_path_factory):
        with s3_server(tmp_path_factory.mktemp("moto")) as query:
            yield query
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

#: The credentials moto accepts (any), set in the environment while the server runs: pyarrow reads them there.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def s3_server(log_dir: Path, buckets: tuple[str, ...] = ("runs",)) -> Iterator[str]:
    """Start moto's S3 server on a free port of 127.0.0.1 (its log in ``log_dir``), create the empty ``buckets``,
    and yield the URI query that reaches it (``endpoint_override=127.0.0.1:PORT&scheme=http&region=us-east-1``);
    the server stops and the environment's credentials are restored on exit."""
    server = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
    if not Path(server).exists():
        pytest.fail("moto_server is missing: `pip install -e .[test]` installs moto[server]")
    port = _free_port()
    log = Path(log_dir) / "server.log"
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
        yield f"endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
