"""``--resume`` continues exactly the run that was started, or refuses and says what differs.

Ray Tune resumes a run from its own snapshot: the grid file, ``--set`` and ``--variants`` given to the resume
are not used. So a resume whose grid resolves to other trials than the run's (a changed ``--set lr=0.5``, an
edited grid file of the same name) would print the new grid and silently run the old one. At the start of a
run the marker stores the resolved trials (:func:`run_record`); :func:`check_same_run` compares the grid as it
resolves now against them (grid, scale and preset; every trial's settings; the Optuna search) and refuses with
the differences and the ways out. A marker written before this record existed is compared by its YAML text.
"""

from __future__ import annotations

import json
from typing import Any

from ablate.rundir import RunError
from ablate.service.grids import Grid, known_grids

__all__ = ["check_same_run", "differences", "run_record"]

_SHOW = 3  # trial labels or values named per difference


def _json(value: Any) -> Any:
    """``value`` as it reads back from the marker's JSON (tuples as lists, keys as text)."""
    return json.loads(json.dumps(value, default=str))


def run_record(grid: Grid) -> dict[str, Any]:
    """The marker's record of what a run resolved to: its ``--set`` settings, every trial's settings (those
    shared by all trials once, under ``common``; each trial's others under its label) and the Optuna search."""
    configs = {t.label: _json(t.config.model_dump(mode="json")) for t in grid.trials}
    first = next(iter(configs.values()), {})
    common = {k: v for k, v in first.items() if all(k in c and c[k] == v for c in configs.values())}
    own = {label: {k: v for k, v in c.items() if k not in common} for label, c in configs.items()}
    return {
        "settings": _json(grid.overrides),
        "resolved": {"common": common, "trials": own, "optuna": _json(grid.optuna_dict())},
    }


def _trials(resolved: dict[str, Any]) -> dict[str, dict[str, Any]]:
    common = resolved.get("common", {})
    return {label: {**common, **own} for label, own in resolved.get("trials", {}).items()}


def _listed(items: list[str]) -> str:
    return ", ".join(items[:_SHOW]) + (f" and {len(items) - _SHOW} more" if len(items) > _SHOW else "")


def differences(info: dict[str, Any], grid: Grid) -> list[str]:
    """What differs between the run a marker ``info`` records and ``grid`` as it resolves now (empty: the same)."""
    was = (info.get("grid"), info.get("scale"), info.get("preset"))
    if was != (grid.name, grid.scale, grid.preset):
        return [f"the run was made from grid {was[0]!r} at scale {was[1]!r} with preset {was[2]!r}, not "
                f"{grid.name!r} at {grid.scale!r} with preset {grid.preset!r}"]  # fmt: skip
    if "resolved" not in info:  # a marker from before the record: compare the grid file's text
        same = info.get("grid_yaml") in (None, grid.text)
        return [] if same else [f"the grid file {grid.path} has changed since the run started"]
    now = run_record(grid)
    old_trials, new_trials = _trials(info["resolved"]), _trials(now["resolved"])
    found = []
    gone = [label for label in old_trials if label not in new_trials]
    new = [label for label in new_trials if label not in old_trials]
    if gone or new:
        found.append(
            f"the run has {len(old_trials)} trials, the grid now resolves to {len(new_trials)}"
            + (f" (not in the run: {_listed(new)})" if new else "")
            + (f" (not in the grid now: {_listed(gone)})" if gone else "")
        )
    changed: dict[str, list[str]] = {}
    for label in (label for label in new_trials if label in old_trials):
        old, cur = old_trials[label], new_trials[label]
        for key in sorted(set(old) | set(cur)):
            if old.get(key) != cur.get(key):
                pair = f"{json.dumps(old.get(key))} -> {json.dumps(cur.get(key))}"
                if pair not in changed.setdefault(key, []):
                    changed[key].append(pair)
    found += [f"{key}: {_listed(pairs)}" for key, pairs in changed.items()]
    if info["resolved"].get("optuna") != now["resolved"]["optuna"]:
        found.append("the Optuna search settings (optuna:) differ")
    if found and info.get("settings") != now["settings"]:
        found.append(f"--set was {_set_text(info.get('settings'))}, now {_set_text(now['settings'])}")
    return found


def _set_text(settings: dict[str, Any] | None) -> str:
    if not settings:
        return "not given"
    return " ".join(f"{k}={json.dumps(v) if isinstance(v, list | dict) else v}" for k, v in settings.items())


def check_same_run(info: dict[str, Any], grid: Grid, run_dir: str) -> None:
    """Raise :class:`ablate.rundir.RunError` when ``grid`` (as now resolved, with its ``--set``) is not the run
    recorded in the marker ``info`` of ``run_dir``: naming what differs, and the ways out."""
    found = differences(info, grid)
    if not found:
        return
    shipped = str(known_grids().get(info.get("grid"), "")) == info.get("grid_file")
    started = f"ablate run {info.get('grid') if shipped else info.get('grid_file')} --scale {info.get('scale')}"
    if info.get("preset"):
        started += f" --preset {info['preset']}"
    if info.get("settings"):
        started += f" --set {_set_text(info['settings'])}"
    raise RunError(
        f"--resume: {run_dir} is another run than this command describes: {'; '.join(found)}. A resume continues "
        f"a run exactly as it started ({started} ... --resume, with the grid file as it was); to run these "
        "settings, start a new run with another --name"
    )
