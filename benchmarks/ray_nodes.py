"""Ray nodes started with `ray start --block` on this machine, each in its own session and temp dir: the clusters of
the multi-node tests (tests/conftest.py) and of the chaos benchmark (benchmarks/chaos.py). A node is killed whole
(every process of its session), as when its machine is lost."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["RayNode", "free_port", "node_processes", "start_ray_node", "wait_for_port"]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float = 90, host: str = "127.0.0.1") -> None:
    """Poll until something accepts TCP connections on ``host:port``; TimeoutError if nothing does in time."""
    deadline = time.time() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            if time.time() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout:.0f} s") from None
            time.sleep(0.2)


def node_processes(sid: int) -> list[int]:
    """Live (not zombie) processes of session ``sid`` (a node's), read from /proc."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, pgrp, session, …
        if fields[0] != "Z" and int(fields[3]) == sid:
            pids.append(int(entry))
    return pids


class RayNode:
    """One Ray node started with `ray start --block` in its own session and temp dir (see :func:`start_ray_node`).

    Ray's worker processes put themselves in process groups of their own but stay in the node's session, so
    :meth:`kill` kills the whole session: every process of the node, as when its machine is lost.
    """

    def __init__(self, proc: subprocess.Popen, temp_dir: str, log: Path):
        self.proc, self.temp_dir, self.log = proc, temp_dir, log

    def wait_started(self, timeout: float = 90) -> None:
        """Poll the node's output until it says it started; kill it and raise RuntimeError if it does not."""
        deadline = time.time() + timeout
        while "Ray runtime started" not in self.log.read_text():
            if time.time() > deadline or self.proc.poll() is not None:
                text = self.log.read_text()
                self.kill()
                raise RuntimeError(f"`{' '.join(self.proc.args[1:])}` did not start:\n{text[-3000:]}")
            time.sleep(0.2)

    def kill(self, timeout: float = 20) -> None:
        """SIGKILL every process of the node (polling until none is left), then remove its temp dir."""
        deadline = time.time() + timeout
        while True:
            if not Path("/proc").is_dir():  # no session listing: the `ray start` process group at least
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                break
            pids = node_processes(self.proc.pid)
            if not pids or time.time() > deadline:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        self.proc.wait(timeout=timeout)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def start_ray_node(*args: str, env: dict | None = None, timeout: float = 90, wait: bool = True) -> RayNode:
    """``ray start ARGS --block`` with its own short temp dir (Ray's socket paths have a length limit), output in
    a file there; returns once the node says it started (``wait=False``: at once, then call
    :meth:`RayNode.wait_started`). Callers must :meth:`RayNode.kill` it."""
    ray_bin = Path(sys.executable).with_name("ray")
    temp_dir = tempfile.mkdtemp(prefix="rn", dir="/tmp")
    log = Path(temp_dir) / "ray_start.log"
    cmd = [str(ray_bin), "start", *args, "--disable-usage-stats", "--temp-dir", temp_dir, "--block"]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    node = RayNode(proc, temp_dir, log)
    if wait:
        node.wait_started(timeout)
    return node
