"""How many of this machine's cores the other processes left idle: decides a trial's batch prefetch thread.

A trial draws its next batch in a second thread (`Experiment.prefetch`) only where that thread gets a core of
its own. On a full machine the thread competes with the other trials and slows them more than it speeds its
own trial (measured on `batch_vs_dim`'s laptop grid, docs/performance.md); on a machine with an idle core, as
when the last trial of a grid runs alone, it makes a sampler-bound trial faster (docs/performance.md). The numbers of a
run are the same either way, so the trial may switch it at every report.

The measure is the machine's busy CPU time (``psutil.cpu_times``, every core's; on Linux read from /proc/stat)
minus this process's own CPU time, over the interval since the previous reading. Where psutil cannot tell, it is
unknown and the prefetch stays off.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["SpareCoreMeter", "read_cpu_times"]

#: Readings closer together than this say too little about the other processes.
_MIN_INTERVAL_S = 1.0


def read_cpu_times() -> tuple[float, float, int] | None:
    """(busy seconds, total seconds, number of cores) summed over the machine's cores (``psutil.cpu_times``:
    idle and iowait count as idle; guest time is inside user), or None where unknown."""
    try:
        import psutil

        times = psutil.cpu_times()
        cores = psutil.cpu_count() or 1
    except Exception:  # noqa: BLE001 - psutil missing or refused by the platform: the meter says unknown
        return None
    fields = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    total = sum(getattr(times, name, 0.0) for name in fields)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total, cores


class SpareCoreMeter:
    """Cores left idle by every other process since the previous :meth:`spare` call, beyond this process's own
    main thread (so 1.0 means a whole core nobody used)."""

    def __init__(self, read: Callable[[], tuple[float, float, int] | None] = read_cpu_times):
        self._read = read
        self._last = self._reading()

    def _reading(self) -> tuple[float, float, tuple[float, float, int]] | None:
        stat = self._read()
        return None if stat is None else (time.monotonic(), time.process_time(), stat)

    def spare(self) -> float | None:
        """Idle cores beyond this process's main thread since the last call; None where unknown or too soon."""
        now = self._reading()
        last = self._last
        if now is None or last is None:
            self._last = now
            return None
        wall = now[0] - last[0]
        if wall < _MIN_INTERVAL_S:
            return None  # keep the older reading: the next call measures a longer interval
        self._last = now
        (busy1, total1, cores), (busy0, total0, _) = now[2], last[2]
        if total1 <= total0:
            return None
        busy_cores = (busy1 - busy0) / (total1 - total0) * cores
        own_cores = (now[1] - last[1]) / wall
        others = max(busy_cores - own_cores, 0.0)
        return cores - others - 1.0
