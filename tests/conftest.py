"""Shared fixtures: one real local Ray session for the whole suite."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def ray_session():
    """A real local Ray (2 CPUs, no dashboard) shared by every test that runs grids."""
    import ray

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield ray
    ray.shutdown()


def run_logged(cmd: list[str], log_path, timeout: float = 300, env: dict | None = None) -> tuple[int, str]:
    """Run ``cmd`` with its output in a file (not a pipe: Ray's daemons may hold a pipe open after the
    driver exits) in its own process group, killed whole on time-out. Returns (exit code, output)."""
    import signal
    import subprocess

    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = -9
    with open(log_path) as log:
        return code, log.read()
