"""Chaos on a real multi-node Ray cluster (issue 46): a head and a worker node started with `ray start` on this
machine (one CPU each; the worker on 127.0.0.2), a grid of 16 short trials run with `ablate run --address` into
object storage (an S3 server the test starts on 127.0.0.1: the nodes share no folder, as on a cloud cluster), and
a killer that, once the worker node has reported (the head's CPU is held until then, so the first trial runs
there), SIGKILLs a random trial process every 2 s and, at its second kill, the whole worker node (raylet, agents,
trial processes, as when a spot machine is taken back), which it then starts again: three kills in all.

One command finishes the grid: `ablate run` exits 0, every trial finishes, every report is in its log once, the
trials of the lost node and the killed processes continue from their checkpoints (at most the one report whose
checkpoint had not landed is trained again per retry), and the export's numbers are those of the same trials run
undisturbed. The killer and the cluster are the chaos benchmark's (benchmarks/chaos.py).
"""

from __future__ import annotations

import json
import socket

import pytest
import s3_server

from ablate.service.records.rundir import PARAMS_FILE, RESULT_FILE, resolve_run_dir
from ablate.service.records.store import as_store
from benchmarks.chaos import (
    SCIENCE,
    WORKER_IP,
    HeadHold,
    Killer,
    TwoNodeCluster,
    chaos_grid,
    export_rows,
    run_ablate,
    worker_reported,
)

pytestmark = pytest.mark.ray  # `ablate run` in a subprocess, on a cluster of `ray start`
s3_query = s3_server.s3_query  # the module's S3 server (a fixture)

TRIALS = 16
REPORT_EVERY = 40
REPORTS = 8
KILL_EVERY_S = 2.0
#: the killer's events: 2 trial processes and, second, the worker node (unbounded, a lone last trial killed every few
#: seconds, sooner than its process starts, would use all its failures)
KILLS = 3


def _loopback_alias_works() -> bool:
    try:
        with socket.socket() as s:
            s.bind((WORKER_IP, 0))
        return True
    except OSError:
        return False


def _result_rows(run_dir: str) -> dict[str, list[dict]]:
    """Each trial's result.json rows in the store, read through its log API."""
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


def test_a_grid_finishes_in_one_command_while_trial_processes_and_a_node_die(s3_query, tmp_path):
    if not _loopback_alias_works():
        pytest.skip(f"{WORKER_IP} is not a usable loopback address here")
    storage = f"s3://runs/lab?{s3_query}"
    run_dir = resolve_run_dir(storage, "chaos")
    grid = chaos_grid(tmp_path / "chaos.yaml", TRIALS, steps=REPORT_EVERY * REPORTS, report_every=REPORT_EVERY)
    with TwoNodeCluster() as cluster:
        args = [
            str(grid), "--scale", "smoke", "--storage", storage, "--name", "chaos", "--address", cluster.address,
            "--cpus-per-trial", "1", "--max-failures", "10", "--no-report",
            "--results-every", "0",  # each report in the log as it is made: a kill loses at most one
        ]  # fmt: skip
        hold = HeadHold(cluster, tmp_path / "hold.log")  # the first trial runs on the worker node
        try:
            ready = worker_reported(run_dir, then=hold.release)
            killer = Killer(cluster, KILL_EVERY_S, node_kills=(2,), ready=ready, max_events=KILLS)
            code, out, _ = run_ablate(args, tmp_path / "run.log", timeout=600, killer=killer)
        finally:
            hold.close()
    assert killer.node_deaths == 1 and killer.kills >= 1, (killer.kills, killer.node_deaths, out[-3000:])
    assert code == 0, out[-3000:]
    assert f"summary ({TRIALS} trials" in out
    lines = out.strip().splitlines()
    (last,) = [line for line in lines if line.startswith("retried ")]  # ablate's last line (Ray's raylet may add some)
    assert "report(s) trained again" in last and lines.index(last) > lines.index(f"run directory: {run_dir}"), out[
        -3000:
    ]
    retries, redone = int(last.split()[3]), int(last.split("; ")[-1].split()[0])
    # from their checkpoints, not from step 0: each retry trains again at most the report whose checkpoint was in
    # flight when its process died
    assert redone <= retries, last

    logged = _result_rows(run_dir)
    assert len(logged) == TRIALS
    for trial, rows in logged.items():
        assert [r["training_iteration"] for r in rows] == list(range(1, REPORTS + 1)), trial
        assert [r["step"] for r in rows] == [REPORT_EVERY * i for i in range(1, REPORTS + 1)], trial
    assert any(r["node_ip"] == WORKER_IP for rows in logged.values() for r in rows), "the worker node ran nothing"

    # the export, row for row: the numbers of the same trials run undisturbed
    exported = export_rows(run_dir)
    assert len(exported) == TRIALS * REPORTS and {row[1] for row in exported} == {"TERMINATED"}
    expected = []
    for name in sorted(logged):
        params = json.loads(as_store(run_dir).read_text(f"{name}/{PARAMS_FILE}"))
        tid = name.removeprefix("trial_")
        for i, r in enumerate(_uninterrupted(params), start=1):
            expected.append((tid, "TERMINATED", i, *(r[k] for k in SCIENCE[3:])))
    assert sorted(exported) == sorted(expected)
