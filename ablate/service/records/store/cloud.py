"""A run directory in a bucket: :class:`CloudStore` over obstore (the ``object_store`` crate) for ``s3://`` and
``gs://``, installed by ``pip install ablate[cloud]``.

Each operation is one request: a GET returns the bytes with their ETag (and GCS's generation), a PUT is atomic and
may be conditional (S3's ``If-None-Match: *`` and ``If-Match``, GCS's ``ifGenerationMatch``). Requests time out
(:data:`TIMEOUT`) and are retried with backoff by obstore for up to :data:`RETRY_TIMEOUT` (a refused connection, a
5xx, a timeout; the URI's ``retry_timeout=SECONDS`` sets it), so a store that blinks is waited for and a store that
is unreachable fails in one line. Options of
the URI's query (``s3://bucket/prefix?endpoint_override=127.0.0.1:9000&scheme=http&region=us-east-1``, as pyarrow
and Ray name them) are read by :func:`client_config`; credentials come from the environment (``AWS_*``,
``GOOGLE_*``) as the clouds' SDKs read them.
"""

from __future__ import annotations

import builtins
import contextlib
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl

from ablate.files import WriteError
from ablate.service.records.store.base import Got, Match, PutMode, StoreError, key_of
from ablate.service.records.store.bucket import BucketStore

__all__ = ["RETRY_TIMEOUT", "TIMEOUT", "CloudStore", "client_config"]

#: How long one request may take before it is retried.
TIMEOUT = "30s"
#: How long a connection may take to open.
CONNECT_TIMEOUT = "5s"
#: How obstore retries a failing request (a refused connection, a 5xx, a read that timed out): up to this many times,
#: waiting from 0.25 s doubling up to 10 s (with jitter) in between, for at most :data:`RETRY_TIMEOUT` in all. A
#: refused connection fails after about 32 s (measured against a closed port on 127.0.0.1), so a store that
#: restarts within about half a minute is waited for, and an unreachable one is said within a minute.
MAX_RETRIES = 30
RETRY_TIMEOUT = timedelta(seconds=60)
BACKOFF = {"init_backoff": timedelta(milliseconds=250), "max_backoff": timedelta(seconds=10), "base": 2}
#: The query options of an ``s3://`` URI ablate reads (pyarrow's names), and those it accepts and ignores.
S3_OPTIONS = ("endpoint_override", "scheme", "region", "access_key", "secret_key", "session_token", "anonymous")
IGNORED_OPTIONS = ("allow_delayed_open", "allow_bucket_creation", "allow_bucket_deletion")
#: The query option that sets how long a failing request is retried, in seconds (default :data:`RETRY_TIMEOUT`).
RETRY_OPTION = "retry_timeout"


def _split(uri: str) -> tuple[str, str, str, str]:
    """``scheme://bucket/prefix?query`` → (scheme, bucket, prefix, query); ValueError naming what is wrong."""
    if any(c in uri for c in "\r\n\t"):
        raise ValueError(f"{uri!r}: a URI holds no newline or tab")
    scheme, sep, rest = uri.partition("://")
    base, _, query = rest.partition("?")
    bucket, _, prefix = base.partition("/")
    if not sep or scheme not in ("s3", "gs") or not bucket:
        raise ValueError(f"{uri!r}: not a bucket's URI (s3://BUCKET/PREFIX or gs://BUCKET/PREFIX)")
    return scheme, bucket, prefix.strip("/"), query


