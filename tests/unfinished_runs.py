"""Run folders built by hand whose trials did not all finish (issue 36): compare, the claims and the report must
read final values from the finished trials only and name the others with why. :func:`unfinished_run` is described
here; :func:`searched_run` (trials a search's scheduler stopped early) and :func:`linear_lambda_run` (two claims on
one run) at their definitions.

The ``ensemble`` grid (claim 7: InfoNCE < AnInfoNCE < ensemble), ``max_steps`` 20, reports at steps 10 and 20:

- ``infonce_0..2`` finished (R² 0.48, 0.52, 0.47);
- ``aninfonce_0..1`` finished (0.91, 0.93); ``aninfonce_2`` interrupted at step 10 with R² 0.2 there;
- ``ensemble_0`` errored: its loss went non-finite, so its last row (step 20) holds only ``member_error``, after a
  report of R² 0.3 at step 10; ``ensemble_1`` finished (0.98).
"""

from __future__ import annotations

import json
from pathlib import Path

from ablate.columns import r2_block_column
from ablate.config import RunConfig
from ablate.service.records.rundir import PARAMS_FILE, RESULT_FILE, STOPPED_FILE, TRIAL_PREFIX, write_marker
from ablate.service.records.trial_log import ERROR_KEY

MAX_STEPS = 20
FINISHED = {
    "infonce": {0: 0.48, 1: 0.52, 2: 0.47},
    "aninfonce": {0: 0.91, 1: 0.93},
    "ensemble": {1: 0.98},
}
ERRORED = "ensemble_0"
INTERRUPTED = "aninfonce_2"
NAN_ERROR = "NonFiniteLossError: loss became nan at step 13 (seed 0)"
#: What every command says of the two trials that did not finish.
LEFT_OUT = {ERRORED: "errored at step 20", INTERRUPTED: "interrupted at step 10"}


def _report(iteration: int, r2: float) -> dict:
    step = 10 * iteration
    return {
        "training_iteration": iteration,
        "step": step,
        "r2": r2,
        "eval_loss": 2.0 - r2,
        "loss_floor": 1.0,
        "lambda_hat_0": 5.0 * r2,
        "lambda_hat_1": 20.0 * r2,
    }


def _trial(root: Path, trial_id: str, rows: list[dict]) -> None:
    variant, seed = trial_id.rsplit("_", 1)
    folder = root / f"{TRIAL_PREFIX}{trial_id}"
    folder.mkdir(parents=True)
    params = {"variant": variant, "seed": int(seed), "max_steps": MAX_STEPS}
    (folder / PARAMS_FILE).write_text(json.dumps(params))
    (folder / RESULT_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))


def _stopped_by_the_scheduler(folder: Path, step: int) -> None:
    """What ablate writes beside the log of a trial its scheduler (ASHA) stopped early (ablate.service.records.rundir.STOPPED_FILE)."""
    (folder / STOPPED_FILE).write_text(json.dumps({"by": "the scheduler", "step": step}))


#: ``unfinished_run(..., scheduler_stopped=True)``'s extra trial: its scheduler stopped it at step 10 (R² 0.1 there).
SCHEDULER_STOPPED = "infonce_3"


def unfinished_run(root: Path, *, ensemble_finished: bool = True, scheduler_stopped: bool = False) -> Path:
    """The run described above under ``root``; ``ensemble_finished=False``: ``ensemble_1`` is interrupted at
    step 10 too, so no ensemble trial finished; ``scheduler_stopped=True``: a fourth InfoNCE seed
    (:data:`SCHEDULER_STOPPED`) was stopped early by a scheduler at step 10."""
    root.mkdir(parents=True, exist_ok=True)
    write_marker(str(root), {"grid": "ensemble", "scale": "smoke", "axes": ["variant", "seed"]})
    for variant, seeds in FINISHED.items():
        for seed, r2 in seeds.items():
            rows = [_report(1, r2 / 2), _report(2, r2)]
            _trial(root, f"{variant}_{seed}", rows if ensemble_finished or variant != "ensemble" else rows[:1])
    _trial(root, INTERRUPTED, [_report(1, 0.2)])
    _trial(root, ERRORED, [_report(1, 0.3), {"training_iteration": 2, "step": 20, ERROR_KEY: NAN_ERROR}])
    if scheduler_stopped:
        _trial(root, SCHEDULER_STOPPED, [_report(1, 0.1)])
        _stopped_by_the_scheduler(root / f"{TRIAL_PREFIX}{SCHEDULER_STOPPED}", 10)
    return root


