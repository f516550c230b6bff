"""Where a run directory's files live: a :class:`Store` over keys relative to the run directory, on local disk
(:class:`LocalStore`) or at a pyarrow file-system URI (:class:`ArrowStore`: ``s3://``, ``gs://``); :func:`open_store`
picks one for a path or URI. A key is a ``/``-separated path under the root (``trial_x/params.json``; ``""``: the
root, where a folder is meant). Every write is of a whole file, which a reader sees whole or not at all: on disk a
temporary beside it renamed into place (:func:`ablate.files.atomic_write`), on object storage one upload (S3 and GCS
replace an object atomically). No append, no rename: a log is rewritten whole. A failed write or delete raises
:class:`ablate.files.WriteError` naming the file (its path, or its object's URI).
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import os
import shutil
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path

from ablate.files import TEMP_FILE, WriteError, atomic_write, is_remote, local_path

__all__ = ["ArrowStore", "FolderStore", "LocalStore", "Store", "as_store", "open_store"]

#: Reads of an object that is being replaced, before :meth:`ArrowStore.read_bytes` gives up.
READ_TRIES = 5
#: pyarrow file systems whose folders are implicit (a prefix of some object's key): nothing to create before a write.
_IMPLICIT_FOLDERS = ("s3", "gcs")


def _key(key: str, *, root_ok: bool = False) -> str:
    """``key`` normalised (no empty parts); ValueError for ``.``/``..`` parts, or for the root unless ``root_ok``."""
    parts = [p for p in str(key).split("/") if p]
    if any(p in (".", "..") for p in parts) or not (parts or root_ok):
        raise ValueError(f"not a key under the store's root: {key!r}")
    return "/".join(parts)


class Store(ABC):
    """A run directory's files under one root. Keys are ``/``-separated paths relative to it."""

    #: The root as the user named it (a path, ``file://…``, or ``s3://bucket/prefix?query``).
    uri: str

    @abstractmethod
    def join(self, *parts: str) -> str:
        """The location of the key ``parts`` make, as messages name it: a local path, or the object's URI (with
        the root URI's query kept at its end). No parts: the root's."""

    @abstractmethod
    def read_bytes(self, key: str) -> bytes | None:
        """The file's content, or None when there is no file at ``key`` (nothing there, or a folder)."""

    def read_text(self, key: str) -> str | None:
        """The file's UTF-8 text, or None when there is no file at ``key``."""
        data = self.read_bytes(key)
        return None if data is None else data.decode("utf-8")

    @abstractmethod
    def write_bytes(self, key: str, data: bytes) -> None:
        """Replace the file at ``key`` by ``data`` (creating it and its folders): a reader sees the old content or
        the new, never part of one. :class:`~ablate.files.WriteError` naming the file when it cannot be written."""

    def write_text(self, key: str, text: str) -> None:
        """:meth:`write_bytes` of ``text`` in UTF-8."""
        self.write_bytes(key, text.encode("utf-8"))

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

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


class LocalStore(Store):
    """Files under a local folder ``root``, written as the record writes them (:func:`ablate.files.atomic_write`)."""

    def __init__(self, root: str | os.PathLike, *, uri: str | None = None):
        """``uri``: the root as the user named it (default: ``root``), e.g. ``file:///…``."""
        self.root, self.uri = Path(root), str(root) if uri is None else uri

    def path(self, key: str = "") -> Path:
        """The local path of ``key`` (``""``: the root)."""
        key = _key(key, root_ok=True)
        return self.root / key if key else self.root

    def join(self, *parts: str) -> str:
        """The local path of the key ``parts`` make."""
        return str(self.path("/".join(parts)))

    def read_bytes(self, key: str) -> bytes | None:
        """The file's content, or None when there is no file at ``key``."""
        try:
            return self.path(_key(key)).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def write_bytes(self, key: str, data: bytes) -> None:
        """Write a temporary beside the file and rename it into place, creating the folders first."""
        path = self.path(_key(key))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WriteError.of(path, exc) from exc
        atomic_write(path, lambda tmp: tmp.write_bytes(data))

    def delete(self, key: str) -> None:
        """Remove the file at ``key``; a missing one is fine."""
        path = self.path(_key(key))
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            if os.path.lexists(path):  # a missing file on a read-only file system is EROFS, not ENOENT
                raise WriteError.of(path, exc) from exc

    def delete_tree(self, prefix: str) -> None:
        """Remove the folder ``prefix`` and everything under it; a missing one is fine."""
        path = self.path(_key(prefix))
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


