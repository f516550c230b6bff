"""A run on object storage (issue "The run record on object storage"): `ablate status`, `export`, `report`,
`compare` and `claims` read a run directory at an ``s3://`` URI as they read it on disk, and `ablate run --storage
s3://…` writes a grid's or an Optuna search's run there (its driver and trials holding leases in place of locks, the
search's study an Optuna journal), resumable as on disk. Storage that cannot be written is refused in one line
before Ray starts.

The store is a real S3 server (moto's standalone server, as Ray's own storage tests use) that the test starts on
127.0.0.1 (tests/s3_server.py), reached through obstore's S3 client with the endpoint in the URI, as a researcher
would name MinIO or a cloud bucket.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from conftest import run_logged, smoke_cmd
from s3_server import s3_server
from unfinished_runs import finished_smoke_run

from ablate import cli
from ablate.analysis.results import load_results
from ablate.service.execution.callbacks import ResultLog
from ablate.service.records.driver_lock import DRIVER_TTL_S, DriverCheck, busy_message, driver_lock, one_driver
from ablate.service.records.reader import RunReader
from ablate.service.records.record import TRIAL_LOCK
from ablate.service.records.rundir import (
    DRIVER_LOCK,
    ENVIRONMENT_FILE,
    INTERRUPTED_FILE,
    PARAMS_FILE,
    PROVENANCE_FILE,
    RESULT_FILE,
    RUN_MARKER,
    RunError,
    check_writable,
    resolve_run_dir,
)
from ablate.service.records.store import as_store
from ablate.service.records.store.lease import LeaseLost
from ablate.service.records.store.segments import folder_of
from ablate.service.specs.params import RECORD_KEY


@pytest.fixture(scope="module")
def s3_store(tmp_path_factory):
    """An S3 server on 127.0.0.1 with an empty bucket ``runs`` (:func:`s3_server.s3_server`); yields the URI query
    that reaches it."""
    with s3_server(tmp_path_factory.mktemp("moto")) as query:
        yield query


def _finished_run(run_dir: Path) -> Path:
    """batch_vs_dim at smoke scale, finished, written by hand, with R² that differ by d so compare has something
    to tell."""

    def rows(i, point):
        r2 = 0.9 - 0.1 * (point.params["latent_dim"] > 3) + 0.01 * i
        return [
            {"step": s, "training_iteration": n + 1, "r2": r2 * s / 10, "loss": 2.0 - s / 10, "time_total_s": s / 5}
            for n, s in enumerate((5, 10))
        ]

    finished_smoke_run(run_dir, rows)
    return run_dir


def _upload(local: Path, uri: str) -> None:
    import pyarrow.fs as pafs

    pafs.copy_files(str(local), uri)


def test_a_run_on_s3_reads_as_it_does_on_disk(s3_store, tmp_path, capsys, monkeypatch):
    local = _finished_run(tmp_path / "local" / "bvd")
    uri = f"s3://runs/lab/bvd?{s3_store}"
    _upload(local, uri)

    remote_df, local_df = load_results(uri), load_results(local)
    pd.testing.assert_frame_equal(remote_df, local_df, check_exact=True)  # the export, row for row

    assert cli.main(["status", uri]) == 0
    status = capsys.readouterr().out
    assert "finished: 4  running: 0  interrupted: 0" in status, status

    assert cli.main(["export", uri, "--out", str(tmp_path / "remote.csv")]) == 0
    assert cli.main(["export", str(local), "--out", str(tmp_path / "local.csv")]) == 0
    assert (tmp_path / "remote.csv").read_text() == (tmp_path / "local.csv").read_text()
    capsys.readouterr()

    monkeypatch.chdir(tmp_path)  # `ablate report s3://…/RUN` writes the page here, not back into the store
    assert cli.main(["report", uri]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "report: bvd-report.html"
    page = (tmp_path / "bvd-report.html").read_text()
    assert "run finished: 4 of 4 trials known (4 terminated)" in page and "<h2>Trials</h2>" in page

    assert cli.main(["compare", uri, "--by", "latent_dim"]) == 0
    remote_compare = capsys.readouterr().out
    assert cli.main(["compare", str(local), "--by", "latent_dim"]) == 0
    assert remote_compare == capsys.readouterr().out.replace(str(local), uri)

    assert cli.main(["claims", uri]) == 0
    remote_claims = capsys.readouterr().out
    assert cli.main(["claims", str(local)]) == 0
    assert remote_claims == capsys.readouterr().out.replace(str(local), uri)


def test_a_uri_that_holds_no_run_is_refused_in_one_line(s3_store, capsys):
    assert cli.main(["status", f"s3://runs/lab/none?{s3_store}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not an ablate run directory" in err[0], err


def test_storage_that_cannot_be_written_is_refused_in_one_line_naming_it(s3_store, ablate_cli):
    """A missing bucket: the probe write fails before the driver's lease is taken or Ray starts; a bucket that is
    there takes the probe (conditional writes honoured) and is left as it was."""
    storage = f"s3://no-such-bucket/lab?{s3_store}"
    with pytest.raises(RunError) as refused:
        check_writable(storage)
    assert str(refused.value).startswith(f"storage {storage}: not writable (") and "\n" not in str(refused.value)
    line = ablate_cli("run", "batch_vs_dim", "--scale", "smoke", "--storage", storage, "--no-dashboard").refusal()
    assert line == f"ablate: error: {refused.value}", line
    there = f"s3://runs/{uuid.uuid4().hex[:8]}?{s3_store}"
    check_writable(there)  # a bucket that is there: the probe is written and removed
    assert _keys(there) == []


def test_the_driver_s_lease_refuses_a_second_driver_and_tells_a_live_one(s3_store):
    """On object storage the driver holds a lease (an object at ablate_driver.lock) instead of a lock: a second
    driver is refused naming the first, ``RunReader.driver_live`` is true while it is held, and a lost lease (its
    object rewritten by another, so the version the holder last wrote is gone) stops the driver's writes
    (:class:`DriverCheck`, also once pickled into another process as Ray Client does)."""
    uri = f"s3://runs/lab/{uuid.uuid4().hex[:8]}?{s3_store}"
    reader = RunReader(uri)
    assert not reader.driver_live() and reader.driver() is None
    first = driver_lock(uri)
    try:
        with pytest.raises(RunError) as refused:
            driver_lock(uri)
        held = reader.driver()
        assert str(refused.value) == busy_message(uri, held), refused.value
        assert f"is being written by ablate pid {os.getpid()} on host " in str(refused.value)
        assert held["ttl_s"] == DRIVER_TTL_S and reader.driver_live()
        assert as_store(uri).list(dirs=False) == [DRIVER_LOCK]
        as_store(uri).write_text(INTERRUPTED_FILE, "{}")  # a Ctrl-C stopped it: not live, though it holds the lease
        assert not reader.driver_live()
        as_store(uri).delete(INTERRUPTED_FILE)

        check, shipped = DriverCheck(first), pickle.loads(pickle.dumps(DriverCheck(first)))
        check(), shipped()
        taken = {**json.loads(as_store(uri).read_text(DRIVER_LOCK)), "token": "another driver's"}
        as_store(uri).write_text(DRIVER_LOCK, json.dumps(taken))  # taken over (as after a stall past its ttl)
        with pytest.raises(LeaseLost):
            shipped()
        with pytest.raises(LeaseLost):
            first.renew()
        with pytest.raises(LeaseLost, match="now held by pid"):
            check()
        trial = SimpleNamespace(config={RECORD_KEY: {"dir": uri, "id": "x"}}, trial_id="x")
        with pytest.raises(LeaseLost):  # the driver's result log writes no more rows
            ResultLog(check).on_trial_result(1, [], trial, {"step": 5, "r2": 0.5})
        assert not as_store(uri).exists("trial_x")
    finally:
        first.release()
    assert reader.driver() is not None  # another's lease is left as it is
    assert json.loads(as_store(uri).read_text(DRIVER_LOCK)) == taken
    as_store(uri).delete(DRIVER_LOCK)
    assert not reader.driver_live()


def test_one_driver_holds_the_lease_for_the_call_and_refuses_a_second(s3_store):
    """driver_lock.one_driver on object storage: the lease is taken after the storage is probed, held while the
    call runs (a second driver of the run is refused), and released after it (its object left as a released
    tombstone, which nobody holds)."""
    opts = SimpleNamespace(storage=f"s3://runs/lab?{s3_store}", name=uuid.uuid4().hex[:8], resume=False)
    uri = resolve_run_dir(opts.storage, opts.name)

    @one_driver(lambda grid, o: resolve_run_dir(o.storage, o.name))
    def run(grid, o, *, check):
        check()
        assert RunReader(uri).driver_live()
        with pytest.raises(RunError, match="is being written by ablate pid"):
            run(grid, o)
        return "ran"

    assert run(None, opts) == "ran"
    assert RunReader(uri).driver() is None and _keys(uri) == [DRIVER_LOCK]
    assert _released(uri, DRIVER_LOCK) and not RunReader(uri).driver_live()


def _keys(uri: str) -> list[str]:
    """Every object under ``uri``, relative to it (one flat listing: every object, whatever its name)."""
    import obstore

    store = as_store(uri)
    return sorted(m["path"] for chunk in obstore.list(store.client) for m in chunk)


def _released(uri: str, key: str) -> bool:
    """Whether the lease at ``key`` of the run ``uri`` reads as released: nobody holds it, and its object says so."""
    store = as_store(uri)
    there = json.loads(store.read_text(key) or "null")
    return store.lock_holder(key, ttl_s=60) is None and isinstance(there, dict) and there.get("released") is True


def _log_entry(name: str) -> bool:
    """Whether ``name`` (relative to a trial folder) is an entry of the trial's result log on a bucket: the log
    is numbered entries ``result.json.d/FFFFFFFFFF-LLLLLLLLLL``, not one object (store/segments.py)."""
    return re.fullmatch(rf"{re.escape(folder_of(RESULT_FILE))}/\d{{10}}-\d{{10}}", name) is not None


_TIMING = ["time_total_s", "prefetch"]


def _reports(uri: str) -> dict[str, list[int]]:
    """Each trial folder's logged steps on the store (a trial without a log yet: none)."""
    store, out = as_store(uri), {}
    for trial in store.list(dirs=True):
        data = store.read_log(f"{trial}/{RESULT_FILE}")  # on a bucket the log is entries under result.json.d/
        if data is not None:
            out[trial] = [json.loads(line)["step"] for line in data.decode("utf-8").splitlines()]
    return out


