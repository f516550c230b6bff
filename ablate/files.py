"""Files written so that a failure leaves nothing behind, and read so that a bad one is one clear line.

:func:`atomic_write` writes a temporary beside its target and renames it into place: a reader sees the old
file or the new one, and a write that fails (a full disk, a read-only folder) removes its temporary and raises
:class:`WriteError`, ``cannot write <file> (<reason>)``. A writer killed outright cannot clean up: its
temporaries name its pid, and :func:`sweep_stale_temps` removes those whose process is gone (``--resume`` does).
:func:`read_file_text` reads a YAML file (a grid, preset or dashboard spec) and turns an unreadable or binary
file into one error naming it.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "WriteError",
    "atomic_write",
    "is_remote",
    "read_file_text",
    "sweep_stale_temps",
    "write_text",
]


class WriteError(OSError):
    """A file could not be written (a full disk, a read-only folder, no permission): ``cannot write <file>
    (<reason>)``. An OSError (``errno``, ``strerror``; ``filename`` is the file meant, not a temporary), so
    code that tolerates a failed write goes on tolerating it; the original OSError is its ``__cause__``."""

    def __str__(self) -> str:
        return f"cannot write {self.filename} ({self.strerror})"

    @classmethod
    def of(cls, path: str | os.PathLike, exc: OSError) -> WriteError:
        """The WriteError of ``exc`` raised while writing ``path`` (pyarrow's OSErrors carry errno in the text)."""
        found = re.search(r"Detail: \[errno (\d+)\] (.+)$", exc.strerror or str(exc))
        if found:
            return cls(int(found[1]), found[2], str(path))
        return cls(exc.errno, exc.strerror or str(exc), str(path))


#: Temporary files of :func:`atomic_write` are named ``.<name>.tmp-<pid>-<thread>`` (swept at resume once <pid> is
#: dead; ``.<name>.tmp-<pid>``, without the thread, as earlier versions named them).
TEMP_FILE = re.compile(r"^\..+\.tmp-(?P<pid>\d+)(?:-\d+)?$")


def atomic_write(path: str | os.PathLike, write: Callable[[Path], Any]) -> None:
    """Call ``write(tmp)`` on a temporary name beside ``path``, then rename it into place, so a reader (or a
    resume after a kill) sees the old file or the new one, never half of one. On any failure the temporary
    file is removed; an OSError (full disk, read-only folder) becomes a :class:`WriteError` naming ``path``. The
    temporary is the writing thread's own (``.<name>.tmp-<pid>-<thread id>``): two threads of one process may write
    the same file at once (a lease's heartbeat and its release), the last rename winning."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_native_id()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise WriteError.of(path, exc) from exc
        raise


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def sweep_stale_temps(run_dir: str | os.PathLike) -> list[str]:
    """Remove the temporaries that writers killed on this machine left in a local run directory: files
    ``.<name>.tmp-<pid>-<thread>`` (:data:`TEMP_FILE`, :func:`atomic_write`) anywhere in it whose process <pid> no
    longer exists. A live writer's temporary is kept. Returns the removed paths, relative to ``run_dir``."""
    root, removed = Path(str(run_dir).removeprefix("file://")), []
    for folder, _dirs, files in os.walk(root):
        base = Path(folder)
        for name in [n for n in files if (m := TEMP_FILE.match(n)) and not _pid_alive(int(m["pid"]))]:
            with contextlib.suppress(OSError):
                (base / name).unlink()
                removed.append(str((base / name).relative_to(root)))
    return sorted(removed)


def read_file_text(path: str | os.PathLike, error: type[Exception]) -> str:
    """The UTF-8 text of the file at ``path``; one that cannot be read, or is not text (a binary file), raises
    ``error`` naming it."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{path}: not a text file (byte 0x{exc.object[exc.start]:02x} at offset {exc.start} is not UTF-8); "
            "expected a YAML file"
        ) from None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror}") from None


def is_remote(uri: str | os.PathLike) -> bool:
    """True for a URI of a store that is not this machine's disk (``s3://``, ``gs://``, ``memory://``); False for a local
    path or ``file://``."""
    text = str(uri)
    return "://" in text and not text.startswith("file://")


def local_path(uri: str | os.PathLike) -> Path:
    """The local path of ``uri`` (a path, or ``file://``)."""
    return Path(str(uri).removeprefix("file://"))


def write_text(target: str | os.PathLike, text: str) -> str:
    """Write ``text`` to the local path ``target`` (atomically, creating folders); return the target. (A run's
    files, local or in a bucket, are written through its store: :func:`ablate.service.records.store.write_file`.)"""
    path = local_path(target)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WriteError.of(path, exc) from exc
    atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))
    return str(target)
