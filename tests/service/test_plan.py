"""The run plan (:func:`ablate.service.records.plan.plan_run`) decided from trial folders the test writes, without Ray:
what running a grid into an existing run directory does to each point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ablate.rundir import PARAMS_FILE, RESULT_FILE, TRIAL_PREFIX, RunError
from ablate.service.records.plan import grid_points, plan_run
from ablate.service.specs.grids import load_grid


def _grid(max_steps: int | None = None):
    grid = load_grid("batch_vs_dim", "smoke")
    if max_steps is not None:
        grid.apply_settings({"max_steps": max_steps}, "--set", axes_win=False)
    return grid


def _finished_run(run_dir: Path, steps: int, report_every: int = 5) -> list[str]:
    """Trial folders of every point of the smoke grid, each with a log of reports up to ``steps``."""
    ids = []
    for point in grid_points(_grid()):
        folder = run_dir / f"{TRIAL_PREFIX}{point.trial_id}"
        folder.mkdir(parents=True)
        (folder / PARAMS_FILE).write_text(json.dumps(point.params, indent=2, sort_keys=True))
        rows = [
            {"step": s, "training_iteration": i + 1, "r2": 0.5}
            for i, s in enumerate(range(report_every, steps + 1, report_every))
        ]
        (folder / RESULT_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
        ids.append(point.trial_id)
    return ids


def _snapshot(run_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(run_dir)): p.read_text() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_a_finished_run_is_reused_point_for_point(tmp_path):
    ids = _finished_run(tmp_path, 10)
    plan = plan_run(_grid(), tmp_path)
    assert sorted(plan.reused) == sorted(ids) and not plan.continued and not plan.started and not plan.units


def test_a_higher_max_steps_continues_every_finished_trial(tmp_path):
    ids = _finished_run(tmp_path, 10)
    plan = plan_run(_grid(20), tmp_path)
    assert sorted(plan.continued) == sorted(ids) and not plan.reused


def test_a_lower_max_steps_than_the_run_trained_is_refused_before_anything_is_written(tmp_path):
    """It used to say "4 reused" and leave the marker at the lower budget while each params.json kept the higher
    one, so status, export and the report left out every trial."""
    _finished_run(tmp_path, 10)
    before = _snapshot(tmp_path)
    with pytest.raises(RunError) as refused:
        plan_run(_grid(5), tmp_path)
    message = str(refused.value)
    assert message.startswith("max_steps 5: 4 trial(s) of this run trained past it (trial_"), message
    assert message.endswith(
        "to step 10); a run keeps what it trained: run it with max_steps >= 10, or start a new run with another --name"
    )
    assert _snapshot(tmp_path) == before
