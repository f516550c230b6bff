"""A real S3 server for tests: :func:`benchmarks.s3_server.s3_server` (moto's standalone server on 127.0.0.1,
reached through obstore's S3 client with the endpoint in the URI), a missing moto failing the test. A test module
starts its own, module-scoped, by importing the :func:`s3_query` fixture (``from s3_server import s3_query``);
:func:`fresh_s3_uri` names a fresh run directory on it.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import pytest

from benchmarks import s3_server as _server
from benchmarks.s3_server import CREDENTIALS

__all__ = ["CREDENTIALS", "fresh_s3_uri", "s3_query", "s3_server"]


@contextlib.contextmanager
def s3_server(log_dir: str | os.PathLike, buckets: tuple[str, ...] = ("runs",)) -> Iterator[str]:
    """:func:`benchmarks.s3_server.s3_server`; ``pytest.fail`` when moto's server is not installed."""
    try:
        _server.moto_server()
    except RuntimeError as exc:
        pytest.fail(str(exc))
    with _server.s3_server(log_dir, buckets) as query:
        yield query


@pytest.fixture(scope="module")
def s3_query(tmp_path_factory):
    """An S3 server for the test module, with an empty bucket ``runs``; the URI query that reaches it."""
    with s3_server(tmp_path_factory.mktemp("moto")) as query:
        yield query


def fresh_s3_uri(query: str, bucket: str = "runs") -> str:
    """A fresh run directory's URI in ``bucket`` on the server ``query`` reaches: each caller gets its own prefix."""
    return f"s3://{bucket}/lab/{uuid.uuid4().hex[:8]}?{query}"
