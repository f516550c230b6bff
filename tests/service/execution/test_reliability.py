"""Crash tests with real processes: kill -9 a trial's worker, kill -9 the driver at random moments."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_logged, smoke_cmd

REPORTS = 12
STEPS = 5 * REPORTS


def _cmd(storage: Path, name: str, *extra: str, results_every: str = "0", dashboard: bool = False) -> list[str]:
    """The run these tests kill. Its trials send each report to Ray as it is made (``--results-every 0``), so a
    test sees a trial mid-way (a smoke trial trains in about a second, within one default 2 s result); the
    driver-kill test also runs with results that carry several reports. Without Ray's dashboard (about 2.5 s of
    each Ray start here) but where a test reads the resume command a user is shown (``dashboard=True``)."""
    return smoke_cmd(
        storage,
        "--name",
        name,
        "--max-concurrent",
        "1",
        "--set",
        f"max_steps={STEPS}",
        "--results-every",
        results_every,
        *([] if dashboard else ["--no-dashboard"]),
        *extra,
    )


def _rows(run_dir: Path) -> dict[str, list[dict]]:
    out = {}
    for d in sorted(run_dir.glob("trial_*")):
        path = d / "result.json"
        if path.exists():
            rows = []
            for line in path.read_text().splitlines():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:  # torn last line of a killed writer
                    pass
            out[d.name] = rows
    return out


def _final_by_point(run_dir: Path) -> dict[tuple, dict]:
    out = {}
    for rows in _rows(run_dir).values():
        last = rows[-1]
        cfg = last["config"]
        out[(cfg["batch_size"], cfg["latent_dim"], cfg["seed"])] = last
    return out


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def _start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(), start_new_session=True
    )


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, ray_session) -> dict[tuple, dict]:
    """The run never stopped: in this process, on the suite's Ray (its trials run in Ray's workers all the same)."""
    from ablate import cli

    storage = tmp_path_factory.mktemp("clean")
    assert cli.main(_cmd(storage, "clean")[3:]) == 0
    return _final_by_point(storage / "clean")


def _trainable_pids() -> list[int]:
    out = subprocess.run(["pgrep", "-f", "Trainable"], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out if int(p) != os.getpid()]


@pytest.mark.ray
def test_killed_worker_is_retried_from_its_checkpoint(tmp_path, uninterrupted):
    proc = _start(_cmd(tmp_path, "r"))
    run_dir = tmp_path / "r"
    killed = None
    deadline = time.time() + 240
    try:
        while time.time() < deadline and killed is None:
            partial = [k for k, v in _rows(run_dir).items() if 3 <= len(v) < REPORTS - 2]
            pids = _trainable_pids()
            if partial and pids:
                os.kill(pids[0], signal.SIGKILL)
                killed = partial[0]
            assert proc.poll() is None, "the run ended before a worker could be killed"
            time.sleep(0.05)
        assert killed, "never found a running trial to kill"
        assert proc.wait(timeout=300) == 0, "the experiment did not finish after the worker was killed"
    finally:
        _kill_group(proc)
    rows = _rows(run_dir)
    assert len(rows) == 4
    for name, trial_rows in rows.items():
        steps = sorted({r["step"] for r in trial_rows})
        assert steps == list(range(5, STEPS + 1, 5)), f"{name}: missing reports {steps}"
    assert _final_by_point(run_dir).keys() == uninterrupted.keys()
    for point, last in _final_by_point(run_dir).items():
        assert last["r2"] == uninterrupted[point]["r2"], point


def _row_key(row: dict) -> tuple:
    """A report as it was written: the same step written again (a replay, a rerun) has another time_total_s."""
    return row["step"], row["time_total_s"]


@pytest.mark.ray
@pytest.mark.parametrize(("seed", "every"), [(7, "0"), (11, "0.3")])
def test_repeated_driver_kills_never_lose_progress(tmp_path, uninterrupted, seed, every, ablate_cli):
    """Ray's experiment-restore test as the model: kill -9 the driver's process group three times at random
    moments, then --resume to the end.

    A kill often lands while Ray copies its snapshot into the run directory; resume then starts from the
    newest complete snapshot (ablate.service.snapshots) instead of letting Ray restart the grid with no parameters.
    Every report written before a kill, but each trial's last one, is still there after the resumes, as written:
    finished trials are not rerun, and a stopped trial continues from its last checkpoint, not from step 0. With
    ``every`` > 0 a Ray result carries the reports of ``every`` seconds, and a kill lands between or inside them.
    """
    rng = random.Random(seed)
    run_dir = tmp_path / "r"
    progress = 0
    kept: dict[str, set[tuple]] = {}  # trial → the reports that must survive every later resume
    for attempt in range(3):
        extra = ["--resume"] if attempt else []
        proc = _start(_cmd(tmp_path, "r", *extra, results_every=every))
        deadline = time.time() + 240
        target = progress + rng.randint(3, 8)  # kill once a few more reports landed
        while time.time() < deadline and proc.poll() is None:
            done_reports = sum(len({r["step"] for r in v}) for v in _rows(run_dir).values())
            if done_reports >= target:
                break
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.5))
        _kill_group(proc)
        rows = _rows(run_dir)
        now = sum(len({r["step"] for r in v}) for v in rows.values())
        assert now >= progress, "progress went backwards"
        progress = now
        for name, trial_rows in rows.items():  # the last report may be replayed from the checkpoint before it
            kept.setdefault(name, set()).update(_row_key(r) for r in trial_rows[:-1])
    final = ablate_cli(*_cmd(tmp_path, "r", "--resume", results_every=every)[3:])  # in this process, on the suite's Ray
    assert final.returncode == 0, final.stderr[-3000:]
    rows = _rows(run_dir)
    assert len(rows) == 4
    for name, trial_rows in rows.items():
        steps = [r["step"] for r in trial_rows]
        assert steps == list(range(5, STEPS + 1, 5)), f"{name}: duplicated or missing reports {steps}"
        lost = kept.get(name, set()) - {_row_key(r) for r in trial_rows}
        assert not lost, f"{name}: reports written before a kill were redone: {sorted(lost)}"
    final = _final_by_point(run_dir)
    assert final.keys() == uninterrupted.keys()
    for point, last in final.items():
        assert last["r2"] == uninterrupted[point]["r2"] and last["loss"] == uninterrupted[point]["loss"], point
    code, status = run_logged([sys.executable, "-m", "ablate.cli", "status", str(run_dir)], tmp_path / "status.log")
    assert code == 0 and "finished: 4  running: 0  interrupted: 0" in status, status


@pytest.mark.ray
def test_ctrl_c_leaves_an_honest_status_exit_130_and_ablate_s_resume_command(tmp_path, uninterrupted):
    """A real Ctrl-C (SIGINT to the driver's process group, as a terminal sends it) mid-grid, then the printed
    resume command: the stopped trials read INTERRUPTED everywhere, and the resume loses and repeats nothing."""
    from ablate.analysis.results import load_results

    log_path = tmp_path / "run.log"
    run_dir = tmp_path / "r"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            _cmd(tmp_path, "r", dashboard=True),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_env(),
            start_new_session=True,
        )
        try:
            deadline = time.time() + 180
            while time.time() < deadline:
                rows = _rows(run_dir)
                if any(len(v) == REPORTS for v in rows.values()) and any(
                    3 <= len(v) < REPORTS - 2 for v in rows.values()
                ):
                    break
                assert proc.poll() is None, "the run ended before it could be interrupted"
                time.sleep(0.05)
            os.killpg(proc.pid, signal.SIGINT)
            code = proc.wait(timeout=60)
        finally:
            _kill_group(proc)
    out = log_path.read_text()
    assert code == 130, out[-3000:]
    summary = out[out.index("summary (") :]
    assert "INTERRUPTED" in summary and "interrupted: 1 trial(s) stopped before they finished" in out, out[-3000:]
    assert summary.count("TERMINATED") == 1, summary  # only the finished trial reads as finished
    (resume,) = [line.strip() for line in out.splitlines() if line.strip().endswith("--resume")]
    assert resume.startswith("ablate run batch_vs_dim --scale smoke --set max_steps=60 --storage ")
    assert "--name r --max-concurrent 1 --resume" in resume, resume

    code, status = run_logged([sys.executable, "-m", "ablate.cli", "status", str(run_dir)], tmp_path / "status.log")
    assert code == 0 and "finished: 1  running: 0  interrupted: 1" in status, status
    assert "INTERRUPTED" in set(load_results(run_dir)["status"])

    words = resume.split()
    code, out = run_logged([sys.executable, "-m", "ablate.cli", *words[1:]], tmp_path / "resume.log", env=_env())
    assert code == 0, out[-3000:]
    rows = _rows(run_dir)
    assert len(rows) == 4
    for name, trial_rows in rows.items():
        assert [r["step"] for r in trial_rows] == list(range(5, STEPS + 1, 5)), f"{name}: duplicated or missing"
    for point, last in _final_by_point(run_dir).items():
        assert last["r2"] == uninterrupted[point]["r2"] and last["loss"] == uninterrupted[point]["loss"], point
    code, status = run_logged([sys.executable, "-m", "ablate.cli", "status", str(run_dir)], tmp_path / "status2.log")
    assert "finished: 4  running: 0  interrupted: 0" in status, status


@pytest.mark.ray
def test_sparse_checkpoints_resume_after_kill_9_to_the_same_numbers(tmp_path, uninterrupted, ablate_cli):
    """--checkpoint-every 3600: a trial checkpoints its first report and its last only. kill -9 of the driver
    mid-trial, then --resume: the cut trial continues from its first report's checkpoint, the reports after it are
    trained again to the same numbers, and each step is in the log once."""
    run_dir = tmp_path / "r"
    proc = _start(_cmd(tmp_path, "r", "--checkpoint-every", "3600"))
    try:
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None:
            if any(4 <= len(v) < REPORTS for v in _rows(run_dir).values()):
                break
            time.sleep(0.05)
    finally:
        _kill_group(proc)
    for trial in run_dir.glob("trial_*"):
        steps = sorted(int(p.name.removeprefix("checkpoint_")) for p in trial.glob("checkpoint_*"))
        logged = [r["step"] for r in _rows(run_dir).get(trial.name, [])]
        if logged and logged[-1] == STEPS:
            assert steps == [5, STEPS], (trial.name, steps)
        elif logged:  # the first report's checkpoint, and none after it (the last report's write may be in flight)
            assert steps[:1] == [5] and all(s == 5 for s in steps), (trial.name, steps, logged)
    resumed = ablate_cli(*_cmd(tmp_path, "r", "--checkpoint-every", "3600", "--resume")[3:])  # on the suite's Ray
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for name, trial_rows in _rows(run_dir).items():
        assert [r["step"] for r in trial_rows] == list(range(5, STEPS + 1, 5)), f"{name}: duplicated or missing"
    for point, last in _final_by_point(run_dir).items():
        assert last["r2"] == uninterrupted[point]["r2"] and last["loss"] == uninterrupted[point]["loss"], point


@pytest.fixture()
def small_disk(tmp_path):
    """A 3 MB tmpfs (mounting needs root), unmounted afterwards."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.ray
def test_full_disk_ends_with_one_line_and_resume_loses_nothing(tmp_path, small_disk, uninterrupted):
    """Storage with ~270 kB free fills mid-grid: one line says what could not be written and how to resume,
    no traceback, exit 1; once space is freed the printed command completes every trial, nothing lost."""
    from ablate.analysis.results import load_results

    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (2800 * 1024))
    code, out = run_logged(_cmd(small_disk, "r", dashboard=True), tmp_path / "full.log", timeout=180, env=_env())
    assert code == 1, out[-3000:]
    assert "Traceback" not in out, out[-5000:]
    (line,) = [x for x in out.splitlines() if x.startswith("ablate: error:")]
    assert "No space left on device" in line and "nothing finished was lost" in line, line
    assert line.endswith(f"--storage {small_disk} --name r --max-concurrent 1 --resume"), line
    full = [x for x in out.splitlines() if "No space left" in x]
    assert len(full) <= 3, full  # the reason, once each from the snapshot backup, the trials and the end

    filler.unlink()
    resume = line[line.index("ablate run ") :].split()
    code, out = run_logged([sys.executable, "-m", "ablate.cli", *resume[1:]], tmp_path / "resume.log", env=_env())
    assert code == 0, out[-3000:]
    df = load_results(small_disk / "r")
    assert set(df["status"]) == {"TERMINATED"}
    for _, trial in df.groupby("trial_id"):
        assert trial["step"].tolist() == list(range(5, STEPS + 1, 5)), trial["step"].tolist()
    for point, last in _final_by_point(small_disk / "r").items():
        assert last["r2"] == uninterrupted[point]["r2"] and last["loss"] == uninterrupted[point]["loss"], point


def test_a_sigterm_exit_inside_a_weakref_callback_prints_nothing_other_errors_still_print():
    """The trial actor's hook drops the 'Exception ignored' traceback of Ray's SIGTERM SystemExit (seen when a
    full disk ended a run in CI) and nothing else: a real weakref callback in a fresh interpreter."""
    script = """
import sys, weakref
from ablate import ray_compat
ray_compat.quiet_exit_on_sigterm()
class Box: pass
def make(exc):
    def callback(ref):
        raise exc
    return callback
for exc in (SystemExit(1), ValueError("kept")):
    box = Box()
    ref = weakref.ref(box, make(exc))
    del box
print("alive")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "alive", done.stderr
    assert "SystemExit" not in done.stderr, done.stderr
    assert "Exception ignored" in done.stderr and "ValueError: kept" in done.stderr, done.stderr
