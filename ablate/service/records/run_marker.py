"""The run marker after a run (``RUN_DIR/ablate_run.json``): what the runner writes as each run starts."""

from __future__ import annotations

import json
import time
from typing import Any

from ablate import __version__
from ablate.service.records.plan import Plan
from ablate.service.records.reader import read_marker
from ablate.service.records.rundir import MARKER_TIME_FORMAT, RUN_MARKER
from ablate.service.records.store import as_store
from ablate.service.specs.grids import Grid

__all__ = ["marker_after"]


def marker_after(grid: Grid, run_dir: str, plan: Plan | None, pack: int) -> dict[str, Any]:
    """The run marker after this run: the grid it ran last (name, scale, preset, YAML text, axes), every point ever
    run into the run (``points``: trial id → settings, the record readers trust) and each run's entry."""
    before = read_marker(run_dir) if as_store(run_dir).exists(RUN_MARKER) else {}
    points = dict(before.get("points") or {})
    if plan is not None:
        points.update({p.trial_id: json.loads(json.dumps(p.params, default=str)) for p in plan.points})
    runs = list(before.get("runs") or [])
    runs.append(
        {
            "grid": grid.name,
            "scale": grid.scale,
            "preset": grid.preset,
            "settings": json.loads(json.dumps(grid.overrides, default=str)),
            "variants": [v.name for v in grid.variants],
            "points": [p.trial_id for p in plan.points] if plan is not None else [],
            "plan": plan.summary() if plan is not None else None,
            "time": time.strftime(MARKER_TIME_FORMAT),
        }
    )
    about = {
        "scale": grid.scale,
        "preset": grid.preset,
        "grid_file": str(grid.path),
        "grid_yaml": grid.text,
        "search": grid.search,
        "axes": grid.axis_names(),
        "variants": [v.name for v in grid.variants],
    }
    grids = {**(before.get("grids") or {}), grid.name: about}  # each grid's own, for reading one of several
    return {
        "ablate_version": __version__,
        "grids": grids,
        "grid": grid.name,
        **about,
        "n_trials": len(_points_of(grid.name, runs)) if grid.search == "grid" else grid.n_trials,
        "created": before.get("created", time.strftime(MARKER_TIME_FORMAT)),
        "pack": pack,
        "points": points,
        "runs": runs,
    }


def _points_of(grid: str, runs: list[dict[str, Any]]) -> set[str]:
    """The ids of the points every run of ``grid`` into the run holds."""
    return {i for r in runs if r.get("grid") == grid for i in r.get("points", [])}
