"""Node loss on a real multi-node Ray cluster: a head and a worker node started with `ray start` on this machine
(one CPU each), a smoke grid run with `ablate run --address` into object storage (an S3 server the test starts on
127.0.0.1: the nodes share no folder, as on a cloud cluster), and the worker node killed whole (raylet, agents,
trial processes) while one of its trials is half-way, as when its machine is lost: the trial moves to the head and
resumes there from the checkpoint the worker node wrote into the store.

The worker node listens on 127.0.0.2, so every report's ``node_ip`` says which node produced it. Until the
worker's first report a placeholder job holds the head's CPU: otherwise Tune, which reuses a finished trial's actor
for a trial still waiting for its own, can run the whole grid on the head while the worker starts its actor.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import s3_server
from conftest import free_port, smoke_cmd, start_ray_node, wait_for_port

from ablate.service.records.rundir import PARAMS_FILE, RESULT_FILE, resolve_run_dir
from ablate.service.records.store import as_store

pytestmark = pytest.mark.ray  # `ablate run` in a subprocess
s3_query = s3_server.s3_query  # the module's S3 server (a fixture)

WORKER_IP = "127.0.0.2"
REPORT_EVERY = 20
REPORTS = 20
STEPS = REPORT_EVERY * REPORTS

#: A job that reserves the head's CPU (a placement group, so no worker process) until its stdin closes.
HOLD_HEAD = """
import sys, ray
from ray.util.placement_group import placement_group, remove_placement_group
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
pg = placement_group([{"CPU": 1, "node:__internal_head__": 0.001}])
ray.get(pg.ready(), timeout=120)
print("held", flush=True)
sys.stdin.read()
remove_placement_group(pg)
"""


def _loopback_alias_works() -> bool:
    try:
        with socket.socket() as s:
            s.bind((WORKER_IP, 0))
        return True
    except OSError:
        return False


def _ray_env() -> dict[str, str]:
    """The environment of the nodes and of the placeholder job: token authentication as the head has it."""
    return {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "token")}


@pytest.fixture()
def two_node_cluster():
    """A head (1 CPU) and a worker node on 127.0.0.2 (1 CPU); yields (GCS address, worker node)."""
    if not _loopback_alias_works():
        pytest.skip(f"{WORKER_IP} is not a usable loopback address here")
    env = _ray_env()
    port = free_port()
    common = ["--num-cpus", "1", "--object-store-memory", str(200 * 2**20)]
    nodes = []
    try:
        nodes.append(
            start_ray_node(
                "--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--include-dashboard", "false",
                *common, env=env, wait=False,
            )
        )  # fmt: skip
        wait_for_port(port)  # the worker node starts while the head starts its raylet and agents
        address = f"127.0.0.1:{port}"
        nodes.append(start_ray_node("--address", address, "--node-ip-address", WORKER_IP, *common, env=env, wait=False))
        for node in nodes:
            node.wait_started()
        yield address, nodes[1]
    finally:
        for node in reversed(nodes):
            node.kill()


def _start_logged(cmd: list[str], log_path: Path, **kwargs) -> subprocess.Popen:
    with log_path.open("w") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **kwargs)


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _result_rows(run_dir: str) -> dict[str, list[dict]]:
    """Each trial's result.json rows in the store, read through its log API (on a bucket the log is numbered
    entries under result.json.d/, each written whole and create-only, never torn)."""
    store, out = as_store(run_dir), {}
    for name in store.list(dirs=True):
        data = store.read_log(f"{name}/{RESULT_FILE}")
        if data is not None:
            out[name] = [json.loads(line) for line in data.decode("utf-8").splitlines()]
    return out


def _uninterrupted(params: dict) -> list[dict]:
    """The trial's reports when nothing stops it: its Trainable stepped to the end in this process, with the one
    torch thread the trial had on the cluster."""
    import torch

    from ablate.service.execution.trainable import AblateTrainable

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainable = AblateTrainable(config=params)
        rows = [trainable.step()]
        while not rows[-1]["done"]:
            rows.append(trainable.step())
        trainable.stop()
    finally:
        torch.set_num_threads(threads)
    return rows


def test_trials_of_a_lost_node_resume_on_the_head_from_their_checkpoint(s3_query, two_node_cluster, tmp_path):
    address, worker = two_node_cluster
    storage = f"s3://runs/lab?{s3_query}"
    run_dir = resolve_run_dir(storage, "r")
    cmd = [
        *smoke_cmd(storage), "--name", "r", "--address", address, "--cpus-per-trial", "1", "--max-failures", "3", "--no-report",
        "--results-every", "0",  # each report in the log as it is made: the test kills the node mid-trial
        "--set", f"max_steps={STEPS}", f"report_every={REPORT_EVERY}",
    ]  # fmt: skip
    log_path = tmp_path / "run.log"
    driver = None
    hold = _start_logged(
        [sys.executable, "-c", HOLD_HEAD, address], tmp_path / "hold.log", stdin=subprocess.PIPE, env=_ray_env()
    )
    killed: tuple[str, int] | None = None  # (trial folder, reports it had on the worker node)
    try:
        deadline = time.time() + 150
        while "held" not in (tmp_path / "hold.log").read_text():
            assert hold.poll() is None and time.time() < deadline, (tmp_path / "hold.log").read_text()[-3000:]
            time.sleep(0.2)
        driver = _start_logged(cmd, log_path)
        while driver.poll() is None and time.time() < deadline:
            rows = _result_rows(run_dir)
            on_worker = {name: r for name, r in rows.items() if r and r[-1]["node_ip"] == WORKER_IP}
            if on_worker and hold.stdin is not None and not hold.stdin.closed:
                hold.stdin.close()  # a trial runs on the worker node: free the head for the others
            for name, trial_rows in on_worker.items():
                if killed is None and len(trial_rows) >= 3 and not trial_rows[-1]["done"]:
                    worker.kill()  # the whole node at once: raylet, agents and the trial's process
                    killed = (name, len(trial_rows))
            time.sleep(0.05)
        code = driver.wait(timeout=max(1.0, deadline - time.time()))
    finally:
        _stop(driver)
        _stop(hold)
    out = log_path.read_text()
    assert killed is not None, "no trial ever reported from the worker node:\n" + out[-3000:]
    assert code == 0, out[-3000:]
    assert "summary (4 trials" in out

    # the lost node's trial went on on the head from its last checkpoint, not from step 0
    name, reports_at_kill = killed
    rows = _result_rows(run_dir)[name]
    on_worker = [r for r in rows if r["node_ip"] == WORKER_IP]
    after = rows[len(on_worker) :]
    assert after and all(r["node_ip"] != WORKER_IP for r in after), "reports from the dead node after its loss"
    assert after[0]["iterations_since_restore"] == 1, "the retried trial did not start a new actor"
    # a checkpoint follows every report; the newest recorded one is that of the last or next-to-last report
    assert after[0]["training_iteration"] >= reports_at_kill, (reports_at_kill, after[0]["training_iteration"])
    assert after[0]["step"] == REPORT_EVERY * after[0]["training_iteration"]

    # the result log: every iteration exactly once, in order, for every trial
    logged = _result_rows(run_dir)
    assert len(logged) == 4
    for trial, trial_rows in logged.items():
        assert [r["training_iteration"] for r in trial_rows] == list(range(1, REPORTS + 1)), trial

    # the export: the same, and the numbers of an uninterrupted run of the same grid points and seeds
    import pandas as pd

    from ablate.analysis.results import export_results

    df = pd.read_csv(export_results(run_dir, tmp_path / "results.csv"), dtype={"trial_id": str})
    assert set(df["status"]) == {"TERMINATED"} and df["trial_id"].nunique() == 4
    for trial_id, exported in df.groupby("trial_id"):
        assert list(exported["training_iteration"]) == list(range(1, REPORTS + 1)), trial_id
        params = json.loads(as_store(run_dir).read_text(f"trial_{trial_id}/{PARAMS_FILE}"))
        expected = _uninterrupted(params)
        for key in ("step", "r2", "loss", "mcc"):
            want = [e[key] for e in expected]
            assert [r[key] for r in logged[f"trial_{trial_id}"]] == want, (trial_id, key)
            assert list(exported[key]) == want, (trial_id, key)
