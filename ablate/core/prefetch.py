"""Make the next items of a sequence in a second thread while the caller works on the current one.

Training draws each batch from its own random generator, independently of the model, so the batch of step
t + 1 can be drawn while step t runs. On a CPU trial that has a core to spare (a trial running alone on a
2-core machine, or any trial given more CPUs than its step can use) this hides the sampler's time; the
numbers are unchanged to the last bit, because the same generator makes the same draws in the same order,
only in another thread. Torch operations release the GIL, so the two threads run on two cores.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

import torch

__all__ = ["Prefetcher"]

T = TypeVar("T")

_DONE = object()


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


class Prefetcher(Generic[T]):
    """Iterate ``make(key)`` for each key in ``keys``, in order, made up to ``depth`` items ahead in a thread.

    Use it as a context manager; leaving the block early (an exception in the caller) stops the thread after
    the item it is making, and the block waits for it, so nothing touches ``make``'s state afterwards. An
    exception raised by ``make`` is raised again by the iteration, at the item that raised it. With
    ``enabled=False`` the items are made in the caller's thread, one at a time, with the same results.
    """

    def __init__(self, make: Callable[[int], T], keys: range, *, depth: int = 2, enabled: bool = True):
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._make, self._keys, self._enabled = make, keys, enabled
        self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._threads = torch.get_num_threads()  # a new thread does not inherit the caller's setting

    def __enter__(self) -> Prefetcher[T]:
        if self._enabled and len(self._keys) > 1:
            self._thread = threading.Thread(target=self._produce, name="ablate-prefetch", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the thread (if running) and wait for it."""
        if self._thread is None:
            return
        self._stop.set()
        while self._thread.is_alive():
            try:  # unblock a producer waiting for room in the queue
                self._queue.get(timeout=0.05)
            except queue.Empty:
                pass
        self._thread.join()
        self._thread = None

    def __iter__(self) -> Iterator[T]:
        if self._thread is None:
            for key in self._keys:
                yield self._make(key)
            return
        while True:
            item = self._queue.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item  # type: ignore[misc]

    def _produce(self) -> None:
        torch.set_num_threads(self._threads)
        for key in self._keys:
            if self._stop.is_set():
                return
            try:
                item: object = self._make(key)
            except BaseException as error:  # handed to the consumer, raised there
                self._put(_Failure(error))
                return
            if not self._put(item):
                return
        self._put(_DONE)

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False
