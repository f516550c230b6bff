"""A run folder built by hand whose trials did not all finish (issue 36): compare, the claims and the report must
read final values from the finished trials only and name the others with why.

The ``ensemble`` grid (claim 7: InfoNCE < AnInfoNCE < ensemble), ``max_steps`` 20, reports at steps 10 and 20:

- ``infonce_0..2`` finished (R² 0.48, 0.52, 0.47);
- ``aninfonce_0..1`` finished (0.91, 0.93); ``aninfonce_2`` interrupted at step 10 with R² 0.2 there;
- ``ensemble_0`` errored: its loss went non-finite, so its last row (step 20) holds only ``member_error``, after a
  report of R² 0.3 at step 10; ``ensemble_1`` finished (0.98).
"""

from __future__ import annotations

import json
from pathlib import Path

from ablate.rundir import PARAMS_FILE, RESULT_FILE, TRIAL_PREFIX, write_marker
from ablate.trial_log import ERROR_KEY

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


def unfinished_run(root: Path, *, ensemble_finished: bool = True) -> Path:
    """The run described above under ``root``; ``ensemble_finished=False``: ``ensemble_1`` is interrupted at
    step 10 too, so no ensemble trial finished."""
    root.mkdir(parents=True, exist_ok=True)
    write_marker(str(root), {"grid": "ensemble", "scale": "smoke", "axes": ["variant", "seed"]})
    for variant, seeds in FINISHED.items():
        for seed, r2 in seeds.items():
            rows = [_report(1, r2 / 2), _report(2, r2)]
            _trial(root, f"{variant}_{seed}", rows if ensemble_finished or variant != "ensemble" else rows[:1])
    _trial(root, INTERRUPTED, [_report(1, 0.2)])
    _trial(root, ERRORED, [_report(1, 0.3), {"training_iteration": 2, "step": 20, ERROR_KEY: NAN_ERROR}])
    return root
