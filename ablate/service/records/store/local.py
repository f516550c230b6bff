"""A run directory on a local (or NFS) disk: :class:`LocalStore`.

A whole-file write is a temporary beside the file renamed into place (:func:`ablate.files.atomic_write`). A
version is a hash of the content (as S3's ETag is). A :data:`~ablate.service.records.store.base.CREATE` put links
its temporary into place (``link`` fails when a file is there: atomic); a
:class:`~ablate.service.records.store.base.Match` put compares and renames under an ``flock`` of the file's folder,
which every put but a create takes, so a compare and its write are one step for every writer of this store. Its
lock is an ``flock`` (:class:`~ablate.service.records.store.flock.PidLock`), which the kernel releases when its holder
dies.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import hashlib
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from ablate.files import TEMP_FILE, WriteError, sweep_stale_temps
from ablate.service.records.store.base import CREATE, Got, Match, PutMode, Store, key_of
from ablate.service.records.store.flock import PidLock, lock_holder
from ablate.service.records.store.listing import Listing

__all__ = ["LocalStore", "version_of"]


def version_of(data: bytes) -> str:
    """The version of a file's content on disk: a hash of it (equal content, equal version, as S3's ETag)."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class LocalStore(Store):
    """Files under a local folder ``root``."""

    def __init__(self, root: str | os.PathLike, *, uri: str | None = None):
        """``uri``: the root as the user named it (default: ``root``), e.g. ``file:///…``."""
        self.root, self.uri = Path(root), str(root) if uri is None else uri

    def path(self, key: str = "") -> Path:
        """The local path of ``key`` (``""``: the root)."""
        key = key_of(key, root_ok=True)
        return self.root / key if key else self.root

    def join(self, *parts: str) -> str:
        """The local path of the key ``parts`` make."""
        return str(self.path("/".join(parts)))

    def get(self, key: str) -> Got | None:
        """The file's content and version, or None when there is no file at ``key``."""
        try:
            data = self.path(key_of(key)).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        return Got(data, version_of(data))

    def put(self, key: str, data: bytes, mode: PutMode = "overwrite") -> str:
        """Write ``data`` at ``key`` under ``mode`` (see the module) and return its version."""
        path = self.path(key_of(key))
        made = not path.parent.is_dir()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WriteError.of(path, exc) from exc
        try:
            return self._put(key, path, data, mode)
        except BaseException:
            if made:  # a failed write leaves no folder it made (a checkpoint's, on a full disk)
                with contextlib.suppress(OSError):
                    path.parent.rmdir()
            raise

    def _put(self, key: str, path: Path, data: bytes, mode: PutMode) -> str:
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_native_id()}")
        try:
            tmp.write_bytes(data)
            if mode == CREATE:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise self.conflict(key, mode) from None
            else:
                with _folder_locked(path.parent):
                    if isinstance(mode, Match):
                        there = self.get(key)
                        if there is None or there.version != mode.version:
                            raise self.conflict(key, mode)
                    os.replace(tmp, path)
        except OSError as exc:
            raise WriteError.of(path, exc) from exc
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        return version_of(data)

    def delete(self, key: str) -> None:
        """Remove the file at ``key``; a missing one is fine."""
        path = self.path(key_of(key))
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            if os.path.lexists(path):  # a missing file on a read-only file system is EROFS, not ENOENT
                raise WriteError.of(path, exc) from exc

    def delete_tree(self, prefix: str) -> None:
        """Remove the folder ``prefix`` and everything under it; a missing one is fine."""
        path = self.path(key_of(prefix))
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise WriteError.of(path, exc) from exc

    def list(self, prefix: str = "", *, dirs: bool) -> builtins.list[str]:
        """Sorted names of the files (or folders, ``dirs``) directly in folder ``prefix``."""
        try:
            with os.scandir(self.path(prefix)) as entries:
                return sorted(
                    e.name for e in entries if (e.is_dir() if dirs else e.is_file() and not TEMP_FILE.match(e.name))
                )
        except (FileNotFoundError, NotADirectoryError):
            return []

    def exists(self, key: str) -> bool:
        """Whether a file or a folder is at ``key``."""
        return self.path(key).exists()

    def scan(self, prefix: str = "") -> Listing:
        """Every file (but writes' temporaries) and folder under ``prefix``, walked."""
        prefix = key_of(prefix, root_ok=True)
        files, folders = [], []
        for folder, dirnames, filenames in os.walk(self.path(prefix)):
            at = Path(folder).relative_to(self.root).as_posix()
            at = "" if at == "." else f"{at}/"
            folders += [at + d for d in dirnames]
            files += [at + f for f in filenames if not TEMP_FILE.match(f)]
        return Listing(prefix, files, folders)

    # ------------------------------------------------------------------ logs: one file, appended to
    def own_logs(self, owned: bool) -> None:
        """Nothing to remember: a log file is read from the disk each time."""

    def read_log(self, key: str, listing: Listing | None = None) -> bytes | None:
        """The log file's content, or None when there is none: a last line a killed writer cut may end it (readers
        skip it; the next append or a replacement cuts it). ``listing`` is not needed: the disk is read."""
        return self.read_bytes(key)

    def log_tail(self, key: str, listing: Listing | None = None, chunk: int = 1 << 16) -> bytes | None:
        """The log file's last ``chunk`` bytes, cut to whole lines, more when its last whole line is longer."""
        path = self.path(key_of(key))
        try:
            with path.open("rb") as f:
                end = f.seek(0, os.SEEK_END)
                while True:
                    start = max(0, end - chunk)
                    f.seek(start)
                    tail = f.read(end - start)
                    lines = tail[: tail.rfind(b"\n") + 1]
                    if start == 0 or lines.count(b"\n") >= 2:
                        return lines if start == 0 else lines[lines.find(b"\n") + 1 :]
                    chunk *= 2
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def append_log(self, key: str, lines: bytes) -> None:
        """Append ``lines`` to the file (created with its folder), after cutting a last line a killed writer left
        without its newline."""
        path = self.path(key_of(key))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o644), "r+b") as f:
                _cut_torn_line(f)
                f.seek(0, os.SEEK_END)
                f.write(lines)
                f.flush()
        except OSError as exc:
            raise WriteError.of(path, exc) from exc

    def replace_log(self, key: str, data: bytes) -> None:
        """Replace the file whole (a temporary renamed into place)."""
        self.put(key, data)

    def compact_log(self, key: str) -> None:
        """Nothing to do: a log on disk is one file."""

    def linked_out(self, key: str) -> str | None:
        """The target of the folder at ``key`` when it is a symbolic link or resolves outside the root, else None."""
        folder = self.path(key_of(key))
        target = folder.resolve()
        if folder.is_symlink() or not target.is_relative_to(self.root.resolve()):
            return str(target)
        return None

    def local_file(self, key: str) -> Path | None:
        """The file's path: the store is a folder of this machine."""
        return self.path(key_of(key, root_ok=True))

    def probe(self) -> None:
        """The root folder made, and a probe file written in it and removed (a local run's lock is an ``flock``: it
        needs no conditional write); the OSError of what failed."""
        probe = self.root / f".ablate-write-test-{os.getpid()}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe.write_text("ok")
        finally:
            with contextlib.suppress(OSError):
                probe.unlink(missing_ok=True)

    def make_folder(self, key: str) -> None:
        """Create the folder ``key`` (and its parents)."""
        self.path(key_of(key)).mkdir(parents=True, exist_ok=True)

    def sweep_temporaries(self) -> list[str]:
        """Remove the temporaries that writers killed on this machine left (:func:`ablate.files.sweep_stale_temps`);
        the removed files, relative to the root."""
        return sweep_stale_temps(self.root)

    def remove_root_if_empty(self) -> None:
        """Remove the root folder when it is empty."""
        with contextlib.suppress(OSError):
            self.root.rmdir()

    def lock(
        self, key: str, *, ttl_s: float, owner: dict | None = None, dead: Callable[[dict], bool] | None = None
    ) -> PidLock:
        """An ``flock`` on the file at ``key`` (``ttl_s``, ``owner``, ``dead`` unused: the kernel frees a dead holder's
        lock, and a shared disk's ``flock`` is the file server's)."""
        return PidLock(self.path(key_of(key)))

    def lock_holder(self, key: str, *, ttl_s: float) -> dict | None:
        """The live holder of the ``flock`` at ``key`` (:func:`ablate.service.records.store.flock.lock_holder`)."""
        return lock_holder(self.path(key_of(key)))


@contextlib.contextmanager
def _folder_locked(folder: Path) -> Iterator[None]:
    """An exclusive ``flock`` of ``folder`` itself (Linux locks a directory's descriptor as a file's)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _cut_torn_line(f: BinaryIO, chunk: int = 1 << 16) -> None:
    """Drop the last line of the file open as ``f`` (read and write) when it has no newline; reads only the tail."""
    end = f.seek(0, os.SEEK_END)
    if end == 0:
        return
    f.seek(end - 1)
    if f.read(1) == b"\n":
        return
    stop = end
    while stop > 0:
        start = max(0, stop - chunk)
        f.seek(start)
        cut = f.read(stop - start).rfind(b"\n")
        if cut >= 0:
            f.truncate(start + cut + 1)
            return
        stop = start
    f.truncate(0)
