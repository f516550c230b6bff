"""An append-only log on a store that has no append (a bucket; memory): numbered entries, each written once and
create-only, merged as they pile up. Reads and writes cost O(the log), never O(the log) per line.

The log at ``KEY`` is the objects ``KEY.d/FFFFFFFFFF-LLLLLLLLLL``: an entry holding whole lines, which covers the
entry numbers ``F`` to ``L``. An append writes the next number ``[n, n]``; when :data:`FAN_OUT` entries of one size
class end the log, they are merged into one entry covering them all (written before its sources are deleted), so a
log of ``r`` lines is read in at most ``FAN_OUT - 1`` entries per size class (about 1 + r/32 requests up to 1024
lines, never more than 31 per class) and each line is uploaded about twice in all up to 1024 lines (once on its
own, once merged). A reader lists the entries and takes, from number 1 on, the entry that reaches furthest at each
point: an entry inside one already taken (a merge's source not deleted yet) is passed over.

**Fencing.** Each entry is written create-only, so two writers of one log collide instead of overwriting. A writer
that starts (the first append or replacement of a log in its process) writes the whole log as it read it, plus its
line, as one entry ``[1, M]`` reaching one past every entry listed: every entry an earlier writer still had in
flight lands inside it and is passed over by readers. An earlier writer that carries on after that collides with
the new one's numbers and gets :class:`~ablate.service.records.store.base.Conflict`: it stops, and can never
overwrite its successor's lines. A replacement (a log cut back) is such an entry too.

**Damage** (an entry deleted by hand, an object of another name in the folder) is read around: the lines of the
entries there, in order, and one warning naming the missing numbers. A log written whole by earlier versions of
ablate (the object ``KEY`` itself) is read while no entry exists, and becomes the first entry at the next append.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from dataclasses import dataclass, field

from ablate.service.records.store.base import CREATE, Conflict, Store

__all__ = ["FAN_OUT", "SegmentLogs"]

_log = logging.getLogger("ablate.service.records.store")

#: How many entries of one size class are merged into one.
FAN_OUT = 32
#: Reads of a log whose entries were merged away between its listing and their download, before giving up.
READ_TRIES = 5
_ENTRY = re.compile(r"^(\d{10})-(\d{10})$")


def folder_of(key: str) -> str:
    """The folder of the log at ``key``'s entries."""
    return f"{key}.d"


def entry_name(first: int, last: int) -> str:
    return f"{first:010d}-{last:010d}"


def _size_class(first: int, last: int) -> int:
    return int(math.log(last - first + 1, FAN_OUT) + 1e-9)


@dataclass
class _Entry:
    first: int
    last: int
    data: bytes


@dataclass
class _Writer:
    """What this process wrote of one log: the entries readers take, with their lines (merged from here)."""

    cover: list[_Entry] = field(default_factory=list)


