"""`ablate slurm` on a real one-node SLURM (tests/slurm_local.py starts munged, slurmctld and slurmd here).

A smoke grid submitted with ``--submit`` runs to its end; a longer one is stopped twice mid-grid and must resume
each time with nothing lost or repeated: first as at the time limit (SLURM's USR1 warning to the batch script,
which stops the driver with SIGTERM and requeues the job itself; an "earlier driver" then still holds the run's
lock, and the next start waits for it), then by ``scontrol requeue`` (SLURM's SIGTERM to every process of the job,
Ray's included, and SIGKILL after KillWait). Skipped only where SLURM is not installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_logged
from slurm_local import INSTALL_HINT, local_slurm

from ablate.service.records.rundir import DRIVER_LOCK, PROVENANCE_FILE
from ablate.service.records.store.flock import PidLock

pytestmark = pytest.mark.ray

# 4000 steps a trial, a report every 40: about 8 s of training a trial on an idle 2-core box (1000 steps took 2-3 s,
# so the whole grid could end within the test's reaction to a count, its 0.5 s polls and the driver's stop).
STEPS, EVERY = 4000, 40
REPORTS = STEPS // EVERY
TRIALS = 4  # batch_vs_dim at smoke scale


@pytest.fixture(scope="module")
def slurm():
    if shutil.which("sbatch") is None:
        pytest.skip(f"sbatch not found: {INSTALL_HINT}")
    try:
        with local_slurm() as cluster:
            yield cluster
    except RuntimeError as exc:
        pytest.fail(f"no SLURM to test against: {exc}")


def _job(job_id: str) -> dict[str, str]:
    """scontrol's view of the job: JobState, Restarts, ExitCode, …"""
    text = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", text))


def _submit(tmp_path: Path, log: str, *extra: str) -> tuple[str, Path]:
    cmd = [
        sys.executable, "-m", "ablate.cli", "slurm", "batch_vs_dim", "--scale", "smoke", "--storage", str(tmp_path),
        "--cpus-per-node", "2", "--submit", *extra,
    ]  # fmt: skip
    code, out = run_logged(cmd, tmp_path / log, timeout=120)
    assert code == 0, out
    job_id = re.search(r"submitted batch job (\d+)", out).group(1)
    return job_id, Path(re.search(r"output: (\S+)", out).group(1))


