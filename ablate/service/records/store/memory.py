"""A run directory in this process's memory: :class:`MemoryStore` (``memory://name``), for tests and for a
researcher's notebook. Every ``memory://name`` of one process is the same store; folders are implicit (a prefix of
some file's key), as on object storage. Conditional puts are exact under one mutex."""

from __future__ import annotations

import builtins
import itertools
import threading
from typing import ClassVar

from ablate.service.records.store.base import CREATE, Got, Match, PutMode, key_of
from ablate.service.records.store.bucket import BucketStore

__all__ = ["MemoryStore"]


class MemoryStore(BucketStore):
    """Files held in memory under ``memory://NAME``; one shared dictionary per name in a process."""

    _files: ClassVar[dict[str, dict[str, Got]]] = {}
    _mutex: ClassVar[threading.Lock] = threading.Lock()
    _versions: ClassVar[itertools.count] = itertools.count(1)

    def __init__(self, uri: str):
        """``uri``: ``memory://NAME`` (a path after the name is part of it)."""
        if not uri.startswith("memory://"):
            raise ValueError(f"not a memory store's URI: {uri!r}")
        self.uri = uri.rstrip("/")
        with self._mutex:
            self.files = self._files.setdefault(self.uri, {})

    def __getstate__(self) -> dict:
        # A copy (pickled) is the same store as every memory://NAME of the process it lands in, not a snapshot.
        return {k: v for k, v in super().__getstate__().items() if k != "files"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        with self._mutex:
            self.files = self._files.setdefault(self.uri, {})

    def join(self, *parts: str) -> str:
        key = key_of("/".join(parts), root_ok=True)
        return f"{self.uri}/{key}" if key else self.uri

    def get(self, key: str) -> Got | None:
        with self._mutex:
            return self.files.get(key_of(key))

    def put(self, key: str, data: bytes, mode: PutMode = "overwrite") -> str:
        key = key_of(key)
        with self._mutex:
            there = self.files.get(key)
            if (mode == CREATE and there is not None) or (
                isinstance(mode, Match) and (there is None or there.version != mode.version)
            ):
                raise self.conflict(key, mode)
            version = str(next(self._versions))
            self.files[key] = Got(bytes(data), version)
            return version

    def delete(self, key: str) -> None:
        with self._mutex:
            self.files.pop(key_of(key), None)

    def delete_tree(self, prefix: str) -> None:
        start = key_of(prefix) + "/"
        with self._mutex:
            for key in [k for k in self.files if k.startswith(start)]:
                del self.files[key]

    def list(self, prefix: str = "", *, dirs: bool) -> builtins.list[str]:
        start = key_of(prefix, root_ok=True)
        start = start + "/" if start else ""
        with self._mutex:
            below = [k[len(start) :] for k in self.files if k.startswith(start)]
        return sorted({k.split("/", 1)[0] for k in below if ("/" in k) == dirs})

    def _keys(self, prefix: str) -> builtins.list[str]:
        with self._mutex:
            return [k for k in self.files if k.startswith(prefix)]

    def exists(self, key: str) -> bool:
        key = key_of(key, root_ok=True)
        with self._mutex:
            return key in self.files or any(k.startswith(key + "/") or not key for k in self.files)