def cover(names: list[str]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The entries a reader takes among ``names`` (each ``(first, last)``, in order) and the gaps between them
    (numbers no entry covers, ``(first, last)``)."""
    found = sorted(((int(m[1]), int(m[2])) for n in names if (m := _ENTRY.match(n))), key=lambda e: (e[0], -e[1]))
    taken: list[tuple[int, int]] = []
    gaps: list[tuple[int, int]] = []
    at = 1
    for first, last in found:
        if last < at:
            continue  # inside an entry taken: a merge's source
        if first < at:
            continue  # reaching past one taken from inside it: not written by ablate, passed over
        if first > at:
            gaps.append((at, first - 1))
        taken.append((first, last))
        at = last + 1
    return taken, gaps


class SegmentLogs:
    """The logs of one store kept as entries (see the module). One per store: it remembers, per log, what this
    process wrote, so that an append is one PUT."""

    def __init__(self, store: Store):
        self.store = store
        self._writers: dict[str, _Writer] = {}
        self._mutex = threading.Lock()

    # ------------------------------------------------------------------ reading
    def _read(self, key: str) -> list[_Entry] | None:
        """The entries a reader takes, with their lines; None when the log does not exist."""
        folder = folder_of(key)
        for _ in range(READ_TRIES):
            taken, gaps = cover(self.store.list(folder, dirs=False))
            if not taken:
                legacy = self.store.get(key)
                return None if legacy is None else [_Entry(0, 0, legacy.data)]
            entries = []
            for first, last in taken:
                got = self.store.get(f"{folder}/{entry_name(first, last)}")
                if got is None:
                    break  # merged away since the listing: list again
                entries.append(_Entry(first, last, got.data))
            else:
                if gaps:
                    missing = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in gaps)
                    _log.warning("the log %s misses its entries %s (deleted?); read the rest", self.store.join(key),
                                 missing)  # fmt: skip
                return entries
        raise OSError(f"{self.store.join(key)}: its entries changed during each of {READ_TRIES} reads")

    def read(self, key: str) -> bytes | None:
        """The log's lines, or None when there is no log at ``key``."""
        entries = self._read(key)
        return None if entries is None else b"".join(e.data for e in entries)

    def tail(self, key: str) -> bytes | None:
        """The log's last entry (whole lines, the last one among them), or None when there is no log."""
        entries = self._read(key)
        if entries is None:
            return None
        for entry in reversed(entries):
            if entry.data:
                return entry.data
        return b""

    # ------------------------------------------------------------------ writing
    def append(self, key: str, line: bytes) -> None:
        """Add ``line`` (whole lines, ending with a newline) to the log: one create-only PUT of the next entry (a
        log this process has not written yet: one entry holding all of it); :class:`Conflict` when another writer
        took that number (this one was superseded: it must stop)."""
        with self._mutex:
            writer = self._writers.get(key)
            if writer is None:
                self._start(key, None, line)
                return
            at = writer.cover[-1].last + 1 if writer.cover else 1
            self._put(key, at, at, line)
            writer.cover.append(_Entry(at, at, line))
            self._merge(key, writer)

    def replace(self, key: str, data: bytes) -> None:
        """Make ``data`` the whole log: one entry reaching past every entry there (see the module)."""
        with self._mutex:
            self._start(key, data, b"")

    def _start(self, key: str, data: bytes | None, line: bytes) -> None:
        """Write the log as one entry ``[1, M]``: ``data`` (None: the log as read now) followed by ``line``."""
        folder = folder_of(key)
        names = self.store.list(folder, dirs=False)
        if data is None:
            data = self.read(key) or b""
        numbered = [(int(m[1]), int(m[2])) for n in names if (m := _ENTRY.match(n))]
        reach = max((last for _, last in numbered), default=0) + 1
        writer = self._writers.get(key)
        if writer is not None and writer.cover:
            reach = max(reach, writer.cover[-1].last + 1)
        self._put(key, 1, reach, data + line)
        self._writers[key] = _Writer([_Entry(1, reach, data + line)])
        stale = [f"{folder}/{entry_name(a, b)}" for a, b in numbered if (a, b) != (1, reach)]
        self._delete(stale)
        if self.store.get(key) is not None:
            self.store.delete(key)  # the whole log of an earlier version, now the first entry

    def _put(self, key: str, first: int, last: int, data: bytes) -> None:
        try:
            self.store.put(f"{folder_of(key)}/{entry_name(first, last)}", data, CREATE)
        except Conflict:
            self._writers.pop(key, None)
            raise Conflict(self.store.join(key), f"another writer wrote its entry {first}-{last} first") from None

    def _merge(self, key: str, writer: _Writer) -> None:
        """Merge the last :data:`FAN_OUT` entries while they are of one size class (as a binary counter carries)."""
        while len(writer.cover) >= FAN_OUT:
            run = writer.cover[-FAN_OUT:]
            if len({_size_class(e.first, e.last) for e in run}) != 1:
                return
            merged = _Entry(run[0].first, run[-1].last, b"".join(e.data for e in run))
            self._put(key, merged.first, merged.last, merged.data)
            writer.cover[-FAN_OUT:] = [merged]
            self._delete([f"{folder_of(key)}/{entry_name(e.first, e.last)}" for e in run])

    def _delete(self, keys: list[str]) -> None:
        """Remove merged or superseded entries; a failure leaves them, to be passed over by readers."""
        try:
            self.store.delete_many(keys)
        except OSError as exc:
            _log.warning("could not remove %d merged entries of a log (%s); readers pass over them", len(keys), exc)
