"""Load: a grid of 200 smoke-size trials on 2 CPUs loses no result and keeps files per trial bounded."""

from __future__ import annotations

from ablate.analysis.results import load_results
from ablate.service.execution.runner import run_grid
from ablate.service.specs.grids import load_grid

#: Files a finished trial leaves in a local run directory: params.json, result.json (ablate's append-only
#: result log) and the two kept checkpoints of state.pt + config.json (no TensorBoard files unless
#: --tensorboard).
MAX_FILES_PER_TRIAL = 6


def test_two_hundred_trials_lose_nothing(ray_session, tmp_path):
    grid = load_grid("batch_vs_dim", "smoke")
    grid.axes = {"batch_size": [8, 12, 16, 20, 24, 28, 32, 36, 40, 44], "latent_dim": [2, 3, 4, 5, 6]}
    grid.seeds = [0, 1, 2, 3]
    grid.base.update({"report_every": 4, "eval_samples": 64})
    grid.stop.max_steps = 12
    assert grid.n_trials == 200
    outcome = run_grid(grid, storage=str(tmp_path), name="load", verbose=0)
    assert not outcome.failed, [t.error for t in outcome.failed][:3]
    df = load_results(outcome.run_dir)
    assert df["trial_id"].nunique() == 200
    assert len(df) == 200 * 3, "one row per trial per report"
    assert (df.groupby("trial_id")["step"].max() == 12).all()
    for trial_dir in outcome.run_dir.glob("trial_*"):
        files = [p for p in trial_dir.rglob("*") if p.is_file()]
        assert len(files) <= MAX_FILES_PER_TRIAL, (trial_dir.name, sorted(p.name for p in files))
