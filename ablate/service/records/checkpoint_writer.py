"""A trial's checkpoints written off its training thread.

At a report the Trainable hands its state to :meth:`CheckpointWriter.submit`, which copies it (from a GPU: a
non-blocking copy into pinned host memory, waited for by the writer thread, not by training; on the CPU: a clone)
and returns; a thread serialises the copy and writes it with :func:`ablate.service.records.trial.write_checkpoint`
(atomically, the older checkpoints pruned as before) into the trial's folder: a local path, or its store on object
storage (one upload). One write is in flight at a time: the next submit waits for the one before, so a slow disk
slows training down rather than piling up copies. The last report of a trial is written before the report is
returned (:meth:`submit` with ``wait=True``), and :meth:`wait` (the Trainable's cleanup, a stop, a signal) finishes
the write in flight.

What resume relies on does not change: a checkpoint counts once its report is in the result log and its file is
whole (``resume_point``); a kill during a write leaves the checkpoints written before. An error of a write (a full
disk) is raised by the next :meth:`submit` or :meth:`wait`, in the trial, as a synchronous write's would be one
report earlier.

Nothing here imports Ray.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import torch

from ablate.service.records.store import Store, open_store
from ablate.service.records.trial import Logged, checkpoint_names, write_and_prune

__all__ = ["CheckpointWriter", "host_copy"]


def host_copy(state: Any) -> tuple[Any, torch.cuda.Event | None]:
    """A copy of ``state`` (nested dicts, lists and tensors) that training may not change: CUDA tensors copied
    into pinned host memory without blocking (the event says when they are there), CPU tensors cloned."""
    event = None

    def copy(value: Any) -> Any:
        nonlocal event
        if isinstance(value, torch.Tensor):
            if value.device.type == "cuda":
                host = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
                host.copy_(value.detach(), non_blocking=True)
                event = event or torch.cuda.Event()
                return host
            return value.detach().clone()
        if isinstance(value, dict):
            return {k: copy(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(copy(v) for v in value)
        return value

    out = copy(state)
    if event is not None:
        event.record()
    return out, event


class CheckpointWriter:
    """Writes one trial's checkpoints in a background thread, one at a time (module doc)."""

    def __init__(self, trial_dir: str | os.PathLike | Store, keep: int, names: list[str] | None = None):
        """``trial_dir``: the trial's folder (a local path, a URI, or its store:
        :attr:`ablate.service.records.record.TrialRecord.checkpoints`); ``keep``: the checkpoints it keeps;
        ``names``: the checkpoints there now, newest first (None: listed at the first write). The trial holds its
        folder's lock, so no one else writes checkpoints there: the writer knows them from then on, unlisted.
        ``trial_dir`` then is the folder's local path, or its URI on object storage."""
        self.store = trial_dir if isinstance(trial_dir, Store) else open_store(trial_dir)
        self.trial_dir: str = self.store.join()
        self.keep = keep
        self._names = names
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, state: dict[str, Any], logged: Logged, *, wait: bool = False) -> None:
        """Write ``state`` as the checkpoint at ``state["step"]``; ``logged`` is the step of the log's last row
        (the checkpoint a resume would continue from is never pruned), or a function that reads it, called in the
        writer's thread only when an older checkpoint is to be deleted. Returns once the state is copied, or
        once it is written with ``wait``."""
        self.wait()
        copied, event = host_copy(state)
        self._thread = threading.Thread(
            target=self._write, args=(copied, event, logged), name=f"checkpoint {self._name()}", daemon=True
        )
        self._thread.start()
        if wait:
            self.wait()

    def _name(self) -> str:
        """The folder's name (the last part of its path or URI)."""
        return str(self.trial_dir).partition("?")[0].rstrip("/").rsplit("/", 1)[-1]

    def _write(self, state: dict[str, Any], event: torch.cuda.Event | None, logged: Logged) -> None:
        try:
            if event is not None:
                event.synchronize()
            names = checkpoint_names(self.store) if self._names is None else self._names
            self._names = None  # listed again should this write fail
            self._names = write_and_prune(self.store, state, self.keep, logged, names)
        except BaseException as exc:  # noqa: BLE001 - raised again in the trial by the next submit or wait
            self._error = exc

    def wait(self) -> None:
        """Finish the write in flight; raise its error, if it had one."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        error, self._error = self._error, None
        if error is not None:
            raise error