@pytest.mark.ray
def test_a_grid_on_object_storage_killed_with_kill_9_resumes_and_reads_as_on_disk(
    s3_store, tmp_path, ablate_cli, ray_session, caplog
):
    """`ablate run batch_vs_dim --scale smoke --storage s3://…` (a subprocess, its own Ray) on the S3 server,
    kill -9 of its whole process group mid-grid, then `--resume` at once: the dead driver's lease is taken over at
    once (its pid is gone from this machine), each report is in its log once, every report written before the
    kill is still there, the store holds ablate's files only, and status and export read the run as a local run of
    the same grid never stopped (row for row but the time columns); `--resume` of the finished run reuses every
    point."""
    import signal
    import subprocess
    import time

    storage = f"s3://runs/lab?{s3_store}"
    flags = ["--name", "k", "--no-report", "--no-dashboard", "--max-concurrent", "1", "--set", "max_steps=200"]
    flags += ["report_every=10", "--results-every", "0"]
    uri = resolve_run_dir(storage, "k")
    with ThreadPoolExecutor(1) as pool:  # the local run never stopped, beside the S3 run: most of it is waiting
        local = pool.submit(run_logged, smoke_cmd(tmp_path / "local", *flags), tmp_path / "local.log", 240)
        with (tmp_path / "first.log").open("w") as out:
            proc = subprocess.Popen(smoke_cmd(storage, *flags), stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
            deadline = time.time() + 240
            while time.time() < deadline and proc.poll() is None:
                if sum(len(v) for v in _reports(uri).values()) >= 25:  # the second trial mid-way
                    break
                time.sleep(0.2)
            assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        before = _reports(uri)
        resumed = ablate_cli(*smoke_cmd(storage, *flags)[3:], "--resume")  # in this process, on the suite's Ray
        assert resumed.returncode == 0, resumed.stderr[-4000:]
        assert "continued" in resumed.stdout and "no longer exists on this machine" in caplog.text, resumed
        code, out = local.result()
        assert code == 0, out[-3000:]
    after = _reports(uri)
    assert len(after) == 4 and all(steps == list(range(10, 201, 10)) for steps in after.values()), after
    for trial, steps in before.items():  # the last report may be replayed from the checkpoint before it
        assert after[trial][: len(steps) - 1] == steps[:-1], (trial, steps, after[trial])

    keys = _keys(uri)  # ablate's files only: every lease released, no error, nothing of Ray's
    trials = sorted({k.split("/")[0] for k in keys if k.startswith("trial_")})
    assert len(trials) == 4, keys
    others = {RUN_MARKER, PROVENANCE_FILE, ENVIRONMENT_FILE, DRIVER_LOCK}
    assert {k for k in keys if not k.startswith("trial_")} == others, keys
    assert _released(uri, DRIVER_LOCK)
    for trial in trials:
        files = [k.removeprefix(trial + "/") for k in keys if k.startswith(trial + "/")]
        entries = [f for f in files if _log_entry(f)]  # the result log: numbered entries (store/segments.py)
        assert PARAMS_FILE in files and entries, files
        assert all(f in (PARAMS_FILE, TRIAL_LOCK) or f in entries or f.endswith("/state.pt") for f in files), files
        assert TRIAL_LOCK not in files or _released(uri, f"{trial}/{TRIAL_LOCK}"), trial  # its lease released

    status = ablate_cli("status", uri)  # read back as a local run of the same grid, never stopped
    assert status.returncode == 0 and "finished: 4  running: 0  interrupted: 0" in status.stdout, status.stdout
    assert "driver:" not in status.stdout
    remote, local_df = load_results(uri), load_results(tmp_path / "local" / "k")
    pd.testing.assert_frame_equal(remote.drop(columns=_TIMING), local_df.drop(columns=_TIMING), check_exact=True)
    assert ablate_cli("export", uri, cwd=tmp_path).returncode == 0  # RUN-results.csv here, not into the store
    assert ablate_cli("export", str(tmp_path / "local" / "k"), "--out", str(tmp_path / "local.csv")).returncode == 0
    remote_csv, local_csv = (pd.read_csv(tmp_path / f).drop(columns=_TIMING) for f in ("k-results.csv", "local.csv"))
    pd.testing.assert_frame_equal(remote_csv, local_csv, check_exact=True)

    again = ablate_cli(*smoke_cmd(storage, *flags)[3:], "--resume")
    assert again.returncode == 0 and "batch_vs_dim: 4 points: 4 reused, 0 continued, 0 started" in again.stdout, again
    assert _keys(uri) == keys


_SPACE = ["lr", "lr_lambda", "lr_schedule", "batch_size", "encoder_widths", "report_every"]


def _settings(values: dict) -> str:
    """A search trial's settings as one text (encoder widths as the list, whether Optuna holds it as JSON text)."""
    widths = values["encoder_widths"]
    return json.dumps([json.loads(widths) if k == "encoder_widths" and isinstance(widths, str) else values[k]
                       for k in _SPACE])  # fmt: skip


@pytest.mark.ray
def test_a_search_on_object_storage_killed_with_kill_9_goes_on_to_its_budget(
    s3_store, tmp_path, ablate_cli, ray_session
):
    """`ablate run tune_aninfonce --scale smoke --storage s3://…` (its study an Optuna journal in the store), kill -9
    of its whole process group with two trials reporting, then `--resume`: the search goes on to its budget of 4
    distinct settings, its study (read from the store as a fresh driver reads it) and its trial folders agree, and
    the report's Optuna views read the study from the store. Then the journal deleted: the next run refuses in one
    line instead of starting a new study beside the old trials."""
    import signal
    import subprocess
    import time

    from ablate.reports.optuna_views import optuna_views
    from ablate.service.records.rundir import STUDY_JOURNAL
    from ablate.service.records.study import load_study

    storage = f"s3://runs/lab?{s3_store}"
    argv = ["run", "tune_aninfonce", "--scale", "smoke", "--storage", storage, "--name", "search"]
    argv += ["--set", "max_steps=300", "--no-report", "--no-dashboard"]
    cmd = [sys.executable, "-m", "ablate.cli", *argv]
    uri = resolve_run_dir(storage, "search")
    with (tmp_path / "first.log").open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None and len(_reports(uri)) < 2:
            time.sleep(0.2)
        assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    resumed = ablate_cli(*argv, "--resume")  # in this process, on the suite's Ray
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    study = load_study(uri, "tune_aninfonce")
    closed = set(study.user_attrs.get("ablate_continued", []))
    trials = study.get_trials(deepcopy=False)
    assert all(t.state.is_finished() for t in trials), [(t.number, t.state) for t in trials]
    counted = [_settings(t.params) for t in trials if t.number not in closed]
    assert len(counted) == 4 and len(set(counted)) == 4, counted
    store = as_store(uri)
    trial_dirs = [d for d in store.list(dirs=True) if d != f"{STUDY_JOURNAL}.d"]  # the journal's entries' folder
    folders = {_settings(json.loads(store.read_text(f"{t}/{PARAMS_FILE}"))) for t in trial_dirs}
    assert folders == set(counted), (folders, counted)
    assert not store.exists("optuna.db") and _released(uri, DRIVER_LOCK)
    views = {v.name: v for v in optuna_views(uri, "tune_aninfonce")}
    assert len(views["optimization_history"].data) == sum(t.state.name == "COMPLETE" for t in trials) > 0

    store.delete_tree(f"{STUDY_JOURNAL}.d")  # the journal: its log's entries, and an earlier version's object
    store.delete(STUDY_JOURNAL)
    line = ablate_cli(*argv, "--resume").refusal()
    assert line == (
        f"ablate: error: {uri}: optuna.journal is missing but 4 trial folder(s) of the search are here: the study "
        "that ranked them is gone, and a new one would mix with them; put optuna.journal back, or run the search "
        "under another --name"
    ), line


@pytest.mark.ray
def test_a_packed_grid_on_object_storage_stopped_by_sigterm_grows_more_seeds_in_place(
    s3_store, tmp_path, ablate_cli, ray_session
):
    """`ablate run batch_vs_lambda --pack 2 --storage s3://…` (a subprocess): a second driver on the run is refused in
    one line while it trains; SIGTERM stops it (exit 143, resumable); then the same run with a second seed
    (`--set … seeds=[0,1] --resume`, in this process) continues the stopped packs and trains the new seed's points in
    place. Every point's log holds each report once, and the export equals an unpacked local run of both seeds never
    stopped, row for row."""
    import signal
    import subprocess
    import time

    from conftest import rows_by_point

    storage = f"s3://runs/lab?{s3_store}"
    steps = ["--set", "max_steps=1200", "report_every=40"]  # 30 reports a point, long enough to stop mid-grid
    flags = ["--name", "p", "--no-report", "--no-dashboard"]
    argv = ["run", "batch_vs_lambda", "--scale", "smoke", "--storage", storage, *flags, *steps]
    uri = resolve_run_dir(storage, "p")
    log = tmp_path / "first.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "ablate.cli", *argv, "--pack", "2"], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            if sum(len(v) for v in _reports(uri).values()) >= 4:
                break
            time.sleep(0.2)
        assert proc.poll() is None, log.read_text()[-3000:]
        holder = RunReader(uri).driver()
        line = ablate_cli(*argv, "--resume").refusal()  # a second driver, while the first trains
        assert line == f"ablate: error: {busy_message(uri, holder)}", (line, holder)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 143, log.read_text()[-3000:]
    stopped = _reports(uri)
    assert 0 < sum(len(v) for v in stopped.values()) < 4 * 30 and _released(uri, DRIVER_LOCK), stopped

    grown = ablate_cli(*argv, "seeds=[0,1]", "--pack", "2", "--resume")
    assert grown.returncode == 0, grown.stderr[-3000:]
    plan = re.search(r"batch_vs_lambda: 8 points: (\d+) reused, (\d+) continued, 4 started", grown.stdout)
    # the new seed's four points start; the first seed's are continued (a pack that ended before SIGTERM is reused)
    assert plan and int(plan[2]) >= 1 and int(plan[1]) + int(plan[2]) == 4, grown.stdout
    after = _reports(uri)
    members = [k for k in after if not k.startswith("trial_pack-")]
    assert len(members) == 8 and all(after[k] == list(range(40, 1201, 40)) for k in members), after
    for trial, steps_before in stopped.items():  # the last report may be replayed from the checkpoint before it
        assert after[trial][: len(steps_before) - 1] == steps_before[:-1], (trial, steps_before, after[trial])

    local = ["run", "batch_vs_lambda", "--scale", "smoke", "--storage", str(tmp_path), *flags, *steps, "seeds=[0,1]"]
    assert ablate_cli(*local).returncode == 0  # unpacked, never stopped, in this process on the suite's Ray
    packed, solo = load_results(uri), load_results(tmp_path / "p")
    pd.testing.assert_frame_equal(rows_by_point(packed), rows_by_point(solo), check_dtype=False, check_exact=True)
