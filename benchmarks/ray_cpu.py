"""Where a laptop's cores go during `ablate run`: CPU seconds per process role, read from /proc (Linux only).

``python -m benchmarks --only ray_cpu --ray-grid batch_vs_dim --ray-scale smoke`` runs the grid in a fresh
    `ablate run` subprocess and samples its process tree twice a second until it ends.
``python -m benchmarks --only ray_cpu --pid PID --window 300`` samples an `ablate run` that is already running
    (PID = its driver) for a window of seconds, e.g. a long laptop grid in steady state.

Roles (decided from each process's latest command line; raylet and gcs_server by their program name): the
trials' actors (``ray::AblateTrainable`` / ``ray::ResourceTrainable``), the driver (`ablate run`
itself: Tune's loop, callbacks, progress), Ray's daemons (raylet, gcs_server), the dashboard and its agents,
the log monitor, the autoscaler monitor, idle workers, and the rest. CPU seconds are utime + stime of each
process, so they measure work, not waiting; a process that ends between two samples loses at most its last
half-second.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

ROLES = (
    ("trial", ("Trainable",)),
    ("idle worker", ("ray::IDLE",)),
    ("dashboard", ("dashboard", "DashboardA", "ray.dashboard")),
    ("runtime env agent", ("RuntimeEnv",)),
    ("log monitor", ("log_monitor",)),
    ("autoscaler monitor", ("autoscaler",)),
)


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a live process, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid ... utime stime
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def role_of(cmdline: str, is_root: bool) -> str:
    """The role of a process in an `ablate run`, from its command line."""
    if is_root:
        return "driver"
    program = os.path.basename(cmdline.split(" ", 1)[0])
    if program in ("raylet", "gcs_server"):  # their flags name the dashboard agent: decide by the program
        return program
    for role, marks in ROLES:
        if any(m in cmdline for m in marks):
            return role
    return "other"


def _descendants(root: int) -> dict[int, float]:
    """CPU seconds of ``root`` and every process below it, now."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                table[int(entry)] = st
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _) in table.items():
            if ppid == parent and pid not in tree:
                tree.add(pid)
                frontier.append(pid)
    return {pid: table[pid][1] for pid in tree if pid in table}


def sample_tree(root: int, until, interval: float = 0.5) -> tuple[dict[str, float], float]:
    """Sample ``root``'s process tree until ``until()`` is true; CPU seconds used per role, and the wall time.

    CPU used before the first sample (by processes already running) is not counted, so a window started
    mid-run measures that window only.
    """
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    roles: dict[int, str] = {}
    start = time.perf_counter()
    initial = True
    while True:
        now = _descendants(root)
        for pid, cpu in now.items():
            if pid not in first:
                first[pid] = cpu if initial else 0.0  # a process born in the window counts from its start
            # read each time: a Ray worker starts as default_worker.py and renames itself ray::<Actor> later
            line = _cmdline(pid)
            if line or pid not in roles:  # a process that just ended has no command line: keep its role
                roles[pid] = role_of(line, pid == root)
            last[pid] = cpu
        initial = False
        if until() or not now:
            break
        time.sleep(interval)
    wall = time.perf_counter() - start
    used: dict[str, float] = {}
    for pid, cpu in last.items():
        used[roles[pid]] = used.get(roles[pid], 0.0) + cpu - first[pid]
    return used, wall


def _table(used: dict[str, float], wall: float, label: str) -> list[dict]:
    cores = os.cpu_count() or 1
    total = sum(used.values())
    rows = []
    for role, cpu in sorted(used.items(), key=lambda kv: -kv[1]):
        rows.append(
            {
                "run": label,
                "role": role,
                "cpu_s": cpu,
                "cores_busy": cpu / wall,
                "share_of_machine": cpu / (wall * cores),
                "share_of_used": cpu / total if total else 0.0,
            }
        )
    rows.append(
        {
            "run": label,
            "role": "all",
            "cpu_s": total,
            "cores_busy": total / wall,
            "share_of_machine": total / (wall * cores),
            "share_of_used": 1.0,
        }
    )
    return rows


def bench_ray_cpu(grid: str, scale: str, storage: str | None = None) -> list[dict]:
    """Run ``ablate run GRID --scale SCALE`` in a fresh subprocess and split its CPU seconds by role."""
    folder = storage or tempfile.mkdtemp(prefix="ablate-cpu-")
    cmd = [
        sys.executable,
        "-m",
        "ablate.cli",
        "run",
        grid,
        "--scale",
        scale,
        "--storage",
        folder,
        "--no-report",
        "--verbose",
        "0",
    ]
    with open(Path(folder) / "run.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        used, wall = sample_tree(proc.pid, lambda: proc.poll() is not None)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` exited {proc.returncode}; see {folder}/run.log")
    print(f"ray_cpu: the run is in {folder}/{grid}-{scale} (its overhead: --only overhead --run-dirs ...)")
    return _table(used, wall, f"{grid} ({scale}), {wall:.0f} s")


def bench_running(pid: int, window_s: float) -> list[dict]:
    """Split the CPU seconds of an `ablate run` already running (driver ``pid``) over the next ``window_s``."""
    end = time.perf_counter() + window_s
    used, wall = sample_tree(pid, lambda: time.perf_counter() >= end)
    return _table(used, wall, f"pid {pid}, {wall:.0f} s window")