class Watch:
    """Polls one job; every failed wait says what the job wrote and what SLURM's daemons logged."""

    def __init__(self, slurm, job_id: str, output: Path):
        self.slurm, self.job_id, self.output = slurm, job_id, output

    def text(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def fail(self, what: str) -> None:
        subprocess.run(["scancel", self.job_id], capture_output=True)
        pytest.fail(f"{what}; job {self.job_id}: {_job(self.job_id)}\n--- job output ---\n{self.text()[-6000:]}\n"
                    f"{self.slurm.logs()}")  # fmt: skip

    def until(self, ready, what: str, timeout: float = 300) -> None:
        deadline = time.time() + timeout
        while not ready():
            if time.time() > deadline:
                self.fail(f"waited {timeout:.0f} s for {what}")
            time.sleep(0.5)

    def state(self) -> str:
        return _job(self.job_id).get("JobState", "?")

    def ended(self, timeout: float = 420) -> dict[str, str]:
        self.until(lambda: self.state() in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"), "its end",
                   timeout)  # fmt: skip
        return _job(self.job_id)

    def restart_now(self, restarts: int) -> None:
        """Wait until the job is pending again after its ``restarts``-th requeue, then lift SLURM's hold on it."""
        self.until(
            lambda: self.state() == "PENDING" and int(_job(self.job_id).get("Restarts", 0)) >= restarts,
            f"the job pending again after requeue {restarts}",
        )
        subprocess.run(["scontrol", "update", f"JobId={self.job_id}", "StartTime=now"], check=True)


def _rows(run_dir: Path) -> dict[str, list[int]]:
    """Trial folder → the training_iteration of each row of its result.json (a torn last line skipped)."""
    out = {}
    for path in sorted(run_dir.glob("trial_*/result.json")):
        its = []
        for line in path.read_text().splitlines():
            try:
                its.append(json.loads(line)["training_iteration"])
            except (json.JSONDecodeError, KeyError):
                pass
        out[path.parent.name] = its
    return out


def _count(run_dir: Path) -> int:
    return sum(len(v) for v in _rows(run_dir).values())


def _check_run(run_dir: Path, reports: int, watch: Watch) -> None:
    """Every trial TERMINATED with each report once, in the result logs and in the tidy table."""
    from ablate.analysis.results import load_results

    rows = _rows(run_dir)
    if len(rows) != TRIALS or any(its != list(range(1, reports + 1)) for its in rows.values()):
        watch.fail(
            f"each trial should report 1..{reports} once: { ({k: (len(v), v[:3], v[-3:]) for k, v in rows.items()}) }"
        )
    df = load_results(run_dir)
    assert set(df["status"]) == {"TERMINATED"}, df.groupby("trial_id")["status"].first()
    for trial_id, its in df.groupby("trial_id")["training_iteration"]:
        assert list(its) == list(range(1, reports + 1)), (trial_id, list(its))


def test_a_submitted_smoke_grid_runs_to_its_end(slurm, tmp_path):
    job_id, output = _submit(tmp_path, "submit.log")
    watch = Watch(slurm, job_id, output)
    info = watch.ended()
    if info.get("JobState") != "COMPLETED" or info.get("ExitCode") != "0:0":
        watch.fail("the job did not complete")
    from ablate.service.specs.grids import load_grid

    config = load_grid("batch_vs_dim", "smoke").trials[0].config
    _check_run(tmp_path / "batch_vs_dim-smoke", reports=-(-config.max_steps // config.report_every), watch=watch)
    assert (tmp_path / "batch_vs_dim-smoke.sbatch").is_file()
    assert "--resume" not in watch.text()


def test_a_requeued_job_resumes_with_nothing_lost_or_repeated(slurm, tmp_path):
    job_id, output = _submit(tmp_path, "submit.log", "--name", "r", "--no-dashboard",
                             "--set", f"max_steps={STEPS}", f"report_every={EVERY}")  # fmt: skip
    run_dir = tmp_path / "r"
    watch = Watch(slurm, job_id, output)
    total = TRIALS * REPORTS

    # 1. the time limit's warning (USR1 to the batch script): the driver stops (exit 143), the script requeues
    watch.until(lambda: _count(run_dir) >= total // 10, "the first reports")
    subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], check=True)
    watch.until(lambda: "requeueing job" in watch.text(), "the script to requeue the job")
    assert "ablate run ended with exit code 143" in watch.text()
    first = _count(run_dir)
    assert first < total, (
        f"the grid ended before the time-limit warning: nothing to resume ({first} of {total} reports)"
    )

    # 2. an earlier driver still holds the run's lock when the job starts again: the start waits for it
    lock = PidLock(run_dir / DRIVER_LOCK)
    lock.acquire()
    try:
        watch.restart_now(1)
        watch.until(lambda: "an earlier driver still writes the run directory" in watch.text(), "the wait for the lock")
    finally:
        lock.release()

    # 3. scontrol requeue mid-grid (SIGTERM to every process of the job, SIGKILL after KillWait)
    watch.until(lambda: _count(run_dir) >= first + total // 10, "the resumed run's reports")
    second = _count(run_dir)
    assert second < total, (
        f"the grid ended before the requeue: nothing to resume ({first} reports at the time-limit "
        f"warning, {second} of {total} at the requeue)"
    )
    subprocess.run(["scontrol", "requeue", job_id], check=True)
    watch.restart_now(2)

    info = watch.ended()
    if info.get("JobState") != "COMPLETED" or info.get("ExitCode") != "0:0" or info.get("Restarts") != "2":
        watch.fail("the job did not complete after two requeues")
    _check_run(run_dir, reports=REPORTS, watch=watch)
    events = [json.loads(line)["event"] for line in (run_dir / PROVENANCE_FILE).read_text().splitlines()]
    assert events.count("start") == 1 and events.count("resume") >= 2, events
    assert watch.text().count("--resume") >= 2
