"""`ablate run --address`: join an existing Ray cluster (a real head started with `ray start`)."""

from __future__ import annotations

import pytest
from conftest import free_port, run_logged, smoke_cmd, start_ray_node

pytestmark = pytest.mark.slow


@pytest.fixture()
def ray_head():
    """A separate Ray head on 127.0.0.1 with its own temp dir, killed with all its processes at the end."""
    port = free_port()
    head = start_ray_node(
        "--head",
        "--node-ip-address",
        "127.0.0.1",
        "--port",
        str(port),
        "--num-cpus",
        "2",
        "--include-dashboard",
        "false",
    )
    try:
        yield f"127.0.0.1:{port}"
    finally:
        head.kill()


def test_run_joins_an_existing_cluster(ray_head, tmp_path):
    cmd = smoke_cmd(tmp_path, "--address", ray_head)
    code, out = run_logged(cmd, tmp_path / "run.log")
    assert code == 0, out[-3000:]
    assert "summary (4 trials" in out
    trials = list((tmp_path / "batch_vs_dim-smoke").glob("trial_*/result.json"))
    assert len(trials) == 4
