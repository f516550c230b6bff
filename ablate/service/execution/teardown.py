"""How `ablate run` ends on a signal: SIGTERM handled like Ctrl-C, and no process of its Ray left behind.

The first Ctrl-C or SIGTERM stops a run gracefully (:func:`ablate.ray_compat.graceful_interrupt`); a second one,
or one outside Tune's run, raises KeyboardInterrupt (:class:`ablate.ray_compat.Terminated` for SIGTERM). Either
way :func:`run_signals` then stops the Ray this command started with further signals ignored: ``ray.shutdown``
alone, cut by a Ctrl-C, leaves Ray's agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) running, and
Python prints "Exception ignored in atexit callback". A Ray the command joined (``--address``, or one already
running in this process) is left running.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ablate import ray_compat

__all__ = ["RunSignals", "run_signals", "stop_ray"]

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _ray_up() -> bool:
    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized())


def _raise_terminated(sig: int, frame: object) -> None:
    raise ray_compat.Terminated


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat), None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, …; field 22 of the file is index 19 here
    return None if fields[0] in "ZX" else fields[19]


def _descendants(root: int) -> dict[int, str]:
    """Every live process below ``root`` (children, their children, …) → its start time, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if Path("/proc").is_dir() else []:
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                children.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(entry))
    found: dict[int, str] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        started = _start_time(pid)
        if started is not None and pid not in found:
            found[pid] = started
            todo += children.get(pid, [])
    return found


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.signal(s, signal.SIG_IGN) for s in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def _ignore_signals() -> None:
    """Ctrl-C and SIGTERM ignored from now on (main thread only). Registered as an atexit function after Ray's
    own ``ray.shutdown`` (so it runs before it), a Ctrl-C can no longer cut that shutdown halfway."""
    if threading.current_thread() is threading.main_thread():
        for sig in _STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


def stop_ray(grace_s: float = 10.0) -> list[int]:
    """``ray.shutdown()`` with Ctrl-C and SIGTERM ignored meanwhile, then SIGKILL every process this process
    had started (Ray's head processes, their agents and workers) that is still alive ``grace_s`` later.
    Returns the pids it had to kill."""
    import ray

    with _signals_ignored():
        family = _descendants(os.getpid())  # before the shutdown: its orphans lose their link to us
        ray.shutdown()
        deadline = time.monotonic() + grace_s
        alive = list(family)
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = [pid for pid, started in family.items() if _start_time(pid) == started]
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    return alive


@dataclass
class RunSignals:
    """What :func:`run_signals` yields: set ``stopped`` when a signal stopped a run (exit 130 or 143)."""

    stopped: bool = False


@contextlib.contextmanager
def run_signals() -> Iterator[RunSignals]:
    """For the whole of `ablate run`: SIGTERM raises :class:`~ablate.ray_compat.Terminated` wherever Tune's
    graceful stop is not listening (as Ctrl-C raises KeyboardInterrupt), and when a signal stopped the run
    (``stopped`` set, or a KeyboardInterrupt passing through) the Ray this block started is stopped at once
    (:func:`stop_ray`), and from that moment on this process, which is ending, ignores Ctrl-C and SIGTERM: more
    of them cannot cut the cleanup short. Whatever happens, the interpreter's exit ignores them too, so Ray's
    own atexit shutdown cannot be cut halfway. A Ray already running in this process when the block began is
    left alone, and so are the signal handlers then. Main thread only for the signal handling."""
    main = threading.current_thread() is threading.main_thread()
    joined = _ray_up()
    before = signal.signal(signal.SIGTERM, _raise_terminated) if main else None
    state = RunSignals()
    try:
        yield state
    except KeyboardInterrupt:
        if not joined:
            _ignore_signals()
        state.stopped = True
        raise
    finally:
        if state.stopped and not joined:
            _ignore_signals()
        elif main:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)
        if not joined and _ray_up():
            atexit.unregister(_ignore_signals)  # once, and after Ray's own
            atexit.register(_ignore_signals)
            if state.stopped:
                stop_ray()
