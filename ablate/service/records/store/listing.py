"""A scan: every file under one folder of a store at one moment (:meth:`~ablate.service.records.store.base.Store.
scan`), so that a reader of many files asks the store only for the ones there. In a bucket a scan is one LIST a
thousand keys, where reading a run file by file costs a LIST per folder and a GET per file that may not exist
(``ablate status`` of a finished run: a trial's error and stopped files, its log's entries).

A listing is a snapshot: a file written after the scan is not in it. A reader takes it for what it is (a status
at one moment); a writer trusts it only for the files no other process writes while it holds the run's lock.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable

__all__ = ["Listing"]


class Listing:
    """The files (keys, in the scanning store's terms) under the folder ``prefix`` (``""``: the root) at one
    moment, and the folders that hold them (on disk also the empty ones)."""

    def __init__(self, prefix: str, files: Iterable[str], folders: Iterable[str] = ()):
        self.prefix = prefix.strip("/")
        self.files = frozenset(files)
        self._children: dict[str, tuple[set[str], set[str]]] = {}  # folder -> (its files' names, its folders')
        for key in self.files:
            self._add(key, file=True)
        for folder in folders:
            self._add(folder.strip("/"), file=False)

    def _add(self, key: str, *, file: bool) -> None:
        parent, _, name = key.rpartition("/")
        self._children.setdefault(parent, (set(), set()))[0 if file else 1].add(name)
        while parent:  # each folder above is a folder of its own parent
            parent, _, name = parent.rpartition("/")
            folders = self._children.setdefault(parent, (set(), set()))[1]
            if name in folders:
                break
            folders.add(name)

    def covers(self, key: str) -> bool:
        """Whether ``key`` is inside the scanned folder (what the listing says of it is the whole truth then)."""
        key = key.strip("/")
        return not self.prefix or key == self.prefix or key.startswith(self.prefix + "/")

    def has(self, key: str) -> bool:
        """Whether a file is at ``key``."""
        return key.strip("/") in self.files

    def names(self, folder: str = "", *, dirs: bool) -> builtins.list[str]:
        """Sorted names of the files (or folders, ``dirs``) directly in ``folder``, as
        :meth:`~ablate.service.records.store.base.Store.list` gives them."""
        files, folders = self._children.get(folder.strip("/"), ((), ()))
        return sorted(folders if dirs else files)

    def __len__(self) -> int:
        return len(self.files)

    def __repr__(self) -> str:
        return f"Listing({self.prefix!r}, {len(self.files)} files)"