class ArrowStore(Store):
    """Objects under a pyarrow file-system URI (``s3://bucket/prefix``, ``gs://…``; options such as
    ``endpoint_override=…&scheme=http`` in its query, as Ray takes them). Folders are implicit on object storage;
    on file systems that have real ones (``mock://``, ``hdfs://``) a write creates its folder first."""

    def __init__(self, uri: str):
        """``uri``: the run directory's URI."""
        import pyarrow.fs as pafs

        self.uri = str(uri)
        self.fs, root = pafs.FileSystem.from_uri(_with_s3_defaults(self.uri))
        self.root: str = root.rstrip("/")
        base, mark, query = self.uri.partition("?")
        self._base, self._query = base.rstrip("/"), mark + query

    def path(self, key: str = "") -> str:
        """pyarrow's path of ``key`` (``""``: the root): ``bucket/prefix/key``."""
        key = _key(key, root_ok=True)
        return f"{self.root}/{key}" if key else self.root

    def join(self, *parts: str) -> str:
        """The URI of the key ``parts`` make: the root's URI with the key before its query."""
        key = _key("/".join(parts), root_ok=True)
        return f"{self._base}/{key}{self._query}" if key else self.uri

    def read_bytes(self, key: str) -> bytes | None:
        """The object's content, or None when there is none at ``key``.

        pyarrow reads an S3 object as a HEAD, then a GET of the length the HEAD gave: an object replaced in between
        by one of another length comes back cut short or padded with zero bytes (seen against moto, about one read
        in seven while the object is rewritten back to back). So the read is checked against the object's size
        after it (one more HEAD) and made again, after a short pause, when they differ, up to :data:`READ_TRIES`
        times. The check is sound for objects whose versions differ in length in one direction, as a result log
        that only grows (a replacement of the same length is read whole: one GET sees one version); a cut log
        back to the length read, within the read's ~10 ms, would pass it."""
        import pyarrow.fs as pafs

        path = self.path(_key(key))
        for attempt in range(READ_TRIES):
            if attempt:
                time.sleep(0.02 * 2**attempt)
            try:
                with self.fs.open_input_stream(path, compression=None) as f:
                    data = f.read()
            except FileNotFoundError:
                return None
            except OSError:  # a folder, on file systems that have them ("Not a regular file"), or a real failure
                with contextlib.suppress(OSError):
                    if self.fs.get_file_info(path).type != pafs.FileType.File:
                        return None
                raise
            info = self.fs.get_file_info(path)
            if info.type != pafs.FileType.File:
                return None  # deleted since
            if info.size == len(data):
                return data
        raise OSError(f"{self.join(key)}: changed size during each of {READ_TRIES} reads")

    def write_bytes(self, key: str, data: bytes) -> None:
        """One upload of the whole object; its folder is created first where folders are real."""
        path = self.path(_key(key))
        try:
            if self.fs.type_name not in _IMPLICIT_FOLDERS:
                self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
            with self.fs.open_output_stream(path) as f:
                f.write(data)
        except OSError as exc:
            raise WriteError.of(self.join(key), exc) from exc

    def delete(self, key: str) -> None:
        """Remove the object at ``key``; a missing one is fine."""
        with self._deleting(key) as path:
            self.fs.delete_file(path)

    def delete_tree(self, prefix: str) -> None:
        """Remove every object under ``prefix/`` (and its folder); a missing one is fine."""
        with self._deleting(prefix) as path:
            self.fs.delete_dir(path)

    @contextlib.contextmanager
    def _deleting(self, key: str) -> Iterator[str]:
        """The path of ``key`` to delete; a missing one is fine, a failure is a WriteError naming its URI."""
        path = self.path(_key(key))
        try:
            yield path
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise WriteError.of(self.join(key), exc) from exc

    def list(self, prefix: str = "", *, dirs: bool) -> builtins.list[str]:
        """Sorted names of the objects (or folders, ``dirs``) directly under ``prefix`` (on S3 one LIST per 1000)."""
        import pyarrow.fs as pafs

        kind = pafs.FileType.Directory if dirs else pafs.FileType.File
        selector = pafs.FileSelector(self.path(prefix), allow_not_found=True)
        try:
            infos = self.fs.get_file_info(selector)
        except NotADirectoryError:
            return []
        return sorted(i.base_name for i in infos if i.type == kind)

    def exists(self, key: str) -> bool:
        """Whether an object or a folder (a prefix of some object's key) is at ``key``."""
        import pyarrow.fs as pafs

        return self.fs.get_file_info(self.path(key)).type != pafs.FileType.NotFound


