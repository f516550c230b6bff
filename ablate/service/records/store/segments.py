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
line, as one entry ``[1, M]`` reaching one past every entry listed: an entry an earlier writer still had in flight,
or writes next, lands inside it and is passed over by readers; once the new writer has appended, the earlier one's
next append collides with its numbers and gets :class:`~ablate.service.records.store.base.Conflict`: it stops. It
can never overwrite its successor's lines. A replacement (a log cut back) is such an entry too. A writer reads a log
it writes from what it wrote (the numbers of its entries, and the lines of the small ones), so an append is one PUT
and a read of its own log lists nothing; every other process lists.

**Damage** (an entry deleted by hand, an object of another name in the folder) is read around: the lines of the
entries there, in order, and one warning naming the missing numbers. A log written whole by earlier versions of
ablate (the object ``KEY`` itself) is read while no entry exists, and becomes the first entry at the next append.
"""

from __future__ import annotations

import collections
import logging
import math
import re
import threading
from dataclasses import dataclass, field

from ablate.service.records.store.base import CREATE, Conflict, Store
from ablate.service.records.store.listing import Listing

__all__ = ["FAN_OUT", "SegmentLogs"]

_log = logging.getLogger("ablate.service.records.store")

#: How many entries of one size class are merged into one.
FAN_OUT = 32
#: A finished log in more entries than this is written again as one (a PUT and a DELETE, to save its readers a GET
#: an entry from then on); one in fewer is left as it is.
COMPACT_OVER = 2
#: Reads of a log whose entries were merged away between its listing and their download, before giving up.
READ_TRIES = 5
#: How many logs' last reads a process remembers (the lines its first write to each starts from).
READS_KEPT = 256
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
    data: bytes | None  # None: not kept in memory (read back when needed)


@dataclass
class _Seen:
    """What a read of a log saw: the furthest entry number listed, the entries' names, the entries it took (None:
    no log), and whether the log was a whole object of an earlier version."""

    reach: int
    names: list[str]
    entries: list[_Entry] | None
    legacy: bool


@dataclass
class _Writer:
    """What this process wrote of one log: the entries readers take, with their lines (merged from here)."""

    cover: list[_Entry] = field(default_factory=list)


def _reach(names: list[str]) -> tuple[int, list[str]]:
    """The furthest entry number among ``names`` (0: none) and the entries' names."""
    found = [(n, int(m[2])) for n in names if (m := _ENTRY.match(n))]
    return max((last for _, last in found), default=0), [n for n, _ in found]


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
    process wrote (the entries' numbers, and the lines of the small ones it will merge soon), so that an append is
    one PUT and a read of a log it writes lists nothing."""

    def __init__(self, store: Store):
        self.store = store
        self._writers: dict[str, _Writer] = {}
        # key -> what this process's last read of a log it does not write saw (the newest READS_KEPT logs)
        self._listed: collections.OrderedDict[str, _Seen] = collections.OrderedDict()
        #: Whether this process owns the store's logs (it holds the run's lease: no other process writes them), so
        #: that a log read once is read again from memory until this process writes it
        self.owned = False
        #: While owned: the store's last scan, which says which logs exist and in which entries (no LIST to read one)
        self.index: Listing | None = None
        self._mutex = threading.RLock()

    def own(self, owned: bool) -> None:
        """Say that this process owns the store's logs from now on (it took the run's lock), or no longer does.
        Either way what it read or wrote before is forgotten: reads made before it owned them may be stale (another
        process wrote since), and a log it wrote in an earlier ownership may have been written by another driver
        since, so each log is read again and its first write is a new writer's (the fence of the module)."""
        with self._mutex:
            self.owned = owned
            self.index = None
            self._listed.clear()
            self._writers.clear()

    def learn(self, listing: Listing) -> None:
        """A scan of the store: while this process owns the logs, the logs it covers are read without a LIST."""
        with self._mutex:
            if self.owned and (self.index is None or not listing.prefix or listing.covers(self.index.prefix)):
                self.index = listing

    # ------------------------------------------------------------------ reading
    def _data(self, key: str, entry: _Entry) -> bytes:
        """An entry's lines: kept, or read (None when it is gone: merged away since it was listed)."""
        if entry.data is not None:
            return entry.data
        got = self.store.get(f"{folder_of(key)}/{entry_name(entry.first, entry.last)}")
        if got is None:
            raise _Gone(f"{self.store.join(folder_of(key), entry_name(entry.first, entry.last))}: gone")
        return got.data

    def _read(self, key: str, listing: Listing | None = None, *, fresh: bool = False) -> list[_Entry] | None:
        """The entries a reader takes, with their lines; None when the log does not exist. A log this process
        writes is read from what it wrote (its entries' numbers: it would have collided with any other writer).
        ``listing`` (else, while this process owns the logs, its last scan): the entries' names without a LIST.
        ``fresh``: listed now, whatever this process wrote, read or scanned before."""
        with self._mutex:
            writer = None if fresh else self._writers.get(key)
            if writer is not None:
                return [_Entry(e.first, e.last, self._data(key, e)) for e in writer.cover]
            if self.owned and key in self._listed and not fresh:
                self._listed.move_to_end(key)
                return self._listed[key].entries
            if listing is None and self.owned and not fresh:
                listing = self.index
        folder = folder_of(key)
        if listing is not None and not listing.covers(key):
            listing = None
        for _ in range(READ_TRIES):
            names = self.store.list(folder, dirs=False) if listing is None else listing.names(folder, dirs=False)
            taken, gaps = cover(names)
            reach, numbered = _reach(names)
            if not taken:
                legacy = self.store.get(key) if listing is None or listing.has(key) else None
                entries = None if legacy is None else [_Entry(0, 0, legacy.data)]
                self._remember(key, _Seen(reach, numbered, entries, legacy is not None))
                return entries
            try:
                entries = [_Entry(a, b, self._data(key, _Entry(a, b, None))) for a, b in taken]
            except _Gone:
                listing = None  # merged away since the listing: list again
                continue
            if gaps:
                missing = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in gaps)
                _log.warning("the log %s misses its entries %s (deleted?); read the rest", self.store.join(key),
                             missing)  # fmt: skip
            self._remember(key, _Seen(reach, numbered, entries, False))
            return entries
        raise OSError(f"{self.store.join(key)}: its entries changed during each of {READ_TRIES} reads")

    def _remember(self, key: str, seen: _Seen) -> None:
        with self._mutex:
            self._listed[key] = seen
            self._listed.move_to_end(key)
            while len(self._listed) > READS_KEPT:
                self._listed.popitem(last=False)

    def read(self, key: str, listing: Listing | None = None) -> bytes | None:
        """The log's lines, or None when there is no log at ``key``."""
        entries = self._read(key, listing)
        return None if entries is None else b"".join(e.data for e in entries)

    def tail(self, key: str, listing: Listing | None = None) -> bytes | None:
        """The log's last entry (whole lines, the last one among them), or None when there is no log."""
        entries = self._read(key, listing)
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

    def compact(self, key: str) -> None:
        """Write a log this process writes as one entry, when it is in more than :data:`COMPACT_OVER` (see
        :meth:`replace`); a log it does not write is left as it is."""
        with self._mutex:
            writer = self._writers.get(key)
            if writer is not None and len(writer.cover) > COMPACT_OVER:
                self._start(key, self.read(key), b"")

    def _start(self, key: str, data: bytes | None, line: bytes) -> None:
        """Write the log as one entry ``[1, M]``: ``data`` (None: the log as last read in this process) followed by
        ``line``. ``M`` reaches past every entry this process listed (at its last read of the log, after it took
        the run's lease: an earlier writer's entry still in flight then lands inside ``[1, M]``). A new writer
        first claims the number ``M`` with an empty entry ``[M, M]`` (create-only): an earlier writer's next append
        takes that number and collides. Should another writer have taken ``M`` since the read, the log is read
        again (its lines kept) and a further number claimed."""
        folder = folder_of(key)
        writer = self._writers.get(key)
        for _ in range(READ_TRIES):
            if writer is None:
                if key not in self._listed:
                    self._read(key)
                seen = self._listed.pop(key)
                reach, stale, legacy = seen.reach, seen.names, seen.legacy
                whole = (b"".join(e.data or b"" for e in seen.entries or []) if data is None else data) + line
            else:  # a replacement (an append to a log this process writes is one entry)
                whole = (self.read(key) if data is None else data) + line
                reach, stale, legacy = writer.cover[-1].last, [entry_name(e.first, e.last) for e in writer.cover], False
            at = reach + 1
            try:
                if writer is None and at > 1:
                    self.store.put(f"{folder}/{entry_name(at, at)}", b"", CREATE)  # the claim
                self.store.put(f"{folder}/{entry_name(1, at)}", whole, CREATE)
            except Conflict:
                if writer is not None:
                    self._writers.pop(key, None)
                    raise Conflict(self.store.join(key), f"another writer wrote its entry 1-{at} first") from None
                self._read(key, fresh=True)  # another writer took the number since the read: read the log again
                continue
            break
        else:
            raise Conflict(self.store.join(key), f"other writers took its next entry in each of {READ_TRIES} tries")
        self._writers[key] = _Writer([_Entry(1, at, whole if at < FAN_OUT else None)])
        # the claim stays (readers pass over it, inside [1, M]) until the next writer: deleted, it would free the
        # number for the earlier writer's next append, which would land unseen instead of colliding
        self._delete([f"{folder}/{name}" for name in stale if name != entry_name(1, at)] + [key] * legacy)

    def _put(self, key: str, first: int, last: int, data: bytes) -> None:
        try:
            self.store.put(f"{folder_of(key)}/{entry_name(first, last)}", data, CREATE)
        except Conflict:
            self._writers.pop(key, None)
            raise Conflict(self.store.join(key), f"another writer wrote its entry {first}-{last} first") from None

    def _merge(self, key: str, writer: _Writer) -> None:
        """Merge the last :data:`FAN_OUT` entries while they are of one size class (as a binary counter carries).
        Only the lines of the smallest entries are kept in memory; larger ones are read back to be merged."""
        while len(writer.cover) >= FAN_OUT:
            run = writer.cover[-FAN_OUT:]
            if len({_size_class(e.first, e.last) for e in run}) != 1:
                return
            data = b"".join(self._data(key, e) for e in run)
            self._put(key, run[0].first, run[-1].last, data)
            writer.cover[-FAN_OUT:] = [_Entry(run[0].first, run[-1].last, None)]
            self._delete([f"{folder_of(key)}/{entry_name(e.first, e.last)}" for e in run])

    def _delete(self, keys: list[str]) -> None:
        """Remove merged or superseded entries; a failure leaves them, to be passed over by readers."""
        if not keys:
            return
        try:
            self.store.delete_many(keys)
        except OSError as exc:
            _log.warning("could not remove %d merged entries of a log (%s); readers pass over them", len(keys), exc)


class _Gone(OSError):
    """An entry listed a moment ago is gone (merged away: a reader lists again; deleted: a writer fails)."""
