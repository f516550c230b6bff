"""A trial's record over the run directory's store (issue "The run record on object storage"): one scenario run on a
:class:`LocalStore` in a temporary folder and on a :class:`CloudStore` on a real S3 server (moto's, on 127.0.0.1:
tests/s3_server.py). Its params, pack, error, stopped and best files, its result log (append, torn line, cut,
rewrite) and its checkpoints (retention, a damaged newest one, drops) read back the same on both, and the files
hold the very bytes the local record wrote before it went through the store (the literals below). No Ray."""

from __future__ import annotations

import io
import logging
import math
import os
import threading
import time

import numpy as np
import pytest
import s3_server
import torch
from s3_server import fresh_s3_uri

from ablate.service.records.checkpoint_writer import CheckpointWriter
from ablate.service.records.record import TRIAL_LOCK, RunRecord, TrialRecord
from ablate.service.records.store import CloudStore, LocalStore, Store, as_store
from ablate.service.records.store.flock import PidLock
from ablate.service.records.store.lease import Lease
from ablate.service.records.trial import checkpoint_names, load_state

CKPT = "checkpoint_{:09d}"

s3_query = s3_server.s3_query  # the module's S3 server (a fixture)


@pytest.fixture(params=["local", "s3"])
def run(request, tmp_path) -> Store:
    """An empty run directory's store: a local folder, or a fresh prefix of a bucket on the S3 server."""
    if request.param == "local":
        return LocalStore(tmp_path / "run")
    return CloudStore(fresh_s3_uri(request.getfixturevalue("s3_query")))


def _files(store: Store, folder: str = "") -> list[str]:
    """Every file under ``folder`` of ``store``, as keys relative to it."""
    out = [f"{folder}/{n}".lstrip("/") for n in store.list(folder, dirs=False)]
    for sub in store.list(folder, dirs=True):
        out += _files(store, f"{folder}/{sub}".lstrip("/"))
    return sorted(out)


def _state(step: int) -> dict:
    return {"step": step, "w": torch.full((3,), float(step))}


def test_a_record_s_json_files_hold_the_bytes_the_local_record_wrote(run):
    trial = TrialRecord(run, "x")
    assert not trial.has_params() and trial.read_params() is None and trial.read_pack() is None
    trial.write_params({"b": 1, "a": {"z": 0.5, "y": [1, 2]}, "name": "τ"})
    assert trial.has_params() and trial.read_params() == {"b": 1, "a": {"z": 0.5, "y": [1, 2]}, "name": "τ"}
    assert run.read_text("trial_x/params.json") == (
        '{\n  "a": {\n    "y": [\n      1,\n      2\n    ],\n    "z": 0.5\n  },\n  "b": 1,\n  "name": "\\u03c4"\n}'
    )
    trial.write_error("x" * 2500 + "boom", 2)
    assert run.read_text("trial_x/error.json") == '{\n "error": "' + "x" * 1996 + 'boom",\n "failures": 2\n}'
    trial.write_stopped("the scheduler", 15)
    assert run.read_text("trial_x/stopped.json") == '{\n "by": "the scheduler",\n "step": 15\n}'
    assert _files(run) == ["trial_x/error.json", "trial_x/params.json", "trial_x/stopped.json"]  # no temporary
    trial.clear_error()
    trial.clear_stopped()
    trial.clear_stopped()  # a missing one is fine
    assert _files(run) == ["trial_x/params.json"]

    TrialRecord(run, "gone").write_error("boom", 1)  # no folder: nothing written
    assert run.list(dirs=True) == ["trial_x"]

    pack = TrialRecord(run, "pack-abc")
    pack.write_pack(["m1", "m2"])
    assert run.read_text("trial_pack-abc/pack.json") == '{\n  "members": [\n    "m1",\n    "m2"\n  ]\n}'
    assert pack.read_pack() == ["m1", "m2"]
    record = RunRecord(run)
    record.write_best({"metric": "r2", "value": 0.5, "config": {"lr": 0.001}})
    assert (
        run.read_text("best_config.json") == '{\n "metric": "r2",\n "value": 0.5,\n "config": {\n  "lr": 0.001\n }\n}'
    )
    assert [t.id for t in record.trials()] == ["pack-abc", "x"]
    assert [t.id for t in record.points()] == ["x"] and [t.id for t in record.packs()] == ["pack-abc"]


def _log(store: Store) -> str | None:
    data = store.read_log("trial_x/result.json")
    return None if data is None else data.decode()


