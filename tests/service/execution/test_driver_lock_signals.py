"""One driver per run directory, SIGTERM handled like Ctrl-C, and a second Ctrl-C that still cleans up.

Real `ablate run` subprocesses on a real Ray, real signals, real locks (tests/conftest.py's helpers). What is
refused before Ray starts (a second driver of a locked run) and `ablate status` run in this process (conftest's
``ablate_cli``).
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
from conftest import run_logged, smoke_cmd

from ablate.service.records.rundir import DRIVER_LOCK
from ablate.service.records.store.flock import LockHeld, PidLock, lock_holder
from benchmarks.ray_nodes import node_processes

REPORTS = 8
STEPS = 5 * REPORTS


def _cmd(storage: Path, *extra: str) -> list[str]:
    """The run these tests signal; each report reaches the log as it is made (``--results-every 0``), so a test
    sees a trial half done (a smoke trial trains within one default 2 s Ray result)."""
    return smoke_cmd(
        storage, "--name", "r", "--max-concurrent", "1", "--no-report", "--results-every", "0",
        "--set", f"max_steps={STEPS}", *extra,
    )  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def _start(cmd: list[str], log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=_env(), start_new_session=True)


def _steps(run_dir: Path) -> dict[str, list[int]]:
    """Trial folder → the steps of its result.json, in order (a torn last line skipped)."""
    out = {}
    for path in sorted(run_dir.glob("trial_*/result.json")):
        steps = []
        for line in path.read_text().splitlines():
            try:
                steps.append(json.loads(line)["step"])
            except json.JSONDecodeError:
                pass
        out[path.parent.name] = steps
    return out


def _wait_for(proc: subprocess.Popen, ready, what: str, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while not ready():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.time() < deadline, f"never saw {what}"
        time.sleep(0.05)


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:100]
    except OSError:
        return "(gone)"


def _status(ablate_cli, run_dir: Path) -> str:
    done = ablate_cli("status", str(run_dir))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    return out


def test_the_lock_names_its_holder_and_dies_with_it(tmp_path):
    """A second PidLock is refused with the holder's pid and host; the kernel frees it when the holder dies."""
    path = tmp_path / "run" / DRIVER_LOCK
    holder = subprocess.Popen(
        [sys.executable, "-c", f"from ablate.service.records.store.flock import PidLock; import time; PidLock({str(path)!r}).acquire(); "
         "print('locked', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(LockHeld) as refused:
            PidLock(path).acquire()
        assert refused.value.holder["pid"] == holder.pid and refused.value.holder["host"] == socket.gethostname()
        assert lock_holder(path)["pid"] == holder.pid
    finally:
        holder.kill()
        holder.wait()
    assert lock_holder(path) is None
    with PidLock(path):
        assert lock_holder(path)["pid"] == os.getpid()
    assert lock_holder(path) is None


@pytest.mark.ray
def test_a_second_driver_and_a_resume_are_refused_while_the_first_runs(tmp_path, ablate_cli):
    run_dir = tmp_path / "r"
    first = _start(_cmd(tmp_path), tmp_path / "first.log")
    procs = [first]
    try:
        _wait_for(first, lambda: (lock_holder(run_dir / DRIVER_LOCK) or {}).get("pid") == first.pid, "the lock taken")
        expected = f"{run_dir} is being written by ablate pid {first.pid} on host {socket.gethostname()} since "
        # a second run, and a resume, while it runs: refused before Ray starts, so in this process
        for argv in (_cmd(tmp_path), _cmd(tmp_path, "--resume")):
            done = ablate_cli(*argv[3:])
            code, out = done.returncode, done.stdout + done.stderr
            assert code == 2 and expected in out and "wait for it or stop it" in out, out[-3000:]
            assert not done.ray_started
        assert first.poll() is None, "the first driver ended before the others were refused: make the run longer"
        assert first.wait(timeout=300) == 0, (tmp_path / "first.log").read_text()[-3000:]
    finally:
        for proc in procs:
            _stop(proc)
    from ablate.analysis.results import load_results

    df = load_results(run_dir)
    assert df["trial_id"].nunique() == 4 and len(list(run_dir.glob("trial_*"))) == 4
    for _, trial in df.groupby("trial_id"):
        assert trial["step"].tolist() == list(range(5, STEPS + 1, 5)), trial["step"].tolist()


@pytest.mark.ray
def test_sigterm_stops_like_ctrl_c_exit_143_and_resume_completes(tmp_path, ablate_cli):
    """What a batch scheduler sends before preemption: a graceful stop, the counts and points of what it stopped,
    the resume command, no trial left "running" without a driver, and a resume that repeats nothing."""
    run_dir, log = tmp_path / "r", tmp_path / "run.log"
    proc = _start(_cmd(tmp_path), log)
    try:
        _wait_for(proc, lambda: any(2 <= len(s) <= REPORTS - 3 for s in _steps(run_dir).values()), "a trial half done")
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        _stop(proc)
    out = log.read_text()
    assert code == 143, out[-3000:]
    assert "SIGTERM received" not in out and "Traceback" not in out, out[-3000:]  # Ray's crash dump: gone
    assert "interrupted: 1 trial(s) stopped before they finished, 3 never started (SIGTERM)" in out, out[-3000:]
    (never,) = [line for line in out.splitlines() if line.startswith("  never started: ")]
    assert never.count("batch_size=") == 3 and never.count("seed=0") == 3, never
    (resume,) = [line.strip() for line in out.splitlines() if line.strip().endswith("--resume")]
    status = _status(ablate_cli, run_dir)
    assert "finished: 0  running: 0  interrupted: 1  errored: 0  pending: 3" in status, status

    code, out = run_logged(
        [sys.executable, "-m", "ablate.cli", *resume.split()[1:]], tmp_path / "resume.log", env=_env()
    )
    assert code == 0, out[-3000:]
    steps = _steps(run_dir)
    assert len(steps) == 4 and all(s == list(range(5, STEPS + 1, 5)) for s in steps.values()), steps


@pytest.mark.ray
def test_a_second_ctrl_c_still_ends_every_process_of_the_run(tmp_path, ablate_cli):
    """Ctrl-C twice in a row at the terminal (SIGINT to the process group), then more while it shuts down:
    exit 130, no "Exception ignored" traceback, and no process of the run left (Ray's agents included)."""
    run_dir, log = tmp_path / "r", tmp_path / "run.log"
    proc = _start(_cmd(tmp_path), log)
    try:
        _wait_for(proc, lambda: any(_steps(run_dir).values()), "a first report")
        deadline = time.time() + 120
        while proc.poll() is None and time.time() < deadline:  # Ctrl-C, and again every 0.2 s until it ends
            os.killpg(proc.pid, signal.SIGINT)
            time.sleep(0.2)
        code = proc.wait(timeout=10)
        deadline = time.time() + 30
        while node_processes(proc.pid) and time.time() < deadline:
            time.sleep(0.2)
        left = {pid: _cmdline(pid) for pid in node_processes(proc.pid)}
    finally:
        _stop(proc)
    out = log.read_text()
    assert code == 130, out[-3000:]
    assert not left, f"processes of the run still alive: {left}"
    assert "Exception ignored" not in out and "Traceback" not in out, out[-3000:]
    assert "running: 0" in _status(ablate_cli, run_dir)
