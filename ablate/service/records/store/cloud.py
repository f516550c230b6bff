"""A run directory in a bucket: :class:`CloudStore` over obstore (the ``object_store`` crate) for ``s3://`` and
``gs://``, installed by ``pip install ablate[cloud]``.

Each operation is one request: a GET returns the bytes with their ETag (and GCS's generation), a PUT is atomic and
may be conditional (S3's ``If-None-Match: *`` and ``If-Match``, GCS's ``ifGenerationMatch``). A request times out
after :data:`TIMEOUT` (the URI's ``request_timeout=SECONDS`` sets it) and is retried with backoff by obstore for up
to :data:`RETRY_TIMEOUT` (a refused connection, a 5xx, a timeout; the URI's ``retry_timeout=SECONDS`` sets it), so a
store that blinks is waited for and a store that is unreachable fails in one line.

**A store that stops answering** (no answer at all: a refused or reset connection, a timeout; not an answer that is
an error, such as a 403, 404 or 412) is waited for by ablate beyond that: the request is tried again with backoff
(:data:`WAIT_BACKOFF`, at most 10 s apart) until :data:`OUTAGE_S` after the first request that found no answer (the
URI's ``outage_s=SECONDS`` sets it; 0 waits no longer than obstore's retries), with one warning when the wait begins
and one line (info) when the store answers again; nobody can take a lease without the store either
(:mod:`~ablate.service.records.store.lease`), so a run goes on where it was. No try starts past that deadline, and a
try ends within its request's timeouts; then the one-line error as before, saying how long it waited. A store that
never answered this object (nor the one it was pickled from) and to which no connection can even be opened
(refused, a name not found) is a store that is not there: it fails after obstore's retries, without that wait. A
wait sleeps in short slices, and a request made in the main thread runs in a helper thread while the main thread
waits for it in slices, so Ctrl-C and SIGTERM (Python's handlers) stop a waiting process at once.

A retried conditional put whose condition then fails may have failed on its own earlier try, which landed though
its answer was lost (ablate's retry, or obstore's own retry of a dropped connection): the object is read back and,
when it holds the bytes sent, the put succeeded (its version is returned) rather than raising
:class:`~ablate.service.records.store.base.Conflict`. An unconditional put and a delete are simply tried again.

Options of the URI's query (``s3://bucket/prefix?endpoint_override=127.0.0.1:9000&scheme=http&region=us-east-1``,
as pyarrow and Ray name them) are read by :func:`client_config`; credentials come from the environment (``AWS_*``,
``GOOGLE_*``) as the clouds' SDKs read them.
"""

from __future__ import annotations

import builtins
import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from ablate.files import WriteError
from ablate.service.records.store.answers import (
    host_of,
    interruptible,
    message,
    no_answer,
    no_connection,
    retried,
    sleep_in_slices,
)
from ablate.service.records.store.base import Conflict, Got, Match, PutMode, StoreError, key_of
from ablate.service.records.store.bucket import BucketStore

__all__ = ["OUTAGE_S", "RETRY_TIMEOUT", "TIMEOUT", "CloudStore", "client_config", "outage_of"]

_log = logging.getLogger("ablate.service.records.store.cloud")
_T = TypeVar("_T")

#: How long one request may take before it is given up (from its connection to the end of its body; the URI's
#: ``request_timeout`` sets it). A paused server is found silent after this long. Not shorter: an upload above
#: 5 MiB goes in parts of 5 MiB, up to 12 at once, and each must finish within it on a slow link (a GET that times
#: out mid-body is resumed from where it stopped, so a download is not bound by it).
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
#: How long ablate waits, in seconds, for a store that answered before and stopped answering (see the module).
OUTAGE_S = 900.0
#: ablate's tries while it waits: the first after this many seconds, then doubling up to the second.
WAIT_BACKOFF = (0.5, 10.0)
#: The query options of an ``s3://`` URI ablate reads (pyarrow's names), and those it accepts and ignores.
S3_OPTIONS = ("endpoint_override", "scheme", "region", "access_key", "secret_key", "session_token", "anonymous")
IGNORED_OPTIONS = ("allow_delayed_open", "allow_bucket_creation", "allow_bucket_deletion")
#: The query option that sets how long a failing request is retried, in seconds (default :data:`RETRY_TIMEOUT`).
RETRY_OPTION = "retry_timeout"
#: The query option that sets how long one request may take, in seconds (default :data:`TIMEOUT`).
TIMEOUT_OPTION = "request_timeout"
#: The query option that sets how long ablate waits for a store that stopped answering, in seconds (default
#: :data:`OUTAGE_S`; 0: not at all).
OUTAGE_OPTION = "outage_s"
#: The options every bucket's URI may name, in seconds, each with the range it takes.
_SECONDS = {RETRY_OPTION: (0.0, 600.0), TIMEOUT_OPTION: (0.001, 600.0), OUTAGE_OPTION: (0.0, 86400.0)}


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


