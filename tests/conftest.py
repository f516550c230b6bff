"""Shared fixtures: one real local Ray session for the whole suite."""

from __future__ import annotations

import os
from pathlib import Path

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


def run_logged(cmd: list[str], log_path, timeout: float = 300, env: dict | None = None, cwd=None) -> tuple[int, str]:
    """Run ``cmd`` with its output in a file (not a pipe: Ray's daemons may hold a pipe open after the
    driver exits) in its own process group, killed whole on time-out. Returns (exit code, output)."""
    import signal
    import subprocess

    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = -9
    with open(log_path) as log:
        return code, log.read()


#: grid name → run directory, shared by tests/test_report.py and tests/test_browser.py within one pytest process.
_RUNS: dict[str, Path] = {}


def smoke_run(name: str, root: Path) -> Path:
    """Run a grid at smoke scale once per test session through `ablate run … --report` (in-process)."""
    if name not in _RUNS:
        from ablate import cli

        code = cli.main(["run", name, "--scale", "smoke", "--storage", str(root), "--verbose", "0", "--report"])
        run_dir = root / f"{name}-smoke"
        assert code == 0, f"smoke run of {name} failed (exit {code})"
        _RUNS[name] = run_dir
    return _RUNS[name]


def runs_root(tmp_path_factory) -> Path:
    """One folder for every smoke run of the session."""
    root = tmp_path_factory.getbasetemp() / "report-smoke-runs"
    root.mkdir(exist_ok=True)
    return root
