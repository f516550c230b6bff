"""How many of this machine's cores the other processes left idle: decides a trial's batch prefetch thread.

A trial draws its next batch in a second thread (`Experiment.prefetch`) only where that thread gets a core of
its own. On a full machine the thread competes with the other trials and slows them more than it speeds its
own trial (measured on `batch_vs_dim`'s laptop grid, docs/performance.md); on a machine with an idle core, as
when the last trial of a grid runs alone, it makes a sampler-bound trial up to 1.5× faster. The numbers of a
run are the same either way, so the trial may switch it at every report.

The measure is Linux's ``/proc/stat`` (every core's busy time) minus this process's own CPU time, over the
interval since the previous reading. Elsewhere it is unknown and the prefetch stays off.
"""

from __future__ import annotations

import time
from pathlib import Path

__all__ = ["SpareCoreMeter", "read_proc_stat"]

#: Readings closer together than this say too little about the other processes.
_MIN_INTERVAL_S = 1.0


def read_proc_stat(path: Path = Path("/proc/stat")) -> tuple[int, int, int] | None:
    """(busy jiffies, total jiffies, number of cores) summed over the machine's cores, or None if unreadable."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    if not lines or not lines[0].startswith("cpu "):
        return None
    fields = [int(v) for v in lines[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    cores = sum(1 for line in lines[1:] if line.startswith("cpu") and line[3:4].isdigit())
    return total - idle, total, max(cores, 1)


class SpareCoreMeter:
    """Cores left idle by every other process since the previous :meth:`spare` call, beyond this process's own
    main thread (so 1.0 means a whole core nobody used)."""

    def __init__(self, stat_path: Path = Path("/proc/stat")):
        self._path = stat_path
        self._last = self._reading()

    def _reading(self) -> tuple[float, float, tuple[int, int, int]] | None:
        stat = read_proc_stat(self._path)
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
