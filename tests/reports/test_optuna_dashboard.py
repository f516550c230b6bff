"""Optuna's own dashboard on ablate's searches: `optuna-dashboard RUN_DIR/optuna.journal` serves the study of a
real smoke run of tune_aninfonce, with the run's trials, settings (list-valued encoder widths as JSON text) and
final R² values."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port, runs_root, smoke_run

from ablate.service.records.reader import RunReader
from ablate.service.records.rundir import PARAMS_FILE, RESULT_FILE, STUDY_JOURNAL


def _dashboard_exe() -> str | None:
    if importlib.util.find_spec("optuna_dashboard") is None:
        return None
    local = Path(sys.executable).with_name("optuna-dashboard")
    return str(local) if local.is_file() else shutil.which("optuna-dashboard")


def _get(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
        assert resp.status == 200
        return json.loads(resp.read())


def _wait_serving(proc: subprocess.Popen, port: int, log: Path, timeout: float = 60) -> None:
    """Poll the dashboard's /api/meta until it answers; fail with its log if it exits or never answers."""
    deadline = time.time() + timeout
    while True:
        if proc.poll() is not None:
            pytest.fail(f"optuna-dashboard exited with {proc.returncode}:\n{log.read_text()}")
        try:
            _get(port, "/api/meta")
            return
        except OSError:
            if time.time() > deadline:
                pytest.fail(f"optuna-dashboard did not answer on port {port} in {timeout:.0f} s:\n{log.read_text()}")
            time.sleep(0.3)


def _run_trials(run_dir: Path) -> dict[float, dict]:
    """The run's own trials (params.json and the last report of result.json), keyed by their searched lr."""
    reader = RunReader(run_dir)
    out = {}
    for name in reader.trial_dirs():
        params = json.loads((run_dir / name / PARAMS_FILE).read_text())
        last = [json.loads(line) for line in (run_dir / name / RESULT_FILE).read_text().splitlines()][-1]
        out[params["lr"]] = {"params": params, "r2": last["r2"]}
    return out


def test_optuna_dashboard_serves_the_search_of_a_smoke_run(ray_session, tmp_path_factory, tmp_path):
    exe = _dashboard_exe()
    if exe is None:
        pytest.skip("optuna-dashboard is not installed (pip install -e '.[dashboard]' or '.[test]')")
    run_dir = smoke_run("tune_aninfonce", runs_root(tmp_path_factory))
    assert (run_dir / STUDY_JOURNAL).is_file()
    run = _run_trials(run_dir)
    port, log = free_port(), tmp_path / "optuna-dashboard.log"
    cmd = [exe, "--host", "127.0.0.1", "--port", str(port), str(run_dir / STUDY_JOURNAL)]  # as docs/reports.md says
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_serving(proc, port, log)
        studies = _get(port, "/api/studies")["study_summaries"]
        assert [(s["study_name"], s["directions"]) for s in studies] == [("tune_aninfonce", ["maximize"])]
        detail = _get(port, f"/api/studies/{studies[0]['study_id']}")
    finally:
        proc.terminate()
        proc.wait(timeout=20)

    trials = detail["trials"]
    assert len(trials) == len(run) == 4  # num_samples of the smoke scale, one Optuna trial per Ray trial
    searched = {"lr", "lr_lambda", "lr_schedule", "batch_size", "encoder_widths", "report_every"}
    for trial in trials:
        assert trial["state"] == "Complete"
        params = {p["name"]: p for p in trial["params"]}
        assert set(params) == searched
        mine = run[float(params["lr"]["param_external_value"])]  # the run's trial with this learning rate
        for name in searched:
            want = mine["params"][name]
            got = params[name]["param_external_value"]
            if name == "encoder_widths":  # stored as JSON text so that the study can hold it
                assert params[name]["param_external_pytyp"] == "<class 'str'>"
                assert json.loads(got) == want and got in ("[2,2]", "[2,4,2]")
            elif isinstance(want, float):
                assert float(got) == want
            else:
                assert got == str(want)
        assert trial["values"] == [mine["r2"]]  # exactly the run's last reported R²
    widths = {p["name"]: p for p in detail["union_search_space"]}["encoder_widths"]["distribution"]["choices"]
    assert sorted(c["value"] for c in widths) == ["[2,2]", "[2,4,2]"]  # the grid's choices, as JSON text
