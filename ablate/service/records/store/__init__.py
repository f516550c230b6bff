"""Where a run directory's files live: one :class:`Store` interface (:mod:`.base`) over a local disk
(:class:`LocalStore`), a bucket (:class:`CloudStore`: ``s3://``, ``gs://``) or this process's memory
(:class:`MemoryStore`: ``memory://``). :func:`open_store` picks one for a path or URI; above this package nothing
asks which it has. Every write is of a whole file, atomic, and may be conditional (create-only, or only while the
file is the version read): the record's locks and fencing rest on that (:mod:`ablate.service.records.store.lease`).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from ablate.files import is_remote, local_path
from ablate.service.records.store.base import (
    CREATE,
    OVERWRITE,
    Conflict,
    FolderStore,
    Got,
    Listing,
    Lock,
    Match,
    PutMode,
    Store,
    StoreError,
    check_conditional,
)
from ablate.service.records.store.cloud import CloudStore
from ablate.service.records.store.local import LocalStore
from ablate.service.records.store.memory import MemoryStore

__all__ = [
    "CREATE",
    "OVERWRITE",
    "CloudStore",
    "Conflict",
    "FolderStore",
    "Got",
    "Listing",
    "LocalStore",
    "Lock",
    "Match",
    "MemoryStore",
    "PutMode",
    "Store",
    "StoreError",
    "as_store",
    "check_conditional",
    "child_location",
    "local_folder",
    "normal_location",
    "open_store",
    "output_location",
    "parent_location",
    "write_file",
]


def open_store(uri_or_path: str | os.PathLike) -> Store:
    """The store of a run directory: a :class:`CloudStore` for ``s3://`` and ``gs://``, a :class:`MemoryStore` for
    ``memory://``, else a :class:`LocalStore` over its local path (``file://`` removed, ``~`` expanded). ValueError naming the URI
    for any other scheme, or a bucket URI with an option ablate does not read."""
    text = str(uri_or_path)
    if text.startswith("memory://"):
        return MemoryStore(text)
    if is_remote(text):
        return CloudStore(text)
    return LocalStore(local_path(uri_or_path).expanduser(), uri=text)


def as_store(run_dir: str | os.PathLike | Store) -> Store:
    """The store of a run directory: ``run_dir`` itself, or :func:`open_store`'s (one per URI in a process for a
    remote one: a Trainable makes its record once, the driver one per report)."""
    if isinstance(run_dir, Store):
        return run_dir
    return _remote_store(str(run_dir)) if is_remote(run_dir) else open_store(run_dir)


@functools.lru_cache(maxsize=16)
def _remote_store(uri: str) -> Store:
    return open_store(uri)


# ------------------------------------------------------------------ locations: a path or a URI, named and joined here
def normal_location(storage: str | os.PathLike) -> str:
    """``storage`` as ablate names it: a local path expanded and made absolute (``file://`` removed); a bucket's or
    memory's URI as it is."""
    text = str(storage)
    if is_remote(text):
        return text
    return str(local_path(text).expanduser().resolve())


def local_folder(location: str | os.PathLike) -> Path | None:
    """The folder of this machine that ``location`` names (``~`` expanded), or None for a bucket's or memory's URI;
    opens nothing (:meth:`Store.local_file` asks an open store)."""
    text = str(location)
    return None if is_remote(text) else local_path(text).expanduser()


def child_location(storage: str | os.PathLike, name: str) -> str:
    """``<storage>/<name>``: under a local folder (made absolute), or in a bucket with the URI's query kept at its
    end (``s3://b/runs/NAME?query``)."""
    text = normal_location(storage)
    base, mark, query = text.partition("?") if is_remote(text) else (text, "", "")
    return f"{base.rstrip('/')}/{name}{mark}{query}"


def parent_location(location: str | os.PathLike) -> tuple[str, str]:
    """(storage, name) of a location :func:`child_location` made (a URI's query stays with its storage)."""
    text = str(location)
    base, mark, query = text.partition("?") if is_remote(text) else (text, "", "")
    storage, _, name = base.rstrip("/").rpartition("/")
    if not storage and base.startswith("/"):
        storage = "/"  # a file at the root of the file system
    return storage + mark + query, name


def output_location(run_dir: str | os.PathLike, name: str) -> str:
    """Where a file made from a run (a report, an exported table) goes unless told: ``RUN_DIR/<name>`` for a run in a
    folder of this machine; for a run in a bucket, ``<run name>-<name>`` in the current folder (read where it is
    asked for, not written back into the store)."""
    if is_remote(str(run_dir)):
        return f"{parent_location(run_dir)[1]}-{name}"
    return str(Path(run_dir) / name)


def write_file(target: str | os.PathLike, data: bytes) -> str:
    """Write ``data`` as the file at ``target`` (a local path: atomically, creating its folders; a URI: one upload)
    through its folder's store; returns ``target``."""
    folder, name = parent_location(target)
    open_store(folder or ".").write_bytes(name, data)  # a bare name: in the current folder
    return str(target)
