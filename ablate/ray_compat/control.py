"""How a Tune run stops: Ray's silent restart on a failed resume, Ctrl-C and SIGTERM, a full disk's tracebacks and a
trial actor's exit on SIGTERM (Ray 2.60 internals; see :mod:`ablate.ray_compat`)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any


# ------------------------------------------------------------------ Ctrl-C: Tune's graceful stop, and knowing it fired
class Terminated(KeyboardInterrupt):
    """SIGTERM asked ``ablate run`` to stop at once (a second SIGTERM, or one outside Tune's graceful stop): what
    KeyboardInterrupt is to Ctrl-C, so the same cleanup runs; the command then exits 143 instead of 130."""


def reclaim_sigterm() -> None:
    """Give SIGTERM back to Python's handler after ``ray.init``.

    Ray 2.60's core worker installs its C++ crash handler (absl's failure signal handler) for SIGTERM in the
    driver: a batch scheduler's SIGTERM then dumps a stack and aborts (exit 134), and ``signal.getsignal`` cannot
    see the change. Setting Python's handler again (the CLI's, or the default: plain termination) undoes it.
    Main thread only; elsewhere nothing changes.
    """
    if threading.current_thread() is threading.main_thread():
        handler = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, signal.SIG_DFL if handler is None else handler)


#: Seconds Tune's graceful stop may take before the first signal counts as a second one (stop at once). Tune's stop
#: saves its experiment state one last time, which ablate never reads, and for a grid of 10 000 trials that takes
#: minutes; every report already done is in the run directory.
STOP_GRACE_S = 20.0


@contextlib.contextmanager
def graceful_interrupt(grace_s: float = STOP_GRACE_S) -> Iterator[Callable[[], int]]:
    """While Tune runs, turn the first Ctrl-C or SIGTERM into Tune's graceful stop and remember which it was.

    Ray Tune 2.60 stops a run gracefully (last snapshot saved, trials left resumable) on SIGINT or SIGUSR1
    (``ray.tune.tune._setup_signal_catching``), but only logs that it did: ``Tuner.fit`` returns as after a
    finished run. Here ``TUNE_DISABLE_SIGINT_HANDLER=1`` (a documented Tune env variable) keeps Tune off
    SIGINT; ablate's handler records the interrupt and sends this process SIGUSR1, which Tune always handles
    the same way. A second Ctrl-C raises KeyboardInterrupt (skipping Tune's last snapshot, as Tune's own
    handler does). SIGTERM, what a batch scheduler sends before it preempts a job, is handled the same way
    (a second one raises :class:`Terminated`). Yields a function that returns the signal that interrupted the
    run (``signal.SIGINT`` or ``signal.SIGTERM``), or 0. A graceful stop that takes longer than ``grace_s``
    becomes a stop at once, as if the signal came twice. Main thread only: elsewhere signals cannot be handled
    and nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield lambda: 0
        return
    received: list[int] = []
    done = threading.Event()

    def hurry(sig: int) -> None:
        if not done.wait(grace_s):  # Tune is still stopping: the signal again, which stops at once
            os.kill(os.getpid(), sig)

    def on_signal(sig: int, frame: Any) -> None:
        if received:
            raise Terminated if sig == signal.SIGTERM else KeyboardInterrupt
        received.append(sig)
        threading.Thread(target=hurry, args=(sig,), name="ablate-stop-grace", daemon=True).start()
        os.kill(os.getpid(), signal.SIGUSR1)

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    env_before = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        yield lambda: received[0] if received else 0
    finally:
        done.set()
        for sig, handler in before.items():
            if handler is None and sig == signal.SIGTERM:
                handler = signal.SIG_DFL  # Ray's C++ handler (see reclaim_sigterm): never leave ours behind
            if handler is not None:  # None: a handler not set from Python, which cannot be put back
                signal.signal(sig, handler)
        if env_before is None:
            os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
        else:
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = env_before


# ------------------------------------------------------------------ a full disk: Ray's tracebacks
#: Ray 2.60's loggers that print a traceback per failed write when the storage is full: the storage syncer
#: (every snapshot copy), the controller (each trial that failed), Tune's loop (the last snapshot).
FULL_DISK_LOGGERS = ("ray.train._internal.syncer", "ray.tune.execution.tune_controller", "ray.tune.tune")
FULL_DISK_TEXT = ("No space left on device", "[Errno 28]", "Disk quota exceeded", "[Errno 122]")


class _FullDisk(logging.Filter):
    def __init__(self, on_first: Callable[[str], None]):
        super().__init__()
        self.on_first = on_first
        self.hidden = 0

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if record.exc_info:
            text += "".join(traceback.format_exception(*record.exc_info))
        if not any(t in text for t in FULL_DISK_TEXT):
            return True
        if not self.hidden:
            self.on_first(text.strip().splitlines()[-1])
        self.hidden += 1
        return False


@contextlib.contextmanager
def hide_full_disk_tracebacks(on_first: Callable[[str], None]) -> Iterator[None]:
    """While Tune runs, drop Ray's log records about a full disk (a 25-line traceback per failed write, several
    a second) and call ``on_first(last line)`` once instead. Depends on the logger names of Ray 2.60 and on
    the text of the OSError (ENOSPC, EDQUOT); other records pass untouched."""
    guard = _FullDisk(on_first)
    loggers = [logging.getLogger(name) for name in FULL_DISK_LOGGERS]
    for logger in loggers:
        logger.addFilter(guard)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(guard)


# ------------------------------------------------------------------ Tune's own resume hint
#: What Ray Tune 2.60 logs (logger ``ray.tune.tune``) after an interrupted run: a ``Tuner.restore(...)`` command,
#: which resumes from Tune's snapshot. ablate never reads that snapshot; its own hint (``ablate run … --resume``)
#: is the one that works, and two contradicting hints are one too many.
RESUME_HINT_TEXT = ("Resume experiment with:", "Resume training with:")


class _ResumeHint(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(t in record.getMessage() for t in RESUME_HINT_TEXT)


@contextlib.contextmanager
def hide_tune_resume_hint() -> Iterator[None]:
    """While Tune runs, drop Ray Tune's "Resume experiment with: Tuner.restore(...)" record (:data:`RESUME_HINT_TEXT`)."""
    guard, logger = _ResumeHint(), logging.getLogger("ray.tune.tune")
    logger.addFilter(guard)
    try:
        yield
    finally:
        logger.removeFilter(guard)


# ------------------------------------------------------------------ a trial's actor stopped by SIGTERM
def _drop_sigterm_exit(unraisable: Any) -> None:
    if isinstance(unraisable.exc_value, SystemExit):
        return
    sys.__unraisablehook__(unraisable)


def quiet_exit_on_sigterm() -> None:
    """In a trial's actor process: let Ray's SIGTERM exit stay silent when it lands in a weakref callback.

    When a run ends early (a full disk, Ctrl-C), Ray stops the trials' actors with SIGTERM; Ray 2.60's handler
    (``ray._private.worker.sigterm_handler``) raises ``SystemExit``. If the signal arrives while Python runs a
    weakref callback, the exception cannot propagate and Python prints "Exception ignored in ..." with a
    10-line traceback, which Ray forwards to the driver's terminal. The process exits either way; this hook
    drops only such ``SystemExit`` records and passes every other unraisable exception to Python's default.
    """
    sys.unraisablehook = _drop_sigterm_exit
