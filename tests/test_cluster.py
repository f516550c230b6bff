"""`ablate run --address`: join an existing Ray cluster (a real head started with `ray start`)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import run_logged

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def ray_head():
    """A separate Ray head on 127.0.0.1 with its own temp dir, torn down with its whole process group."""
    ray_bin = Path(sys.executable).with_name("ray")
    port = _free_port()
    temp_dir = tempfile.mkdtemp(prefix="rh", dir="/tmp")  # short: Ray's socket paths have a length limit
    cmd = [
        str(ray_bin),
        "start",
        "--head",
        "--node-ip-address",
        "127.0.0.1",
        "--port",
        str(port),
        "--num-cpus",
        "2",
        "--include-dashboard",
        "false",
        "--disable-usage-stats",
        "--temp-dir",
        temp_dir,
        "--block",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.time() + 90
    for line in proc.stdout:
        if "Ray runtime started" in line:
            break
        if time.time() > deadline or proc.poll() is not None:
            pytest.fail("the Ray head did not start")
    yield f"127.0.0.1:{port}"
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    shutil.rmtree(temp_dir, ignore_errors=True)


def test_run_joins_an_existing_cluster(ray_head, tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "ablate.cli",
        "run",
        "batch_vs_dim",
        "--scale",
        "smoke",
        "--storage",
        str(tmp_path),
        "--address",
        ray_head,
    ]
    code, out = run_logged(cmd, tmp_path / "run.log")
    assert code == 0, out[-3000:]
    assert "summary (4 trials" in out
    trials = list((tmp_path / "batch_vs_dim-smoke").glob("trial_*/result.json"))
    assert len(trials) == 4
