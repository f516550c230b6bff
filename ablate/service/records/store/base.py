"""The :class:`Store` interface: a run directory's files under one root, read with their version and written
under a condition, so that safety rests on the store's compare-and-swap, never on waiting or on hosts' clocks.

A key is a ``/``-separated path under the root (``trial_x/params.json``; ``""``: the root, where a folder is meant).
:meth:`Store.get` returns the bytes and their version in one read; :meth:`Store.put` writes a whole file in one of
three modes: :data:`OVERWRITE` (always), :data:`CREATE` (only when no file is there) or :class:`Match` (only when the
file is still the version named). A put whose condition fails raises :class:`Conflict` and changes nothing; every
put is atomic: a reader sees the old content or the new, never part of one. A version is opaque: equal versions
mean equal content (on disk a hash of the content, on S3 its ETag, on GCS its generation). A failed read, write or
delete raises an OSError (:class:`ablate.files.WriteError` for a write) naming the file.
"""

from __future__ import annotations

import builtins
import os
import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol

from ablate.service.records.store.listing import Listing

__all__ = [
    "CREATE",
    "OVERWRITE",
    "StoreError",
    "Conflict",
    "FolderStore",
    "Got",
    "Listing",
    "Match",
    "PutMode",
    "Store",
    "check_conditional",
]

#: :meth:`Store.put` mode: replace whatever is there.
OVERWRITE = "overwrite"
#: :meth:`Store.put` mode: write only when no file is at the key (S3's ``If-None-Match: *``, GCS's generation 0).
CREATE = "create"


@dataclass(frozen=True)
class Match:
    """:meth:`Store.put` mode: write only when the file there is still ``version`` (S3's ``If-Match`` on its ETag,
    GCS's ``ifGenerationMatch``)."""

    version: str


PutMode = str | Match


class Lock(Protocol):
    """One writer at a time (:meth:`Store.lock`): an ``flock`` on disk (:class:`~ablate.service.records.store.flock.
    PidLock`), a lease in a bucket (:class:`~ablate.service.records.store.lease.Lease`). ``acquire`` raises
    :class:`~ablate.service.records.store.flock.LockHeld` naming the holder; ``check`` raises when the lock was lost
    (a lease taken over) and is called before each write under it."""

    def acquire(self) -> Lock: ...

    def start_heartbeat(self) -> Lock: ...

    def check(self) -> None: ...

    def release(self) -> None: ...


class Got(NamedTuple):
    """A file's content and its version, as one read saw them."""

    data: bytes
    version: str


class StoreError(OSError):
    """The store could not be read or reached (after its client's retries): one line naming the file or the store
    and the reason, which every command shows as it is."""


class Conflict(Exception):
    """A conditional put found its condition false (a file already there for :data:`CREATE`, another version or none
    for :class:`Match`) and wrote nothing. ``where`` names the file."""

    def __init__(self, where: str, mode: str):
        self.where, self.mode = where, mode
        super().__init__(where, mode)

    def __str__(self) -> str:
        return f"{self.where}: not written ({self.mode})"


def _mode_text(mode: PutMode) -> str:
    return "a file is already there" if mode == CREATE else "it is no longer the version read"


def key_of(key: str, *, root_ok: bool = False) -> str:
    """``key`` normalised (no empty parts); ValueError for ``.``/``..`` parts, or for the root unless ``root_ok``."""
    parts = [p for p in str(key).split("/") if p]
    if any(p in (".", "..") for p in parts) or not (parts or root_ok):
        raise ValueError(f"not a key under the store's root: {key!r}")
    return "/".join(parts)