def test_the_result_log_appends_cuts_a_torn_line_and_is_cut_back_and_rewritten(run):
    """The store's log: on disk one file appended to (a line a kill cut is cut at the next append); in a bucket
    numbered entries written create-only (a whole entry or none: nothing torn)."""
    trial = TrialRecord(run, "x")
    assert trial.rows() == [] and trial.last_row() is None and trial.last_step() is None and trial.cut(5) == (0, 0)
    assert _log(run) is None and _files(run) == []  # cutting no log writes none
    trial.make()
    for i in range(1, 6):
        trial.append({"step": 5 * i, "r2": np.float32(0.25 * i), "loss": math.nan if i == 5 else 1.0 / i})
    lines = [
        '{"step": 5, "r2": 0.25, "loss": 1.0}',
        '{"step": 10, "r2": 0.5, "loss": 0.5}',
        '{"step": 15, "r2": 0.75, "loss": 0.3333333333333333}',
        '{"step": 20, "r2": 1.0, "loss": 0.25}',
        '{"step": 25, "r2": 1.25, "loss": NaN}',
    ]
    assert _log(run) == "".join(line + "\n" for line in lines)
    assert [r["step"] for r in trial.rows()] == [5, 10, 15, 20, 25] and trial.last_step() == 25
    assert trial.last_row()["r2"] == 1.25

    if isinstance(run, LocalStore):
        run.write_text("trial_x/result.json", _log(run) + '{"step": 30, "r2"')  # a kill mid-line
        assert trial.last_step() == 25 and len(trial.raw_rows()) == 5
    trial.append({"step": 30, "r2": 1.5})
    lines.append('{"step": 30, "r2": 1.5}')
    assert _log(run) == "".join(line + "\n" for line in lines)

    assert trial.cut(15) == (6, 3)
    assert _log(run) == "".join(line + "\n" for line in lines[:3])
    assert trial.cut(15) == (3, 3) and trial.last_step() == 15

    trial.rewrite([{"step": 5}, {"step": 10}, {"step": 5}])  # a row out of order: not intact
    assert _log(run) == '{"step": 5}\n{"step": 10}\n{"step": 5}\n'
    assert [r["step"] for r in trial.rows()] == [5, 10] and [r["step"] for r in trial.raw_rows()] == [5, 10, 5]
    assert trial.cut(100) == (3, 2)
    assert _log(run) == '{"step": 5}\n{"step": 10}\n'
    files = _files(run)
    assert files == ["trial_x/result.json"] if isinstance(run, LocalStore) else len(files) == 1, files

    again = TrialRecord(run.uri, "x")  # the same record by its path or URI
    assert again.rows() == trial.rows() and str(again.folder) == str(trial.folder)