def _options(uri: str) -> tuple[str, dict[str, str], dict[str, float]]:
    """The scheme of ``uri``, its query's options, and those of :data:`_SECONDS` it names as numbers; ValueError
    naming an option ablate does not know (and those it does) or a value out of its range."""
    scheme, _bucket, _prefix, query = _split(uri)
    options = dict(parse_qsl(query, keep_blank_values=True))
    known = (*S3_OPTIONS, *_SECONDS) if scheme == "s3" else tuple(_SECONDS)
    for name in options:
        if name not in known and name not in IGNORED_OPTIONS:
            raise ValueError(
                f"{uri!r}: the option {name!r} is not one ablate reads for {scheme}:// ({', '.join(known)})"
            )
    seconds: dict[str, float] = {}
    for name, (low, high) in _SECONDS.items():
        if name in options:
            try:
                seconds[name] = float(options[name])
                if not low <= seconds[name] <= high:
                    raise ValueError
            except ValueError:
                raise ValueError(
                    f"{uri!r}: {name} is seconds from {low:g} to {high:g}, not {options[name]!r}"
                ) from None
    return scheme, options, seconds


def client_config(uri: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The obstore store config, client options and retry config that the query of ``uri`` asks for; ValueError
    naming an option ablate does not know (and those it does) or a bad value."""
    scheme, options, seconds = _options(uri)
    retry: dict[str, Any] = {"max_retries": MAX_RETRIES, "retry_timeout": RETRY_TIMEOUT, "backoff": BACKOFF}
    if RETRY_OPTION in seconds:
        retry["retry_timeout"] = timedelta(seconds=seconds[RETRY_OPTION])
    client: dict[str, Any] = {"timeout": TIMEOUT, "connect_timeout": CONNECT_TIMEOUT}
    if TIMEOUT_OPTION in seconds:
        client["timeout"] = timedelta(seconds=seconds[TIMEOUT_OPTION])
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


def outage_of(uri: str) -> float:
    """How long, in seconds, a store at ``uri`` that stopped answering is waited for (its ``outage_s``, default
    :data:`OUTAGE_S`); ValueError as :func:`client_config`."""
    return _options(uri)[2].get(OUTAGE_OPTION, OUTAGE_S)


#: Guards each store's outage state (the start of a wait, its warning and its end).
_OUTAGE_LOCK = threading.Lock()


class CloudStore(BucketStore):
    """Objects under ``s3://bucket/prefix`` or ``gs://bucket/prefix`` (options in the URI's query: see the module).
    The client is made on first use, and again after unpickling (a store travels to Ray's workers)."""

    #: Whether the store ever answered a request of this object (or of the one it was pickled from).
    _answered = False
    #: The store's silence as this process sees it: (monotonic time the wait began, host), or None.
    _outage: tuple[float, str] | None = None

    def __init__(self, uri: str):
        """``uri``: the run directory's URI; ValueError when it is not a bucket's or names an unknown option."""
        self.uri = str(uri)
        self.scheme, self.bucket, self.prefix, query = _split(self.uri)
        self.outage_s = outage_of(self.uri)  # and refuse a bad option now, not at the first request
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
        return {**super().__getstate__(), "_client": None, "_outage": None}

    def join(self, *parts: str) -> str:
        """The URI of the key ``parts`` make: the root's URI with the key before its query."""
        key = key_of("/".join(parts), root_ok=True)
        return f"{self._base}/{key}{self._query}" if key else self.uri

    def _call(self, key: str, call: Callable[[], _T], *, write: bool = False) -> _T:
        """``call()`` (a request, or a few that may be made again from the start: a listing, a batch of deletes),
        waited for while the store gives no answer (see the module), with obstore's errors as the store's: an
        OSError naming the object (a WriteError for a write)."""
        import obstore.exceptions as oe

        tries = 0
        while True:
            try:
                result = interruptible(call)
            except (FileNotFoundError, WriteError, Conflict, oe.AlreadyExistsError, oe.PreconditionError):
                self._answers()
                raise
            except (oe.BaseError, OSError) as exc:
                silent = no_answer(exc)
                if not silent:
                    self._answers()
                waited = self._wait(key, exc, tries) if silent else 0.0
                if waited is None:
                    tries += 1
                    continue
                where = self.join(key) if key else self.uri
                said = message(exc) + (f"; waited {waited:.0f} s for the store ({OUTAGE_OPTION})" if waited else "")
                if write:
                    raise WriteError(None, said, where) from None
                raise StoreError(f"{where}: {said}") from None
            self._answers()
            return result

    def _answers(self) -> None:
        """The store answered: note it, and say so when it had been waited for."""
        self._answered = True
        if self._outage is not None:
            with _OUTAGE_LOCK:
                outage, self._outage = self._outage, None
            if outage is not None:
                _log.info("%s: %s answers again after %.0f s; going on", self.uri, outage[1],
                          time.monotonic() - outage[0])  # fmt: skip

    def _wait(self, key: str, exc: BaseException, tries: int) -> float | None:
        """After the ``tries``-th retry of a request to ``key`` got no answer: sleep before the next and return None;
        or return the seconds the store was waited for when it is waited for no longer (0.0: not at all)."""
        if self.outage_s <= 0 or not (self._answered or not no_connection(exc)):
            return 0.0
        now = time.monotonic()
        with _OUTAGE_LOCK:
            if self._outage is None:
                host = host_of(str(exc)) or f"{self.scheme}://{self.bucket}"
                self._outage = (now, host)
                _log.warning("%s: no answer from %s; waiting up to %.0f s for the store (retries every ~%.0f s)",
                             self.join(key) if key else self.uri, host, self.outage_s,
                             min(WAIT_BACKOFF[1], self.outage_s))  # fmt: skip
            since = self._outage[0]
        if now - since >= self.outage_s:
            return now - since
        sleep_in_slices(min(WAIT_BACKOFF[0] * 2 ** min(tries, 16), WAIT_BACKOFF[1], since + self.outage_s - now))
        return None

    def get(self, key: str) -> Got | None:
        """The object's content and version (ETag, and GCS's generation) in one GET; None when there is none."""
        import obstore

        key = key_of(key)

        def call() -> Got | None:
            try:
                got = obstore.get(self.client, key)
                return Got(got.bytes().to_bytes(), _version(got.meta))
            except FileNotFoundError:
                return None

        return self._call(key, call)

    def put(self, key: str, data: bytes, mode: PutMode = "overwrite") -> str:
        """One PUT of ``data`` under ``mode``; its new version. A conditional put whose condition fails after a try
        of it got no answer (ours, or obstore's own retry) reads the object back: holding ``data``, it is ours."""
        import obstore
        import obstore.exceptions as oe

        key = key_of(key)
        sent: Any = mode
        if isinstance(mode, Match):
            e_tag, _, generation = mode.version.partition("#")
            sent = {"e_tag": e_tag, **({"version": generation} if generation else {})}
        unsure = False  # a try got no answer: it may have landed

        def call() -> str:
            nonlocal unsure
            try:
                return _version(obstore.put(self.client, key, data, mode=sent))
            except (oe.AlreadyExistsError, oe.PreconditionError) as exc:
                if unsure or retried(exc):  # the condition may have failed on our own earlier try
                    try:
                        got = obstore.get(self.client, key)
                        if got.bytes().to_bytes() == bytes(data):
                            return _version(got.meta)
                    except FileNotFoundError:
                        pass
                raise self.conflict(key, mode) from None
            except FileNotFoundError as exc:  # no such bucket (a missing object fails a match as a precondition)
                raise WriteError(None, message(exc), self.join(key)) from None
            except (oe.BaseError, OSError) as exc:
                unsure = unsure or no_answer(exc)
                raise

        return self._call(key, call, write=True)

    def delete(self, key: str) -> None:
        """Remove the object at ``key``; a missing one is fine."""
        import obstore

        key = key_of(key)

        def call() -> None:
            try:
                obstore.delete(self.client, key)
            except FileNotFoundError:
                pass

        self._call(key, call, write=True)

    def delete_many(self, keys: builtins.list[str]) -> None:
        """Remove the objects at ``keys`` (missing ones are fine): one request a thousand."""
        keys = [key_of(k) for k in keys]
        self._delete_keys(keys[0] if keys else "", keys)

    def _delete_keys(self, where: str, keys: builtins.list[str]) -> None:
        import obstore

        def call() -> None:
            for start in range(0, len(keys), 1000):
                obstore.delete(self.client, keys[start : start + 1000])

        self._call(where, call, write=True)

    def _keys(self, prefix: str) -> builtins.list[str]:
        """Every key that starts with ``prefix`` (one LIST a thousand)."""
        import obstore

        def call() -> builtins.list[str]:
            keys: builtins.list[str] = []
            for chunk in obstore.list(self.client, prefix=prefix or None):
                keys.extend(m["path"] for m in chunk)
            return keys

        return self._call(prefix, call)

    def delete_tree(self, prefix: str) -> None:
        """Remove every object under ``prefix/``."""
        prefix = key_of(prefix)
        self._delete_keys(prefix, self._keys(prefix + "/"))

    def list(self, prefix: str = "", *, dirs: bool) -> builtins.list[str]:
        """Sorted names of the objects (or folders, ``dirs``) directly under ``prefix`` (one LIST a thousand)."""
        import obstore

        prefix = key_of(prefix, root_ok=True)
        found = self._call(prefix, lambda: obstore.list_with_delimiter(self.client, prefix or None))
        if dirs:
            return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in found["common_prefixes"])
        return sorted(m["path"].rsplit("/", 1)[-1] for m in found["objects"])

    def exists(self, key: str) -> bool:
        """Whether an object, or a folder (a prefix of some object's key), is at ``key``."""
        import obstore

        key = key_of(key, root_ok=True)

        def call() -> bool:
            if key:
                try:
                    obstore.head(self.client, key)
                    return True
                except FileNotFoundError:
                    pass
            return any(chunk for chunk in obstore.list(self.client, prefix=(key + "/") if key else None, chunk_size=1))

        return self._call(key, call)


def _version(meta: dict[str, Any]) -> str:
    """A version as the store names it: the ETag, with GCS's generation after a ``#``."""
    e_tag, generation = meta.get("e_tag") or "", meta.get("version")
    return f"{e_tag}#{generation}" if generation else e_tag