class Store(ABC):
    """A run directory's files under one root. Keys are ``/``-separated paths relative to it."""

    #: The root as the user named it (a path, ``file://…``, ``s3://bucket/prefix?query``, ``memory://name``).
    uri: str

    @abstractmethod
    def join(self, *parts: str) -> str:
        """The location of the key ``parts`` make, as messages name it: a local path, or the object's URI (with
        the root URI's query kept at its end). No parts: the root's."""

    @abstractmethod
    def get(self, key: str) -> Got | None:
        """The file's content and version in one read, or None when there is no file at ``key``."""

    @abstractmethod
    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        """Write ``data`` at ``key`` whole (creating folders where they are real) under ``mode`` (:data:`OVERWRITE`,
        :data:`CREATE` or :class:`Match`) and return its new version; :class:`Conflict` when the condition fails,
        :class:`~ablate.files.WriteError` naming the file when it cannot be written."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the file at ``key``; a missing one is fine (its folder stays)."""

    @abstractmethod
    def delete_tree(self, prefix: str) -> None:
        """Remove the folder ``prefix`` and everything under it; a missing one is fine. Never the root."""

    @abstractmethod
    def list(self, prefix: str = "", *, dirs: bool) -> builtins.list[str]:
        """Sorted names of the direct children of folder ``prefix`` (``""``: the root) that are files, or folders
        when ``dirs``; [] when there is no such folder. Temporaries of a write in progress are not listed."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether a file or a folder is at ``key``."""

    def delete_many(self, keys: builtins.list[str]) -> None:
        """Remove the files at ``keys`` (missing ones are fine)."""
        for key in keys:
            self.delete(key)

    # ------------------------------------------------------------------ scans (:mod:`~.listing`)
    def scan(self, prefix: str = "") -> Listing:
        """Every file under the folder ``prefix`` (``""``: the root) now, as one :class:`Listing` (in a bucket one
        LIST a thousand files). Its keys are this store's root's (:meth:`root_key`)."""
        prefix = key_of(prefix, root_ok=True)
        files: builtins.list[str] = []
        folders, todo = [], [prefix]
        while todo:
            folder = todo.pop()
            under = f"{folder}/" if folder else ""
            files += [under + name for name in self.list(folder, dirs=False)]
            found = [under + name for name in self.list(folder, dirs=True)]
            folders += found
            todo += found
        return Listing(self.root_key(prefix), [self.root_key(f) for f in files], [self.root_key(f) for f in folders])

    def root_key(self, key: str) -> str:
        """``key`` as the store at the root of this one names it (a :class:`FolderStore`'s parent's)."""
        return key_of(key, root_ok=True)

    def listed(self, listing: Listing | None, prefix: str = "", *, dirs: bool) -> builtins.list[str]:
        """:meth:`list`, answered by ``listing`` when it covers ``prefix`` (no request)."""
        where = self.root_key(prefix)
        if listing is not None and listing.covers(where):
            return listing.names(where, dirs=dirs)
        return self.list(prefix, dirs=dirs)

    def present(self, listing: Listing | None, key: str) -> bool:
        """Whether a file is at ``key``: ``listing``'s answer when it covers the key, else :meth:`exists`'s."""
        where = self.root_key(key)
        if listing is not None and listing.covers(where):
            return listing.has(where)
        return self.exists(key)

    # ------------------------------------------------------------------ logs and locks: each backend's own
    # An append-only log of lines: on disk one file appended to (:class:`~.local.LocalStore`); in a bucket numbered
    # entries written create-only and merged (:class:`~.bucket.BucketStore`, :mod:`~.segments`).
    def own_logs(self, owned: bool) -> None:
        """Say that this process holds the run's lock (``owned``) or no longer does: while it does, no other
        process writes the store's logs, so a log it read once may be read again without a request."""
        raise NotImplementedError

    def has_log(self, key: str) -> bool:
        """Whether a log is at ``key`` (one request in a bucket, where its entries may be all there is)."""
        return self.exists(key)

    def read_log(self, key: str, listing: Listing | None = None) -> bytes | None:
        """The lines of the log at ``key``, or None when there is none. On disk a last line a killed writer cut
        may end them (a reader skips it; the next append cuts it). ``listing``: a scan that covers the log, to read
        its pieces without listing them (in a bucket)."""
        raise NotImplementedError

    def log_tail(self, key: str, listing: Listing | None = None) -> bytes | None:
        """Whole lines that end the log at ``key`` (at least its last line, when it has one), or None."""
        raise NotImplementedError

    def append_log(self, key: str, lines: bytes) -> None:
        """Add ``lines`` (whole lines, each ending with a newline) to the log at ``key``, creating it; atomic (a
        reader sees them all or none). :class:`Conflict` when another writer superseded this one's log."""
        raise NotImplementedError

    def replace_log(self, key: str, data: bytes) -> None:
        """Make ``data`` (whole lines) the whole log at ``key``, atomically."""
        raise NotImplementedError

    def compact_log(self, key: str) -> None:
        """Make the log at ``key`` one piece, as this process wrote it (a log it finished writing), so a reader
        reads it in one request. Nothing where a log is one file."""
        raise NotImplementedError

    def lock(
        self, key: str, *, ttl_s: float, owner: dict | None = None, dead: Callable[[dict], bool] | None = None
    ) -> Lock:
        """The one-writer lock at ``key``: an ``flock`` on disk; in a bucket a
        :class:`~ablate.service.records.store.lease.Lease` (taken and renewed by conditional puts; ``ttl_s`` how long a
        waiter watches one version; ``owner`` and ``dead``: who holds it, and whether a holder elsewhere is known
        dead, as the Lease takes them). Both have ``acquire``, ``release``, ``check`` and ``start_heartbeat``."""
        raise NotImplementedError

    def lock_holder(self, key: str, *, ttl_s: float) -> dict | None:
        """Who holds the lock at ``key`` ({pid, host, since, …}), or None when nobody does, as far as one read
        tells."""
        raise NotImplementedError

    def make_folder(self, key: str) -> None:
        """Create the folder ``key`` where folders are real (on disk); elsewhere a write makes its folder."""
        return None

    def linked_out(self, key: str) -> str | None:
        """Where the folder at ``key`` leads when it is a link, or leads out of the root (on disk); None when it is a
        folder of its own (always in a bucket, which has no links)."""
        return None

    def local_file(self, key: str) -> Path | None:
        """The path on this machine's file system of the file at ``key`` (there or not), for a program that opens
        files by path (SQLite, a browser); None where the store is not a folder of this machine."""
        return None

    def probe(self) -> None:
        """Prove that a run's record can be kept here, before anything is written: an OSError naming why not (it
        cannot be written), or RuntimeError naming what it lacks (a bucket's conditional writes,
        :func:`check_conditional`)."""
        check_conditional(self)

    def sweep_temporaries(self) -> builtins.list[str]:
        """Remove what writers killed earlier left behind (on disk their temporaries; a bucket has none, each
        file being one upload); the keys removed."""
        return []

    def remove_root_if_empty(self) -> None:
        """Remove the root folder when nothing is in it (where folders are real; elsewhere nothing to do)."""
        return None

    def read_bytes(self, key: str) -> bytes | None:
        """The file's content, or None when there is no file at ``key``."""
        got = self.get(key)
        return None if got is None else got.data

    def read_text(self, key: str) -> str | None:
        """The file's UTF-8 text, or None when there is no file at ``key``."""
        data = self.read_bytes(key)
        return None if data is None else data.decode("utf-8")

    def write_bytes(self, key: str, data: bytes) -> None:
        """Replace the file at ``key`` by ``data`` (:meth:`put` with :data:`OVERWRITE`)."""
        self.put(key, data)

    def write_text(self, key: str, text: str) -> None:
        """:meth:`write_bytes` of ``text`` in UTF-8."""
        self.write_bytes(key, text.encode("utf-8"))

    def conflict(self, key: str, mode: PutMode) -> Conflict:
        """The :class:`Conflict` of a put of ``key`` under ``mode`` whose condition failed."""
        return Conflict(self.join(key), _mode_text(mode))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


