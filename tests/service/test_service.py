"""The Ray Tune service end to end: every shipped grid at smoke scale, resume, save/restore, bad grids."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from conftest import run_logged, runs_root, smoke_cmd, smoke_run

from ablate import cli
from ablate.service.grids import GridError, known_grids, load_grid, n_reports
from ablate.service.optuna_spec import Choice
from ablate.service.runner import run_grid
from ablate.service.trainable import CHECKPOINT_FILE

pytestmark = pytest.mark.slow


def _rows(trial_dir: Path) -> list[dict]:
    path = trial_dir / "result.json"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("name", sorted(known_grids()))
def test_every_grid_runs_through_the_cli_at_smoke_scale(name, ray_session, tmp_path_factory):
    """Every shipped grid, search grids included, through `ablate run` with its live progress table (the run is
    shared with test_report's checks of the same grid: the smoke matrix runs once per session)."""
    grid = load_grid(name, "smoke")
    run_dir = smoke_run(name, runs_root(tmp_path_factory))  # asserts exit code 0
    trial_dirs = sorted(p for p in run_dir.glob("trial_*") if p.is_dir())
    assert len(trial_dirs) == grid.n_trials
    for trial_dir in trial_dirs:
        rows = _rows(trial_dir)
        params = json.loads((trial_dir / "params.json").read_text())
        from ablate.service.params import config_from_params

        expected = n_reports(config_from_params(params))
        if grid.search == "optuna":  # ASHA may stop a trial early
            assert 1 <= len(rows) <= expected
        else:
            assert len(rows) == expected, f"{trial_dir.name}: one row per report"
        steps = [r["step"] for r in rows]
        assert steps == sorted(set(steps)), "no duplicated or missing reports"
        # R² on held-out samples is finite and at most 1 (it may be negative early on), and MCC is a correlation
        assert all(math.isfinite(r["r2"]) and r["r2"] <= 1.0 for r in rows), [r["r2"] for r in rows]
        assert all(0.0 <= r["mcc"] <= 1.0 + 1e-6 for r in rows), [r["mcc"] for r in rows]
        assert list(trial_dir.glob(f"checkpoint_*/{CHECKPOINT_FILE}")), "a checkpoint was written"
    if grid.search == "optuna":
        best = json.loads((run_dir / "best_config.json").read_text())
        assert set(best["config"]) <= set(grid.optuna.space)
        assert all(
            best["config"][k] in getattr(grid.optuna.space[k], "choice", [best["config"][k]]) for k in best["config"]
        )


def test_trainable_save_restore_round_trip(tmp_path):
    from ablate.service.trainable import AblateTrainable

    grid = load_grid("batch_vs_dim", "smoke")
    params = {"grid": "batch_vs_dim", **grid.base, "max_steps": 40, "batch_size": 32, "latent_dim": 3, "seed": 1}
    straight = AblateTrainable(config=params)
    first = [straight.train() for _ in range(4)]

    interrupted = AblateTrainable(config=params)
    for _ in range(2):
        interrupted.train()
    interrupted.save_checkpoint(str(tmp_path))
    resumed = AblateTrainable(config=params)
    resumed.load_checkpoint(str(tmp_path))
    later = [resumed.train() for _ in range(2)]
    for a, b in zip(first[2:], later):
        assert a["step"] == b["step"]
        for key in ("r2", "loss", "mcc", "eval_loss", "lambda_hat_0"):
            assert a[key] == b[key], key
    assert "R²=" in repr(resumed) and "latent_dim=3" in repr(resumed)
    for t in (straight, interrupted, resumed):
        t.stop()


def _trial_rows(run_dir: Path) -> dict[str, list[dict]]:
    out = {}
    for d in run_dir.glob("trial_*"):
        if (d / "result.json").exists():
            out[d.name] = _rows(d)
    return out


def test_resume_after_driver_kill(tmp_path):
    """kill -9 the whole `ablate run` process group mid-grid, then --resume: finished trials are not rerun."""
    reports = 12
    cmd = smoke_cmd(tmp_path, "--name", "r", "--max-concurrent", "1", "--set", f"max_steps={5 * reports}")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    run_dir = tmp_path / "r"
    deadline = time.time() + 240
    try:
        while time.time() < deadline:
            rows = _trial_rows(run_dir)
            done = [k for k, v in rows.items() if len(v) >= reports]
            partial = [k for k, v in rows.items() if 2 <= len(v) < reports]
            if done and partial:
                break
            assert proc.poll() is None, "the run ended before it could be interrupted"
            time.sleep(0.05)
        else:
            pytest.fail("the run never reached a state with one finished and one partial trial")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = _trial_rows(run_dir)
    finished = {k: len(v) for k, v in before.items() if len(v) >= reports}
    checkpoints = {
        k: sorted(int(p.name.split("_")[1]) for p in (run_dir / k).glob("checkpoint_*"))
        for k, v in before.items()
        if len(v) < reports
    }

    code, out = run_logged(cmd + ["--resume"], tmp_path / "resume.log", env=env)
    assert code == 0, out[-3000:]
    after = _trial_rows(run_dir)
    assert len(after) == 4
    for k, n in finished.items():
        assert len(after[k]) == n, f"finished trial {k} was rerun"
    for k, ckpts in checkpoints.items():
        steps = [r["step"] for r in after[k]]
        assert steps[-1] == 5 * reports
        if ckpts and len(before[k]) > 0:
            resumed_rows = after[k][len(before[k]) :]
            # the first report after the resume continues from the last checkpoint, not from step 0
            assert resumed_rows[0]["step"] > 5, f"{k} restarted from scratch: {steps}"
            assert resumed_rows[0]["step"] <= before[k][-1]["step"] + 5, f"{k} skipped reports: {steps}"
    code, out = run_logged([sys.executable, "-m", "ablate.cli", "status", str(run_dir)], tmp_path / "status.log")
    assert code == 0 and "finished: 4" in out, out


BAD_GRIDS = {
    "unknown key": ("bogus: 1\n", "bogus: unknown key"),
    "wrong type": ("base: {batch_size: big}\n", "batch_size"),
    "empty axis": ("axes: {batch_size: []}\n", "axes.batch_size: empty axis"),
    "lambda <= 0": ("base: {concentration: -1}\n", "concentration"),
    "batch < 2": ("base: {batch_size: 1}\n", "batch_size"),
    "d < 2": ("base: {latent_dim: 1}\n", "latent_dim"),
    "lambda list length": ("base: {latent_dim: 3, concentration: [1, 2]}\n", "latent_dim=3"),
    "unknown setting": ("base: {learning_rate: 1}\n", "base.learning_rate: unknown setting"),
    "steps < 1": ("stop: {max_steps: 0}\n", "stop.max_steps: must be an integer >= 1"),
    "acceptance too low": ("base: {latent_dim: 64, concentration: 0.5}\n", "acceptance"),
    "reversed range": ("search: optuna\noptuna: {space: {lr: {uniform: [1, 0]}}}\n", "empty or reversed range"),
    "empty choice": ("search: optuna\noptuna: {space: {batch_size: {choice: []}}}\n", "non-empty list"),
    "unknown distribution": ("search: optuna\noptuna: {space: {lr: {normal: [0, 1]}}}\n", "optuna.space.lr"),
    "time budget <= 0": (
        "search: optuna\noptuna: {space: {lr: {uniform: [0, 1]}}, time_budget_s: 0}\n",
        "optuna.time_budget_s: must be a number of seconds > 0",
    ),
    "grace beyond the time budget": (
        "search: optuna\noptuna: {space: {lr: {uniform: [0, 1]}}, time_budget_s: 30, grace_period: 60}\n",
        "optuna.grace_period: with time_budget_s it is in seconds",
    ),
}

GOOD = """name: bad
scales: {smoke: {}, laptop: {}, paper: {}}
"""


@pytest.mark.parametrize("case", sorted(BAD_GRIDS))
def test_bad_grid_is_refused_before_ray_starts(case, tmp_path, monkeypatch, capsys):
    import ablate.service.runner

    def no_ray(*a, **k):
        raise AssertionError("Ray was started for an invalid grid")

    monkeypatch.setattr(ablate.service.runner, "init_ray", no_ray)
    extra, expected = BAD_GRIDS[case]
    path = tmp_path / "bad.yaml"
    stop = "" if extra.startswith("stop:") else "stop: {max_steps: 5}\n"
    path.write_text(GOOD + stop + extra)
    code = cli.main(["run", str(path), "--scale", "smoke", "--storage", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 2
    assert str(path) in err and expected in err, err
    assert "Traceback" not in err


def test_unknown_grid_name_lists_known_ones(capsys):
    assert cli.main(["run", "no_such_grid"]) == 2
    err = capsys.readouterr().err
    assert "unknown grid 'no_such_grid'" in err and "batch_vs_dim" in err


def test_malformed_yaml_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nbase: {batch_size: 3\nstop: {max_steps: 1}\n")
    with pytest.raises(GridError, match=r"line \d+"):
        load_grid(str(path), "smoke")


def test_corrupt_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog):
    from ablate.service.trainable import AblateTrainable

    grid = load_grid("batch_vs_dim", "smoke")
    params = {"grid": "batch_vs_dim", **grid.base, "max_steps": 40, "batch_size": 32, "latent_dim": 3, "seed": 1}
    t = AblateTrainable(config=params)
    for i in range(2):
        t.train()
        (tmp_path / f"checkpoint_00000{i}").mkdir()
        t.save_checkpoint(str(tmp_path / f"checkpoint_00000{i}"))
    damaged = tmp_path / "checkpoint_000001" / CHECKPOINT_FILE
    damaged.write_bytes(damaged.read_bytes()[:100])  # a torn write
    fresh = AblateTrainable(config=params)
    with caplog.at_level("WARNING", logger="ablate.service.trainable"):
        fresh.load_checkpoint(str(tmp_path / "checkpoint_000001"))
    assert fresh.experiment.step == 5, "fell back to the step-5 checkpoint"
    assert str(damaged) in caplog.text and "earlier checkpoint" in caplog.text
    (tmp_path / "checkpoint_000000" / CHECKPOINT_FILE).write_bytes(b"garbage")
    again = AblateTrainable(config=params)
    with caplog.at_level("WARNING", logger="ablate.service.trainable"):
        again.load_checkpoint(str(tmp_path / "checkpoint_000001"))
    assert again.experiment.step == 0 and "restarting from step 0" in caplog.text
    for x in (t, fresh, again):
        x.stop()


def test_optuna_with_a_time_budget_ranks_settings_at_equal_seconds(ray_session, tmp_path):
    """ASHA on time_total_s: no trial starts a report once past the budget, and a best config comes out."""
    grid = load_grid("tune_aninfonce", "smoke")
    grid.optuna.time_budget_s, grid.optuna.grace_period, grid.optuna.num_samples = 3.0, 1, 3
    grid.optuna.space["report_every"] = Choice(choice=[1000])  # reports of about half a second of training
    grid.stop.max_steps = 10_000_000  # only the time budget ends these trials
    outcome = run_grid(grid, storage=str(tmp_path), name="timed", verbose=0)
    assert len(outcome.trials) == 3 and not outcome.failed
    for trial in outcome.trials:
        assert trial.last["time_total_s"] - trial.last["time_this_iter_s"] < 3.0  # it stopped once past 3 s
        assert trial.last["step"] < 10_000_000
    assert outcome.best_config is not None and set(outcome.best_config["config"]) <= set(grid.optuna.space)


def test_param_space_starts_the_costliest_trials_first():
    """Ray nests several grid axes alphabetically (batch_size, the costliest, would vary fastest); ablate's one
    axis of whole grid points keeps a costliest-first order, every trial exactly once."""
    from ray.tune.search.variant_generator import generate_variants

    from ablate.service.costs import trial_cost
    from ablate.service.params import config_from_params

    grid = load_grid("batch_vs_dim", "laptop")
    configs = [config_from_params(c) for _, c in generate_variants(grid.param_space())]
    order = [(c.batch_size, c.latent_dim) for c in configs]
    assert order == [(1024, 16), (1024, 8), (1024, 4), (256, 16), (256, 8), (256, 4), (64, 16), (64, 8), (64, 4)]
    costs = [trial_cost(c) for c in configs]
    assert costs == sorted(costs, reverse=True)
    grid = load_grid("anisotropy", "laptop")  # variants travel whole; ties keep the grid's own order
    configs = [config_from_params(c) for _, c in generate_variants(grid.param_space())]
    assert sorted((c.seed, str(c.concentration), c.loss, c.tau) for c in configs) == sorted(
        (t.config.seed, str(t.config.concentration), t.config.loss, t.config.tau) for t in grid.trials
    )
    assert len(configs) == grid.n_trials


def test_an_optuna_grid_stores_its_study_in_sqlite_that_optuna_can_open(ray_session, tmp_path):
    import optuna

    from ablate.rundir import OPTUNA_DB, optuna_storage_url

    grid = load_grid("tune_aninfonce", "smoke")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome = run_grid(grid, storage=str(tmp_path), name="study", verbose=0)
    # Optuna persists only scalar choices: the encoder widths travel as their JSON text, with no warning
    assert not [w for w in caught if "categorical distribution" in str(w.message)], [str(w.message) for w in caught]
    assert (outcome.run_dir / OPTUNA_DB).is_file()
    study = optuna.load_study(study_name=grid.name, storage=optuna_storage_url(outcome.run_dir))
    finished = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(finished) == len(outcome.trials) == grid.n_trials
    # each study trial's value is the R² its Ray trial last reported, with the sampled parameters
    last_r2 = sorted(round(t.last["r2"], 9) for t in outcome.trials)
    assert sorted(round(t.value, 9) for t in finished) == last_r2
    assert all(set(t.params) == set(grid.optuna.space) for t in finished)
    widths = {json.dumps(w, separators=(",", ":")) for w in grid.optuna.space["encoder_widths"].choice}
    assert {t.params["encoder_widths"] for t in finished} <= widths
    # each Ray trial trained the list its study trial holds as text
    by_value = {round(t.value, 9): json.loads(t.params["encoder_widths"]) for t in finished}
    for trial in outcome.trials:
        assert trial.params["encoder_widths"] == by_value[round(trial.last["r2"], 9)]
    # a resume of the finished search reopens the same study instead of starting another one
    run_grid(grid, storage=str(tmp_path), name="study", verbose=0, resume=True)
    again = optuna.load_study(study_name=grid.name, storage=optuna_storage_url(outcome.run_dir))
    assert len(again.trials) == len(study.trials)