def client_config(uri: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The obstore store config, client options and retry config that the query of ``uri`` asks for; ValueError
    naming an option ablate does not know (and those it does) or a bad value."""
    scheme, _bucket, _prefix, query = _split(uri)
    options = dict(parse_qsl(query, keep_blank_values=True))
    known = (*S3_OPTIONS, RETRY_OPTION) if scheme == "s3" else (RETRY_OPTION,)
    for name in options:
        if name not in known and name not in IGNORED_OPTIONS:
            raise ValueError(
                f"{uri!r}: the option {name!r} is not one ablate reads for {scheme}:// ({', '.join(known)})"
            )
    retry: dict[str, Any] = {"max_retries": MAX_RETRIES, "retry_timeout": RETRY_TIMEOUT, "backoff": BACKOFF}
    if RETRY_OPTION in options:
        try:
            seconds = float(options[RETRY_OPTION])
            if not 0 <= seconds <= 600:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"{uri!r}: {RETRY_OPTION} is seconds from 0 to 600, not {options[RETRY_OPTION]!r}"
            ) from None
        retry["retry_timeout"] = timedelta(seconds=seconds)
    client: dict[str, Any] = {"timeout": TIMEOUT, "connect_timeout": CONNECT_TIMEOUT}
    config: dict[str, Any] = {}
    if scheme == "s3":
        endpoint = options.get("endpoint_override")
        if endpoint:
            web = options.get("scheme", "https")
            config["endpoint"] = endpoint if "://" in endpoint else f"{web}://{endpoint}"
            client["allow_http"] = config["endpoint"].startswith("http://")
        names = {"region": "region", "access_key": "access_key_id", "secret_key": "secret_access_key",
                 "session_token": "token"}  # fmt: skip
        config.update({names[k]: v for k, v in options.items() if k in names})
        if options.get("anonymous", "").lower() in ("1", "true"):
            config["skip_signature"] = True
    return config, client, retry


#: The store's error codes that a person reads better in words.
_CODES = {"NoSuchBucket": "the bucket does not exist", "AccessDenied": "access denied",
          "InvalidAccessKeyId": "the access key is not known", "SignatureDoesNotMatch": "the secret key does not match"}  # fmt: skip


def _message(exc: BaseException) -> str:
    """obstore's error in a few words: the HTTP status and the store's error code (``404 Not Found,
    NoSuchBucket``), or the last clause of its first line (``HTTP error: error sending request``)."""
    text = str(exc)
    status = re.search(r"status code: (\d{3}[^:<\n]*)", text)
    code = re.search(r"<Code>([^<]+)</Code>", text)
    if status:
        said = _CODES.get(code[1], code[1]) if code else None
        if said is None and status[1][:3] in ("401", "403"):
            said = "check the credentials (AWS_* or GOOGLE_* in the environment, or the URI's access_key/secret_key)"
        return ", ".join([status[1].strip(), *([said] if said else [])])
    first = text.split("\n\nDebug source:")[0].split("\n")[0]
    reason = " ".join(first.rsplit(" - ", 1)[-1].split())[:300]
    host = re.search(r"Error performing \w+ (\w+://[^/\s]+)", first)
    retried = re.search(r"in ([\d.]+)s, after (\d+) retries", first)
    if host and retried:  # no answer: a refused connection, a timeout (after the client's retries)
        return f"no answer from {host[1]} in {float(retried[1]):.0f} s and {retried[2]} retries ({reason})"
    return reason


class CloudStore(BucketStore):
    """Objects under ``s3://bucket/prefix`` or ``gs://bucket/prefix`` (options in the URI's query: see the module).
    The client is made on first use, and again after unpickling (a store travels to Ray's workers)."""

    def __init__(self, uri: str):
        """``uri``: the run directory's URI; ValueError when it is not a bucket's or names an unknown option."""
        self.uri = str(uri)
        self.scheme, self.bucket, self.prefix, query = _split(self.uri)
        client_config(self.uri)  # refuse a bad option now, not at the first request
        base = f"{self.scheme}://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        self._base, self._query = base, (f"?{query}" if query else "")
        self._client: Any = None

    @property
    def client(self) -> Any:
        """The obstore store (made on first use)."""
        if self._client is None:
            try:
                from obstore.store import GCSStore, S3Store
            except ImportError:
                raise RuntimeError(
                    f"{self.uri}: a run in a bucket needs obstore: pip install 'ablate[cloud]'"
                ) from None
            config, client, retry = client_config(self.uri)
            kind = S3Store if self.scheme == "s3" else GCSStore
            self._client = kind(self.bucket, prefix=self.prefix or None, config=config or None,
                                client_options=client, retry_config=retry)  # fmt: skip
        return self._client

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_client": None}

    def join(self, *parts: str) -> str:
        """The URI of the key ``parts`` make: the root's URI with the key before its query."""
        key = key_of("/".join(parts), root_ok=True)
        return f"{self._base}/{key}{self._query}" if key else self.uri

    @contextlib.contextmanager
    def _request(self, key: str, *, write: bool = False) -> Iterator[None]:
        """obstore's errors as the store's: an OSError naming the object (a WriteError for a write)."""
        import obstore.exceptions as oe

        try:
            yield
        except (FileNotFoundError, WriteError, oe.AlreadyExistsError, oe.PreconditionError):
            raise
        except (oe.BaseError, OSError) as exc:
            where = self.join(key) if key else self.uri
            if write:
                raise WriteError(None, _message(exc), where) from None
            raise StoreError(f"{where}: {_message(exc)}") from None

    def get(self, key: str) -> Got | None:
        """The object's content and version (ETag, and GCS's generation) in one GET; None when there is none."""
        import obstore

        key = key_of(key)
        with self._request(key):
            try:
                got = obstore.get(self.client, key)
                data = got.bytes().to_bytes()
            except FileNotFoundError:
                return None
        return Got(data, _version(got.meta))

    def put(self, key: str, data: bytes, mode: PutMode = "overwrite") -> str:
        """One PUT of ``data`` under ``mode``; its new version."""
        import obstore
        import obstore.exceptions as oe

        key = key_of(key)
        sent: Any = mode
        if isinstance(mode, Match):
            e_tag, _, generation = mode.version.partition("#")
            sent = {"e_tag": e_tag, **({"version": generation} if generation else {})}
        with self._request(key, write=True):
            try:
                result = obstore.put(self.client, key, data, mode=sent)
            except (oe.AlreadyExistsError, oe.PreconditionError):
                raise self.conflict(key, mode) from None
            except FileNotFoundError as exc:  # no such bucket (a missing object fails a match as a precondition)
                raise WriteError(None, _message(exc), self.join(key)) from None
        return _version(result)

    def delete(self, key: str) -> None:
        """Remove the object at ``key``; a missing one is fine."""
        import obstore

        key = key_of(key)
        with self._request(key, write=True), contextlib.suppress(FileNotFoundError):
            obstore.delete(self.client, key)

    def delete_many(self, keys: builtins.list[str]) -> None:
        """Remove the objects at ``keys`` (missing ones are fine): one request a thousand."""
        import obstore

        keys = [key_of(k) for k in keys]
        with self._request(keys[0] if keys else "", write=True):
            for start in range(0, len(keys), 1000):
                obstore.delete(self.client, keys[start : start + 1000])

    def _keys(self, prefix: str) -> builtins.list[str]:
        import obstore

        keys: builtins.list[str] = []
        with self._request(prefix):
            for chunk in obstore.list(self.client, prefix=prefix or None):
                keys.extend(m["path"] for m in chunk)
        return keys

    def delete_tree(self, prefix: str) -> None:
        """Remove every object under ``prefix/``."""
        import obstore

        prefix = key_of(prefix)
        keys = self._keys(prefix + "/")
        with self._request(prefix, write=True):
            for start in range(0, len(keys), 1000):
                obstore.delete(self.client, keys[start : start + 1000])

    def list(self, prefix: str = "", *, dirs: bool) -> builtins.list[str]:
        """Sorted names of the objects (or folders, ``dirs``) directly under ``prefix`` (one LIST a thousand)."""
        import obstore

        prefix = key_of(prefix, root_ok=True)
        with self._request(prefix):
            found = obstore.list_with_delimiter(self.client, prefix or None)
        if dirs:
            return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in found["common_prefixes"])
        return sorted(m["path"].rsplit("/", 1)[-1] for m in found["objects"])

    def exists(self, key: str) -> bool:
        """Whether an object, or a folder (a prefix of some object's key), is at ``key``."""
        import obstore

        key = key_of(key, root_ok=True)
        with self._request(key):
            if key:
                with contextlib.suppress(FileNotFoundError):
                    obstore.head(self.client, key)
                    return True
            for chunk in obstore.list(self.client, prefix=(key + "/") if key else None, chunk_size=1):
                if chunk:
                    return True
        return False


def _version(meta: dict[str, Any]) -> str:
    """A version as the store names it: the ETag, with GCS's generation after a ``#``."""
    e_tag, generation = meta.get("e_tag") or "", meta.get("version")
    return f"{e_tag}#{generation}" if generation else e_tag