def _with_s3_defaults(uri: str) -> str:
    """``uri`` with ``allow_delayed_open=true`` in the query of an ``s3://`` URI that does not set it: pyarrow then
    sends a small write as one PUT instead of a multipart upload (3 requests), so a report costs 4 requests, not 6
    (benchmarks/object_store.py). The run's own URI, as messages name it, is left as the user gave it."""
    if not uri.startswith("s3://") or "allow_delayed_open=" in uri:
        return uri
    return uri + ("&" if "?" in uri else "?") + "allow_delayed_open=true"


def open_store(uri_or_path: str | os.PathLike) -> Store:
    """The store of a run directory: an :class:`ArrowStore` for a remote URI (:func:`ablate.files.is_remote`),
    else a :class:`LocalStore` over its local path (``file://`` removed)."""
    if is_remote(uri_or_path):
        return ArrowStore(str(uri_or_path))
    return LocalStore(local_path(uri_or_path), uri=str(uri_or_path))


def as_store(run_dir: str | os.PathLike | Store) -> Store:
    """The store of a run directory: ``run_dir`` itself, or :func:`~ablate.service.records.store.open_store`'s (one
    per URI in a process for a remote one: a Trainable makes its record once, the driver one per report)."""
    if isinstance(run_dir, Store):
        return run_dir
    return _remote_store(str(run_dir)) if is_remote(run_dir) else open_store(run_dir)


@functools.lru_cache(maxsize=16)
def _remote_store(uri: str) -> Store:
    return open_store(uri)


class FolderStore(Store):
    """The files under one folder of another store, with keys relative to that folder: a trial's folder of a run's
    store on object storage, as the checkpoint functions take it (:mod:`ablate.service.records.trial`)."""

    def __init__(self, parent: Store, folder: str):
        self.parent, self.folder, self.uri = parent, folder, parent.join(folder)

    def _at(self, key: str, *, root_ok: bool = False) -> str:
        parts = [p for p in str(key).split("/") if p]
        if not (parts or root_ok):
            raise ValueError(f"not a key under the store's root: {key!r}")
        return "/".join([self.folder, *parts])  # "..": the parent's keys refuse it

    def join(self, *parts: str) -> str:
        return self.parent.join(self.folder, *parts)

    def read_bytes(self, key: str) -> bytes | None:
        return self.parent.read_bytes(self._at(key))

    def write_bytes(self, key: str, data: bytes) -> None:
        self.parent.write_bytes(self._at(key), data)

    def delete(self, key: str) -> None:
        self.parent.delete(self._at(key))

    def delete_tree(self, prefix: str) -> None:
        self.parent.delete_tree(self._at(prefix))

    def list(self, prefix: str = "", *, dirs: bool) -> builtins.list[str]:
        return self.parent.list(self._at(prefix, root_ok=True), dirs=dirs)

    def exists(self, key: str) -> bool:
        return self.parent.exists(self._at(key, root_ok=True))