def test_checkpoints_keep_the_newest_and_the_logged_one_and_resume_past_a_damaged_one(run, caplog):
    trial = TrialRecord(run, "x")
    for step, logged in ((5, None), (10, 5), (15, 5), (20, 5)):
        where = trial.write_checkpoint(_state(step), keep=2, logged=logged)
        assert str(where) == run.join("trial_x", CKPT.format(step))
    # keep=2: the newest two, and the newest at or before the logged step 5 (the one a resume continues from)
    names = [CKPT.format(s) for s in (20, 15, 5)]
    assert checkpoint_names(trial.checkpoints) == names
    assert _files(run) == sorted(f"trial_x/{n}/state.pt" for n in names)
    for step in (20, 15, 5):
        buffer = io.BytesIO()
        torch.save(_state(step), buffer)  # one torch.save, written as it is
        assert run.read_bytes(f"trial_x/{CKPT.format(step)}/state.pt") == buffer.getvalue()
    assert torch.equal(load_state(CKPT.format(15), store=trial.checkpoints)["w"], torch.full((3,), 15.0))

    covered = lambda state: state["step"] in (5, 15, 20)  # noqa: E731
    assert trial.resume_point(covered)["step"] == 20
    run.write_bytes(f"trial_x/{CKPT.format(20)}/state.pt", b"garbage")  # a damaged newest checkpoint
    run.write_bytes(f"trial_x/{CKPT.format(25)}/notes.txt", b"")  # a checkpoint folder without its state
    with caplog.at_level(logging.INFO, logger="ablate.service.records.trial"):
        state = trial.resume_point(covered)
    assert state["step"] == 15 and torch.equal(state["w"], torch.full((3,), 15.0))
    damaged = run.join("trial_x", CKPT.format(20), "state.pt")
    (warned,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned.startswith(f"checkpoint {damaged} cannot be loaded (") and warned.endswith(
        "; trying an earlier checkpoint"
    )
    assert CKPT.format(25) not in caplog.text  # a folder without its state is passed over without a word
    assert trial.resume_point(lambda s: s["step"] == 5)["step"] == 5 and trial.resume_point(lambda s: False) is None

    assert trial.drop_checkpoints_after(15) == [CKPT.format(25), CKPT.format(20)]
    assert checkpoint_names(trial.checkpoints) == [CKPT.format(15), CKPT.format(5)]
    assert trial.drop_checkpoints_after(None) == [CKPT.format(15), CKPT.format(5)]
    assert checkpoint_names(trial.checkpoints) == [] and _files(run) == []


def test_the_background_writer_writes_into_the_trial_s_store(run):
    trial = TrialRecord(run, "x")
    writer = CheckpointWriter(trial.checkpoints, keep=2)
    assert writer.trial_dir == trial.folder  # what the Trainable compares to find its writer
    for step in (5, 10, 15):
        writer.submit(_state(step), logged=step - 5 or None, wait=step == 15)
    assert checkpoint_names(trial.checkpoints) == [CKPT.format(15), CKPT.format(10)]
    assert trial.resume_point(lambda s: True)["step"] == 15


def test_a_trial_waits_for_its_folder_s_lock_or_lease_and_says_so(run):
    """Locally an flock; on object storage a lease (an object at .trial.lock) with a heartbeat: a second holder waits
    while the first holds it, saying so, and takes it once the first lets it go."""
    trial = TrialRecord(run, "x")
    first = trial.hold()
    if isinstance(run, LocalStore):
        assert isinstance(first, PidLock)
    else:
        assert isinstance(first, Lease) and first.held and run.list("trial_x", dirs=False) == [TRIAL_LOCK]
    assert run.lock_holder(f"trial_x/{TRIAL_LOCK}", ttl_s=60)["pid"] == os.getpid()
    said: list[str] = []
    second: list = []
    waiter = threading.Thread(
        target=lambda: second.append(
            trial.hold(lambda held, waited: said.append(str(held)), say_every_s=0.0)
        )  # fmt: skip
    )
    waiter.start()
    deadline = time.monotonic() + 10
    while not said and time.monotonic() < deadline:
        time.sleep(0.05)
    assert said and "is held by pid" in said[0], said
    first.check()
    first.release()
    waiter.join(timeout=20)
    assert second, "the second holder took it"
    second[0].check()
    assert run.lock_holder(f"trial_x/{TRIAL_LOCK}", ttl_s=60)["pid"] == os.getpid()
    second[0].release()
    assert run.lock_holder(f"trial_x/{TRIAL_LOCK}", ttl_s=60) is None  # released (in a bucket: a tombstone)
    if not isinstance(run, LocalStore):
        assert run.list("trial_x", dirs=False) == [TRIAL_LOCK]


def test_a_remote_run_directory_is_opened_once_per_process(s3_query):
    uri = fresh_s3_uri(s3_query)
    assert as_store(uri) is as_store(uri) and TrialRecord(uri, "a").store is TrialRecord(uri, "b").store
    store = as_store(uri)
    assert as_store(store) is store and isinstance(TrialRecord(uri, "a").checkpoints, Store)
    assert TrialRecord(uri, "a").folder == store.join("trial_a") and RunRecord(uri).dir == uri


def test_a_trial_killed_mid_upload_of_a_checkpoint_keeps_the_one_before(s3_query):
    """A trial's process killed with SIGKILL while its writer thread uploads a large checkpoint to S3 (a multipart
    upload, seen in progress on the server): the new checkpoint never appears, the one before it loads, and the
    resume point is that one. The parts the kill left behind are invisible to every reader (docs/clusters.md: a
    bucket lifecycle rule aborts them)."""
    import signal
    import subprocess
    import sys
    import textwrap
    from urllib.parse import parse_qs, urlsplit

    import boto3

    from ablate.service.records.trial import resume_point

    uri = fresh_s3_uri(s3_query)
    trial = as_store(uri).join("trial_a")
    child = textwrap.dedent(
        f"""
        import sys, torch
        from ablate.service.records.checkpoint_writer import CheckpointWriter
        from ablate.service.records.trial import write_checkpoint
        write_checkpoint({trial!r}, {{"step": 5, "w": torch.ones(10)}}, keep=2)
        CheckpointWriter({trial!r}, keep=2).submit({{"step": 10, "w": torch.randn(40_000_000)}}, logged=5)  # 160 MB
        sys.stdin.read()  # until killed
        """
    )
    query = parse_qs(urlsplit(uri).query)
    s3 = boto3.client("s3", endpoint_url=f"{query['scheme'][0]}://{query['endpoint_override'][0]}")
    prefix = urlsplit(trial).path.lstrip("/") + "/"
    proc = subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while not s3.list_multipart_uploads(Bucket="runs", Prefix=prefix).get("Uploads"):
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read().decode()[-3000:]
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert checkpoint_names(trial) == [CKPT.format(5)]
    state = resume_point(trial, lambda s: True)
    assert state is not None and state["step"] == 5 and torch.equal(state["w"], torch.ones(10))
    assert s3.list_multipart_uploads(Bucket="runs", Prefix=prefix).get("Uploads")  # left for the lifecycle rule