def check_conditional(store: Store) -> None:
    """Prove that ``store`` honours conditional writes, with a probe object created, created again, matched on a
    wrong version and removed: a second create that succeeds (a store that ignores ``If-None-Match``) or a match
    that writes over another version raises RuntimeError naming what the store lacks. A lease and every write under
    it rest on these (module :mod:`ablate.service.records.store.lease`)."""
    probe = f".ablate-cas-test-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        first = store.put(probe, b"1", CREATE)
        try:
            store.put(probe, b"2", CREATE)
        except Conflict:
            pass
        else:
            raise RuntimeError("a second create-only write of one key succeeded (it ignores If-None-Match)")
        try:
            store.put(probe, b"3", Match(first + "0"))
        except Conflict:
            pass
        else:
            raise RuntimeError("a write matched on a version the object does not have succeeded (it ignores If-Match)")
    finally:
        store.delete(probe)


class FolderStore(Store):
    """The files under one folder of another store, with keys relative to that folder: a trial's folder of a run's
    store, as the checkpoint functions take it (:mod:`ablate.service.records.trial`)."""

    def __init__(self, parent: Store, folder: str):
        self.parent, self.folder, self.uri = parent, folder, parent.join(folder)

    def _at(self, key: str, *, root_ok: bool = False) -> str:
        parts = [p for p in str(key).split("/") if p]
        if not (parts or root_ok):
            raise ValueError(f"not a key under the store's root: {key!r}")
        return "/".join([self.folder, *parts])  # "..": the parent's keys refuse it

    def join(self, *parts: str) -> str:
        return self.parent.join(self.folder, *parts)

    def get(self, key: str) -> Got | None:
        return self.parent.get(self._at(key))

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        return self.parent.put(self._at(key), data, mode)

    def delete(self, key: str) -> None:
        self.parent.delete(self._at(key))

    def delete_tree(self, prefix: str) -> None:
        self.parent.delete_tree(self._at(prefix))

    def list(self, prefix: str = "", *, dirs: bool) -> builtins.list[str]:
        return self.parent.list(self._at(prefix, root_ok=True), dirs=dirs)

    def scan(self, prefix: str = "") -> Listing:
        return self.parent.scan(self._at(prefix, root_ok=True))

    def root_key(self, key: str) -> str:
        return self.parent.root_key(self._at(key, root_ok=True))

    def exists(self, key: str) -> bool:
        return self.parent.exists(self._at(key, root_ok=True))

    def delete_many(self, keys: builtins.list[str]) -> None:
        self.parent.delete_many([self._at(k) for k in keys])

    def make_folder(self, key: str) -> None:
        self.parent.make_folder(self._at(key, root_ok=True))

    def linked_out(self, key: str) -> str | None:
        return self.parent.linked_out(self._at(key))

    def local_file(self, key: str) -> Path | None:
        return self.parent.local_file(self._at(key))

    def has_log(self, key: str) -> bool:
        return self.parent.has_log(self._at(key))

    def probe(self) -> None:
        self.parent.probe()

    def own_logs(self, owned: bool) -> None:
        self.parent.own_logs(owned)

    def read_log(self, key: str, listing: Listing | None = None) -> bytes | None:
        return self.parent.read_log(self._at(key), listing)

    def log_tail(self, key: str, listing: Listing | None = None) -> bytes | None:
        return self.parent.log_tail(self._at(key), listing)

    def append_log(self, key: str, lines: bytes) -> None:
        self.parent.append_log(self._at(key), lines)

    def replace_log(self, key: str, data: bytes) -> None:
        self.parent.replace_log(self._at(key), data)

    def compact_log(self, key: str) -> None:
        self.parent.compact_log(self._at(key))

    def lock(
        self, key: str, *, ttl_s: float, owner: dict | None = None, dead: Callable[[dict], bool] | None = None
    ) -> Lock:
        return self.parent.lock(self._at(key), ttl_s=ttl_s, owner=owner, dead=dead)

    def lock_holder(self, key: str, *, ttl_s: float) -> dict | None:
        return self.parent.lock_holder(self._at(key), ttl_s=ttl_s)