# ------------------------------------------------------------------------------------------------ a search's run
#: :func:`searched_run`'s trials: lr_schedule → {trial id: (final R², reports)}; 2 reports (steps 5, 10) reach the
#: stop (max_steps 10), 1 report (step 5) is a trial ASHA stopped there.
SEARCHED = {
    "constant": {"c0": (0.60, 2), "c1": (0.64, 2), "c2": (0.20, 1)},
    "cosine": {"k0": (0.80, 2), "k1": (0.84, 2), "k2": (0.30, 1)},
}
#: What compare, the claims and the report say of the trials ASHA stopped.
SEARCH_LEFT_OUT = {
    "c2": "stopped early by the scheduler at step 5",
    "k2": "stopped early by the scheduler at step 5",
}


def searched_run(root: Path) -> Path:
    """A search's run (``tune_aninfonce`` at smoke scale: Optuna + ASHA, ``max_steps`` 10, reports every 5 steps):
    per ``lr_schedule``, two trials that reached their stop and one that ASHA stopped at step 5, with
    ``stopped.json`` beside its log (see :data:`SEARCHED`). ``ablate status`` counts all six as finished; final
    values come from the four that reached their stop."""
    root.mkdir(parents=True, exist_ok=True)
    axes = ["lr_schedule", "batch_size", "seed"]
    write_marker(str(root), {"grid": "tune_aninfonce", "scale": "smoke", "search": "optuna", "axes": axes})
    for schedule, trials in SEARCHED.items():
        for trial_id, (r2, n) in trials.items():
            folder = root / f"{TRIAL_PREFIX}{trial_id}"
            folder.mkdir(parents=True)
            params = {"lr_schedule": schedule, "batch_size": 16, "seed": 0, "max_steps": 10, "target_r2": 0.99}
            (folder / PARAMS_FILE).write_text(json.dumps(params))
            rows = [{**_report(i, r2 * i / n), "step": 5 * i} for i in range(1, n + 1)]
            (folder / RESULT_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
            if n == 1:
                _stopped_by_the_scheduler(folder, 5)
    return root


# ------------------------------------------------------------------------------------------------ two claims, one run
#: :func:`linear_lambda_run`'s trials: (variant, top of the Λ range, seed) → final R², or why it did not finish.
LINEAR = {
    ("aninfonce", 50, 0): 0.97,
    ("aninfonce", 50, 1): 0.99,
    ("aninfonce", 50, 2): "interrupted",
    ("infonce", 50, 0): 0.75,
    ("infonce", 50, 1): 0.79,
    ("aninfonce", 25, 0): 0.98,
    ("aninfonce", 25, 1): 0.96,
    ("infonce", 25, 0): 0.80,
    ("infonce", 25, 1): "errored",
    ("infonce", 25, 2): 0.78,
    ("infonce_tau0.2", 50, 0): "interrupted",
}
_LINEAR_VARIANTS = {
    "aninfonce": {"name": "aninfonce", "loss": "aninfonce"},
    "infonce": {"name": "infonce", "loss": "infonce", "tau": 1.0},
    "infonce_tau0.2": {"name": "infonce_tau0.2", "loss": "infonce", "tau": 0.2},
}
#: What each claim of the run names: claim 3 reads AnInfoNCE and InfoNCE at Λ 5 → 50, its second row at 5 → 25;
#: neither reads InfoNCE at τ = 0.2.
LINEAR_LEFT_OUT = {
    50: {"aninfonce_50_2": "interrupted at step 10"},
    25: {"infonce_25_1": "errored at step 20"},
}


def linear_lambda_run(root: Path) -> Path:
    """A ``linear_lambda`` run (d = 10, ``max_steps`` 20, reports at steps 10 and 20) that decides two claims: claim
    3 on Λ linearly 5 → 50 and its second row on 5 → 25 (the public MLP run's range). Each trial of :data:`LINEAR`
    reports R² on every Λ block; an interrupted one stopped at step 10, an errored one's loss went non-finite, so
    its last row (step 20) holds only the error. AnInfoNCE's reports carry ``lambda_rank_corr`` 0.95."""
    root.mkdir(parents=True, exist_ok=True)
    write_marker(str(root), {"grid": "linear_lambda", "scale": "smoke", "axes": ["concentration", "variant", "seed"]})
    for (variant, top, seed), end in LINEAR.items():
        params = {
            "variant": _LINEAR_VARIANTS[variant],
            "concentration": {"linspace": [5, top]},
            "latent_dim": 10,
            "seed": seed,
            "max_steps": MAX_STEPS,
        }
        lams = RunConfig.build({k: v for k, v in params.items() if k != "variant"}).lambda_true
        r2 = end if isinstance(end, float) else 0.4
        blocks = {r2_block_column(lam): r2 for lam in lams}
        if variant == "aninfonce":  # Λ̂ tracks Λ (claim 3's first check)
            blocks["lambda_rank_corr"] = 0.95
        rows = [{**_report(1, r2 / 2), **blocks}, {**_report(2, r2), **blocks}]
        if end == "interrupted":
            rows = rows[:1]
        elif end == "errored":
            rows = [rows[0], {"training_iteration": 2, "step": 20, ERROR_KEY: NAN_ERROR}]
        folder = root / f"{TRIAL_PREFIX}{variant}_{top}_{seed}"
        folder.mkdir(parents=True)
        (folder / PARAMS_FILE).write_text(json.dumps(params))
        (folder / RESULT_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


# ------------------------------------------------------------------------------------------------ a finished run
def finished_smoke_run(run_dir: Path, rows_of=None) -> list[str]:
    """batch_vs_dim at smoke scale, finished, written by hand: the marker with its points, and per point its
    params.json and a log; ``rows_of(i, point)`` gives point i's rows (default: reports at steps 5 and 10 with
    ``r2 = step / 100``). Returns the trial ids in the grid's order."""
    from ablate.service.records.plan import grid_points
    from ablate.service.specs.grids import load_grid

    grid = load_grid("batch_vs_dim", "smoke")
    return hand_made_run(run_dir, grid, grid_points(grid), rows_of)


def hand_made_run(run_dir: Path, grid, points, rows_of=None) -> list[str]:
    """A run of ``grid`` holding ``points`` (:func:`ablate.service.records.plan.grid_points`), written by hand as
    :func:`finished_smoke_run` says. Returns the trial ids in order."""
    run_dir.mkdir(parents=True)
    write_marker(
        str(run_dir),
        {"grid": grid.name, "scale": grid.scale, "axes": grid.axis_names(), "n_trials": len(points), "runs": [],
         "points": {p.trial_id: p.params for p in points}},
    )  # fmt: skip
    for i, p in enumerate(points):
        folder = run_dir / f"{TRIAL_PREFIX}{p.trial_id}"
        folder.mkdir()
        (folder / PARAMS_FILE).write_text(json.dumps(p.params, indent=2, sort_keys=True))
        rows = (
            rows_of(i, p)
            if rows_of
            else [{"step": s, "training_iteration": n + 1, "r2": s / 100} for n, s in enumerate((5, 10))]
        )
        (folder / RESULT_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [p.trial_id for p in points]
