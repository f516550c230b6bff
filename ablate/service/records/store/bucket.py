"""What every store without append or locks shares (a bucket, ``s3://`` and ``gs://``; ``memory://``):
:class:`BucketStore`, whose logs are numbered entries written create-only and merged
(:mod:`ablate.service.records.store.segments`) and whose lock is a lease taken and renewed by conditional puts
(:mod:`ablate.service.records.store.lease`). A backend gives the whole-file operations of
:class:`~ablate.service.records.store.base.Store`; this class builds the rest on them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ablate.service.records.store.base import Store, key_of
from ablate.service.records.store.lease import Lease, holder
from ablate.service.records.store.listing import Listing
from ablate.service.records.store.segments import SegmentLogs, folder_of

__all__ = ["BucketStore"]


class BucketStore(Store):
    """A store whose logs are entries and whose lock is a lease (see the module)."""

    @functools.cached_property
    def _segments(self) -> SegmentLogs:
        return SegmentLogs(self)

    def __getstate__(self) -> dict[str, Any]:
        # A store travels pickled (to Ray's workers, in Tune's snapshots of a scheduler holding a RunRecord): its
        # log writers (a mutex, and what this process wrote) stay here; the copy starts as a new writer.
        return {k: v for k, v in self.__dict__.items() if k != "_segments"}

    def _keys(self, prefix: str) -> list[str]:
        """Every key that starts with ``prefix`` (one LIST a thousand in a bucket)."""
        raise NotImplementedError

    def scan(self, prefix: str = "") -> Listing:
        """Every object under ``prefix``, from one listing without a delimiter (a request a thousand objects). While
        this process owns the store's logs, the scan also tells it which logs exist and in which entries, until it
        writes them itself (:class:`~ablate.service.records.store.segments.SegmentLogs`)."""
        prefix = key_of(prefix, root_ok=True)
        listing = Listing(prefix, self._keys(f"{prefix}/" if prefix else ""))
        self._segments.learn(listing)
        return listing

    def own_logs(self, owned: bool) -> None:
        self._segments.own(owned)

    def has_log(self, key: str) -> bool:
        """Whether the log's entries' folder is there, or a log an earlier version of ablate wrote whole."""
        return self.exists(folder_of(key)) or self.exists(key)

    def read_log(self, key: str, listing: Listing | None = None) -> bytes | None:
        return self._segments.read(key, listing)

    def log_tail(self, key: str, listing: Listing | None = None) -> bytes | None:
        return self._segments.tail(key, listing)

    def append_log(self, key: str, lines: bytes) -> None:
        self._segments.append(key, lines)

    def replace_log(self, key: str, data: bytes) -> None:
        self._segments.replace(key, data)

    def compact_log(self, key: str) -> None:
        self._segments.compact(key)

    def lock(
        self, key: str, *, ttl_s: float, owner: dict | None = None, dead: Callable[[dict], bool] | None = None
    ) -> Lease:
        """A :class:`~ablate.service.records.store.lease.Lease` at ``key``."""
        return Lease(self, key, ttl_s=ttl_s, owner=owner, dead=dead)

    def lock_holder(self, key: str, *, ttl_s: float) -> dict | None:
        """Who holds the lease at ``key`` as one read tells (:func:`ablate.service.records.store.lease.holder`)."""
        return holder(self, key, ttl_s=ttl_s)
