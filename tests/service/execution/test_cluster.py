"""The Ray cluster (``ablate.service.execution.cluster``): `ablate run --address` joins an existing cluster (a real head
started with `ray start`); `ablate dashboard`'s host and authentication rules (without starting Ray)."""

from __future__ import annotations

import pytest
from conftest import free_port, run_logged, smoke_cmd, start_ray_node

from ablate import cli
from ablate.service.execution.cluster import DashboardHandle, auth_lines, check_host, is_loopback
from ablate.service.records.rundir import RunError


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


@pytest.mark.ray
def test_run_joins_an_existing_cluster(ray_head, tmp_path):
    cmd = smoke_cmd(tmp_path, "--address", ray_head)
    code, out = run_logged(cmd, tmp_path / "run.log")
    assert code == 0, out[-3000:]
    assert "summary (4 trials" in out
    trials = list((tmp_path / "batch_vs_dim-smoke").glob("trial_*/result.json"))
    assert len(trials) == 4


def test_joining_an_address_takes_the_clusters_token_auth(monkeypatch, tmp_path):
    """The driver's authentication mode must be the cluster's: with a token against a cluster without token auth
    (a plain `ray start --head` on Ray 2.52), Ray 2.52 cancelled every trial's actor before it started."""
    import os

    import ablate.service.execution.cluster as cluster

    token = tmp_path / "auth_token"
    token.write_text("x")
    monkeypatch.setattr(cluster, "TOKEN_FILE", token)
    monkeypatch.setattr(cluster.ray_compat, "refresh_auth_config", lambda: None)
    # the cluster's answer decides; where it cannot tell, the token file here does
    for answer, has_file, mode in (
        (True, True, "token"),
        (False, True, None),
        (None, True, "token"),
        (None, False, None),
    ):
        if not has_file:
            token.unlink()
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
        monkeypatch.setattr(cluster.ray_compat, "cluster_wants_token", lambda address, answer=answer: answer)
        cluster._keep_token_auth("127.0.0.1:6379")
        assert os.environ.get("RAY_AUTH_MODE") == mode, (answer, has_file)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # set by the user: kept
    monkeypatch.setattr(cluster.ray_compat, "cluster_wants_token", lambda address: True)
    cluster._keep_token_auth("127.0.0.1:6379")
    assert os.environ["RAY_AUTH_MODE"] == "disabled"
    # no GCS to ask: cannot tell
    from ablate.ray_compat.cluster import cluster_wants_token  # the real one: the package's is patched above

    assert cluster_wants_token("ray://127.0.0.1:10001") is None and cluster_wants_token("auto") is None
    assert cluster_wants_token(f"127.0.0.1:{free_port()}", timeout=2) is None


def test_dashboard_host_defaults_to_loopback_without_warning():
    assert check_host(None, {}) == ("127.0.0.1", [])
    for host in ("127.0.0.1", "localhost", "::1", "127.0.1.1"):
        assert is_loopback(host) and check_host(host, {})[1] == []


def test_dashboard_warns_for_another_host_and_refuses_it_without_auth():
    host, warnings = check_host("0.0.0.0", {})
    assert host == "0.0.0.0" and len(warnings) == 1 and "ssh -L 8265:127.0.0.1:8265" in warnings[0]
    with pytest.raises(RunError, match="refusing to expose"):
        check_host("10.1.2.3", {"RAY_AUTH_MODE": "disabled"})
    host, warnings = check_host("127.0.0.1", {"RAY_AUTH_MODE": "disabled"})
    assert host == "127.0.0.1" and any("token authentication is off" in w for w in warnings)
    with pytest.raises(RunError, match="empty host"):
        check_host(" ", {})


def test_dashboard_prints_url_and_how_to_authenticate(monkeypatch, capsys, tmp_path):
    import ablate.service.execution.cluster as dashboard

    closed = []
    handle = DashboardHandle(url="http://127.0.0.1:8265", started=True, shutdown=lambda: closed.append(True))
    monkeypatch.setattr(dashboard, "start_or_find", lambda host, port: handle)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    lines: list[str] = []
    assert dashboard.serve(None, 8265, out=lines.append, wait=lambda: None) == 0
    text = "\n".join(lines)
    assert "Ray dashboard: http://127.0.0.1:8265" in text
    assert "auth_token" in text and "ray get-auth-token" in text and "Ablate[" in text
    assert closed == [True]
    assert any("auth_token" in line for line in auth_lines({}, tmp_path / "auth_token"))
    assert cli.main(["dashboard", "--port", "70000"]) == 2
    assert "not a TCP port" in capsys.readouterr().err


@pytest.mark.ray
def test_the_dashboard_command_joins_a_running_cluster_in_its_auth_mode(ray_head, tmp_path):
    """`ablate dashboard` beside a running cluster (``RAY_ADDRESS``, or the one whose processes live on this
    machine) joins it with the cluster's own authentication mode, as `ablate run --address` does: on Ray 2.60 a
    head that `ray start` made with a token file checks tokens, and an explicit address is not given one by Ray."""
    import os
    import subprocess
    import sys

    probe = (
        "from ablate.service.execution.cluster import start_or_find\n"
        "handle = start_or_find()\n"
        "print('NOTES', handle.notes)\n"
        "handle.shutdown()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    done = subprocess.run(
        [sys.executable, "-c", probe], env={**env, "RAY_ADDRESS": ray_head}, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"joined the Ray cluster already running on this machine ({ray_head})" in done.stdout, done.stdout
