"""A real S3 server for tests: :func:`benchmarks.s3_server.s3_server` (moto's standalone server on 127.0.0.1,
reached through pyarrow's S3 client with the endpoint in the URI), a missing moto failing the test. A test module
starts its own, module-scoped::

    @pytest.fixture(scope="module")
    def s3_query(tmp_path_factory):
        with s3_server(tmp_path_factory.mktemp("moto")) as query:
            yield query
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from benchmarks import s3_server as _server
from benchmarks.s3_server import CREDENTIALS

__all__ = ["CREDENTIALS", "s3_server"]


@contextlib.contextmanager
def s3_server(log_dir: str | os.PathLike, buckets: tuple[str, ...] = ("runs",)) -> Iterator[str]:
    """:func:`benchmarks.s3_server.s3_server`; ``pytest.fail`` when moto's server is not installed."""
    try:
        _server.moto_server()
    except RuntimeError as exc:
        pytest.fail(str(exc))
    with _server.s3_server(log_dir, buckets) as query:
        yield query
