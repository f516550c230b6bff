"""`ablate run GRID GRID ...`: several grids in one process on one embedded Ray, each with its own run.

Real subprocesses of the CLI on a real local Ray; smoke grids. Refusals, before any grid starts, run in this process
(tests/conftest.py's ``ablate_cli``).
"""

from __future__ import annotations

import re
import sys

import pytest
from conftest import run_logged, smoke_cmd

from ablate.analysis.results import load_results
from ablate.service.records.reader import RunReader


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "ablate.cli", *args]


def _sessions(output: str) -> set[str]:
    """The Ray sessions (``/tmp/ray/session_...``) the run's output names."""
    return set(re.findall(r"session_\d{4}-\d\d-\d\d_[\d_-]+", output))


def test_bad_input_in_any_grid_stops_before_the_first_grid_runs(tmp_path, ablate_cli):
    runs = str(tmp_path / "runs")
    done = ablate_cli("run", "tricl", "batch_vs_dimm", "--scale", "smoke", "--storage", runs)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    (line,) = [x for x in out.splitlines() if x.startswith("ablate: error:")]
    assert line.startswith("ablate: error: unknown grid 'batch_vs_dimm' (did you mean 'batch_vs_dim'?)"), line
    assert not (tmp_path / "runs").exists(), "the first grid started although the second was invalid"
    assert not done.ray_started
    done = ablate_cli("run", "tricl", "batch_vs_dim", "--scale", "smoke", "--name", "x", "--storage", runs)
    out = done.stdout + done.stderr
    assert done.returncode == 2 and "--name 'x' names one run" in out, out
    assert not done.ray_started
    done = ablate_cli("run", "tricl", "tricl", "--scale", "smoke", "--storage", runs)
    out = done.stdout + done.stderr
    assert done.returncode == 2 and "named twice" in out, out
    assert not done.ray_started and not (tmp_path / "runs").exists()


@pytest.mark.ray
def test_two_grids_share_one_ray_and_resume_continues_started_grids_and_starts_the_others(tmp_path):
    runs = tmp_path / "runs"
    code, out = run_logged(smoke_cmd(runs, "--no-report"), tmp_path / "first.log")
    assert code == 0, out
    first = load_results(runs / "batch_vs_dim-smoke")

    # batch_vs_dim finished before; tricl never ran: --resume continues the one and starts the other
    cmd = _cli("run", "batch_vs_dim", "tricl", "--scale", "smoke", "--storage", str(runs), "--no-report", "--resume")
    code, out = run_logged(cmd, tmp_path / "both.log")
    assert code == 0, out
    assert "=== grid 1 of 2: batch_vs_dim ===" in out and "=== grid 2 of 2: tricl ===" in out
    assert "batch_vs_dim: ok, tricl: ok" in out
    assert len(_sessions(out)) == 1, f"expected one Ray session for both grids, found {_sessions(out)}"
    for name in ("batch_vs_dim-smoke", "tricl-smoke"):
        statuses = RunReader(runs / name).statuses()
        assert statuses and set(statuses.values()) == {"TERMINATED"}, (name, statuses)
    again = load_results(runs / "batch_vs_dim-smoke")
    assert len(again) == len(first), "resuming a finished grid added or dropped rows"
    assert not again.duplicated(["trial_id", "step"]).any()


def test_the_resume_command_of_several_grids_names_the_grids_still_to_run(tmp_path):
    from ablate.cli import build_parser
    from ablate.cli.run import resume_command

    args = build_parser().parse_args(
        [
            "run",
            "tricl",
            "ensemble",
            "hard_negatives",
            "--scale",
            "smoke",
            "--storage",
            str(tmp_path),
            "--set",
            "lr=0.01",
        ]
    )
    line = resume_command(args, grids=["ensemble", "hard_negatives"])
    assert line.startswith("ablate run ensemble hard_negatives --scale smoke --set lr=0.01 --storage ")
    assert "--name" not in line and line.endswith("--resume")
    one = build_parser().parse_args(["run", "tricl", "--scale", "smoke", "--storage", str(tmp_path)])
    assert f"--storage {tmp_path} --name tricl-smoke --resume" in resume_command(one, str(tmp_path / "tricl-smoke"))
