"""Where a run directory's files live: one :class:`Store` interface (:mod:`.base`) over a local disk
(:class:`LocalStore`), a bucket (:class:`CloudStore`: ``s3://``, ``gs://``) or this process's memory
(:class:`MemoryStore`: ``memory://``). :func:`open_store` picks one for a path or URI; above this package nothing
asks which it has. Every write is of a whole file, atomic, and may be conditional (create-only, or only while the
file is the version read): the record's locks and fencing rest on that (:mod:`ablate.service.records.store.lease`).
"""

from __future__ import annotations

import functools
import os

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
    "open_store",
]


def open_store(uri_or_path: str | os.PathLike) -> Store:
    """The store of a run directory: a :class:`CloudStore` for ``s3://`` and ``gs://``, a :class:`MemoryStore` for
    ``memory://``, else a :class:`LocalStore` over its local path (``file://`` removed). ValueError naming the URI
    for any other scheme, or a bucket URI with an option ablate does not read."""
    text = str(uri_or_path)
    if text.startswith("memory://"):
        return MemoryStore(text)
    if is_remote(text):
        return CloudStore(text)
    return LocalStore(local_path(uri_or_path), uri=text)


def as_store(run_dir: str | os.PathLike | Store) -> Store:
    """The store of a run directory: ``run_dir`` itself, or :func:`open_store`'s (one per URI in a process for a
    remote one: a Trainable makes its record once, the driver one per report)."""
    if isinstance(run_dir, Store):
        return run_dir
    return _remote_store(str(run_dir)) if is_remote(run_dir) else open_store(run_dir)


@functools.lru_cache(maxsize=16)
def _remote_store(uri: str) -> Store:
    return open_store(uri)
