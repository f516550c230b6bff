"""`ablate run --no-dashboard`: a local Ray without its web dashboard (headless machines such as the GPU box)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import smoke_cmd

from benchmarks.ray_nodes import node_processes

pytestmark = pytest.mark.ray  # `ablate run` in a subprocess


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="lists the run's processes from /proc")
def test_no_dashboard_runs_the_grid_without_starting_ray_dashboard(tmp_path):
    log = tmp_path / "out.log"
    cmd = smoke_cmd(tmp_path, "--name", "headless", "--no-dashboard", "--no-report")
    seen: set[str] = set()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 300
        while proc.poll() is None and time.time() < deadline:
            seen.update(_cmdline(pid) for pid in node_processes(proc.pid))
            time.sleep(0.2)
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert proc.wait() == 0, text[-3000:]
    assert "dashboard: off (--no-dashboard)" in text
    assert any("raylet" in c for c in seen), "the run's Ray processes were listed"
    # Ray 2.60 still runs its dashboard process for usage stats, but without the web UI and its modules
    heads = [c for c in seen if "dashboard/dashboard.py" in c]
    assert all("--disable-frontend" in c and "--modules-to-load=UsageStatsHead" in c for c in heads), heads
    run_dir = tmp_path / "headless"
    rows = [json.loads(line) for p in run_dir.glob("trial_*/result.json") for line in p.read_text().splitlines()]
    assert rows and all(r["r2"] <= 1 for r in rows)
