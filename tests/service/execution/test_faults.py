"""Injected faults: a trial that raises mid-run is retried from its checkpoint and loses nothing."""

from __future__ import annotations

import json

from ablate.service.execution.runner import run_grid
from ablate.service.specs.grid import VariantSpec
from ablate.service.specs.grids import load_grid
from tests.service.execution.faulty import counting, faulty


def _one_trial_grid(**base):
    grid = load_grid("batch_vs_dim", "smoke")
    grid.axes = {"batch_size": [32], "latent_dim": [3]}
    grid.base.update(base)
    grid.stop.max_steps = 25
    return grid


def _rows(outcome):
    (trial_dir,) = [p for p in outcome.run_dir.glob("trial_*") if p.is_dir()]
    return [json.loads(line) for line in (trial_dir / "result.json").read_text().splitlines() if line.strip()]


def test_trial_that_raises_is_retried_from_its_checkpoint(ray_session, tmp_path):
    clean = run_grid(_one_trial_grid(), storage=str(tmp_path), name="clean", verbose=0)
    stopped = run_grid(
        _one_trial_grid(),
        storage=str(tmp_path),
        name="faulty",
        verbose=0,
        trainable=faulty(tmp_path / "faults", at_step=12),
    )
    assert not clean.failed and not stopped.failed, [t.error for t in stopped.failed]
    clean_rows, faulty_rows = _rows(clean), _rows(stopped)
    assert [r["step"] for r in faulty_rows] == [5, 10, 15, 20, 25], "no duplicated or missing iterations"
    for a, b in zip(clean_rows, faulty_rows):
        for key in ("r2", "loss", "mcc", "lambda_hat_0"):
            assert a[key] == b[key], (key, a["step"])


def test_trial_that_keeps_failing_errors_without_taking_others_down(ray_session, tmp_path, capfd, caplog):
    """A trial's own error (a plugin that raises) fails it once per allowed failure, one line each on the console
    (no Ray traceback), its traceback in its error.json; it is not run again by the runner (issue 46)."""
    grid = _one_trial_grid()
    grid.variants = [VariantSpec(name="healthy"), VariantSpec(name="broken", lr=2e-4)]
    broken = faulty(tmp_path / "faults", at_step=7, times=10, variant="broken")
    capfd.readouterr()
    outcome = run_grid(grid, storage=str(tmp_path), name="broken", verbose=0, max_failures=1, trainable=broken)
    console = capfd.readouterr()
    (failed,) = outcome.failed
    assert failed.params["variant"]["name"] == "broken" and "injected fault" in failed.error
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"trial {failed.trial_id} failed")]
    assert lines == [
        f"trial {failed.trial_id} failed (tests.service.execution.faulty.InjectedFault: injected fault at step 7 (1 "
        "of 10)): retried from its checkpoint, failure 1 of at most 2",
        f"trial {failed.trial_id} failed 2 time(s), not retried by Ray: tests.service.execution.faulty.InjectedFault: "
        "injected fault at step 7 (2 of 10)",
    ], lines
    assert "Traceback" not in console.out + console.err and "Trial task failed" not in console.out + console.err
    assert not [r for r in caplog.records if "run again" in r.getMessage()], "its own error is not run again"
    error = json.loads((outcome.run_dir / f"trial_{failed.trial_id}" / "error.json").read_text())
    assert error["failures"] == 2 and error["error"] == lines[1].split("not retried by Ray: ")[1]
    assert error["trace"].startswith("ray::") and "in _report" in error["trace"] and "(2 of 10)" in error["trace"]
    (healthy,) = [t for t in outcome.trials if t.status == "TERMINATED"]
    assert healthy.last["step"] == 25
    from ablate.analysis.status import run_status

    (row,) = [r for r in run_status(outcome.run_dir)["trials"] if r["status"] == "ERROR"]
    assert row["failures"] == 2  # the first failure and its one retry (max_failures=1), not 0 or 1


def test_nonfinite_loss_errors_the_trial_names_the_step_and_keeps_the_others(ray_session, tmp_path):
    grid = _one_trial_grid()
    grid.variants = [
        VariantSpec(name="healthy"),
        VariantSpec(name="diverging", normalize_output=False, lr=1.0e6, lr_lambda=1.0e6),
    ]
    outcome = run_grid(grid, storage=str(tmp_path), name="nan", verbose=0, max_failures=0)
    (failed,) = outcome.failed
    assert failed.params["variant"]["name"] == "diverging"
    assert "NonFiniteLossError" in failed.error and "at step" in failed.error
    (healthy,) = [t for t in outcome.trials if t.status == "TERMINATED"]
    assert healthy.last["step"] == 25

    from ablate.analysis.status import run_status

    info = run_status(outcome.run_dir)
    assert info["counts"]["errored"] == 1 and info["counts"]["finished"] == 1


def test_a_deterministic_nan_is_one_failure_recorded_not_retried(ray_session, tmp_path, capfd, caplog):
    """issue 36: a loss that goes non-finite was retried --max-failures times (the same seed reaches the same NaN
    at the same step), with a full Ray traceback each. It is the science's result: the trial trains once, ends
    with its error in the record (error.json, status, export) and one line on the console; a resume reuses it."""
    import pandas as pd

    from ablate import cli
    from ablate.service.records.rundir import ERROR_FILE

    grid = _one_trial_grid()
    grid.variants = [
        VariantSpec(name="healthy"),
        VariantSpec(name="diverging", normalize_output=False, lr=1.0e6, lr_lambda=1.0e6),
    ]
    log = tmp_path / "trainings.txt"
    capfd.readouterr()
    outcome = run_grid(grid, storage=str(tmp_path), name="nan", verbose=0, max_failures=2, trainable=counting(log))
    console = capfd.readouterr().err
    trainings = log.read_text().splitlines()
    assert len(trainings) == 2, f"each trial trains once (the NaN not retried twice): {trainings}"
    (failed,) = outcome.failed
    assert failed.params["variant"]["name"] == "diverging" and failed.status == "ERROR"
    assert failed.error.startswith("NonFiniteLossError: loss became") and " at step " in failed.error
    (healthy,) = [t for t in outcome.trials if t.status == "TERMINATED"]
    assert healthy.last["step"] == 25
    logged = [r.getMessage() for r in caplog.records]
    assert not [m for m in [*logged, console] if "Traceback" in m or "Trial task failed" in m], console[-3000:]
    (line,) = [m for m in logged if "NonFiniteLossError" in m]  # the one line (a warning: stderr on the console)
    assert line.startswith(f"trial {failed.trial_id} failed") and "not retried" in line

    folder = outcome.run_dir / f"trial_{failed.trial_id}"
    error = json.loads((folder / ERROR_FILE).read_text())
    assert error == {"error": failed.error, "failures": 1}
    step = int(failed.error.split(" at step ")[1].split()[0])  # the first non-finite step
    reported = -(-step // 5) * 5  # the end of its report period (report_every 5): the trial's last row

    assert cli.main(["status", str(outcome.run_dir)]) == 0
    status = capfd.readouterr().out
    assert "finished: 1" in status and "errored: 1" in status
    assert f"trial {failed.trial_id} failed: {failed.error}" in status
    from ablate.analysis.status import run_status

    (trial,) = [r for r in run_status(outcome.run_dir)["trials"] if r["status"] == "ERROR"]
    assert trial["failures"] == 1 and trial["step"] == reported

    assert cli.main(["export", str(outcome.run_dir)]) == 0
    export = pd.read_csv(outcome.run_dir / "results.csv")
    last = export[export["trial_id"] == failed.trial_id].iloc[-1]
    assert last["status"] == "ERROR" and last["step"] == reported and f"at step {step} " in last["member_error"]

    log.unlink()
    again = run_grid(grid, storage=str(tmp_path), name="nan", verbose=0, max_failures=2, trainable=counting(log))
    assert len(again.plan.reused) == 2 and not again.plan.units and not log.exists(), "a resume reuses it as it ended"
    assert json.loads((folder / ERROR_FILE).read_text())["failures"] == 1


def test_resume_refusals(tmp_path, capsys):
    from ablate import cli

    storage = str(tmp_path)
    assert cli.main(["run", "batch_vs_dim", "--scale", "smoke", "--storage", storage, "--resume"]) == 2
    assert "nothing to resume" in capsys.readouterr().err

    other = tmp_path / "batch_vs_dim-smoke"
    other.mkdir()
    (other / "ablate_run.json").write_text('{"grid": "tune_aninfonce", "scale": "smoke", "search": "optuna"}')
    assert cli.main(["run", "batch_vs_dim", "--scale", "smoke", "--storage", storage, "--resume"]) == 2
    assert "holds an Optuna search of tune_aninfonce; batch_vs_dim is a grid search" in capsys.readouterr().err

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "experiment_state-x.json").write_text("{}")
    assert (
        cli.main(["run", "batch_vs_dim", "--scale", "smoke", "--storage", storage, "--name", "foreign", "--resume"])
        == 2
    )
    assert "not an ablate run directory" in capsys.readouterr().err
    assert cli.main(["status", str(foreign)]) == 2
    assert "not an ablate run directory" in capsys.readouterr().err


def test_unwritable_storage_is_refused(tmp_path, capsys):
    from ablate import cli

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert cli.main(["run", "batch_vs_dim", "--scale", "smoke", "--storage", str(blocker / "runs")]) == 2
    assert "not writable" in capsys.readouterr().err


def test_nonfinite_trial_under_optuna_is_recorded_as_failed(ray_session, tmp_path):
    from ablate.service.specs.grids import load_grid as load

    path = tmp_path / "diverging.yaml"
    path.write_text(
        "name: diverging\nsearch: optuna\n"
        "base: {latent_dim: 3, batch_size: 16, encoder_widths: [2, 2], eval_samples: 64, report_every: 5,\n"
        "       generator_cond_samples: 200, concentration: 75, normalize_output: false, lr_lambda: 1.0e+30}\n"
        "optuna: {space: {lr: {choice: [1.0e+30]}}, num_samples: 2, grace_period: 1}\n"
        "stop: {max_steps: 15}\nscales: {smoke: {}, laptop: {}, paper: {}}\n"
    )
    outcome = run_grid(load(str(path), "smoke"), storage=str(tmp_path), verbose=0, max_failures=2)
    # both samples draw the one choice: one setting, one trial (the second waited for the first, then failed too)
    assert len(outcome.trials) == 1
    for t in outcome.trials:
        assert t.status == "ERROR" and "NonFiniteLossError" in (t.error or ""), (t.status, t.error, t.last)
        error = json.loads((outcome.run_dir / f"trial_{t.trial_id}" / "error.json").read_text())
        assert error["failures"] == 1, "a non-finite loss is not retried (--max-failures 2)"
    assert outcome.best_config is None
    import optuna
    from conftest import optuna_journal

    study = optuna.load_study(study_name="diverging", storage=optuna_journal(outcome.run_dir))
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert states == [optuna.trial.TrialState.FAIL] * 2, states  # as for a trial that raised, never COMPLETE


def _four_point_grid():
    grid = _one_trial_grid()
    grid.axes = {"batch_size": [32, 64], "latent_dim": [3, 4]}
    return grid


def _log_rows(run_dir) -> dict[str, list[dict]]:
    return {
        p.name: [json.loads(line) for line in (p / "result.json").read_text().splitlines() if line.strip()]
        for p in sorted(run_dir.glob("trial_*"))
        if p.is_dir()
    }


def _undisturbed(params: dict) -> list[tuple]:
    """(r2, loss, mcc) of each report of the trial of ``params`` stepped to its end in this process, with the one
    torch thread a trial has in the Ray session."""
    import torch

    from ablate.service.execution.trainable import AblateTrainable

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainable, rows = AblateTrainable(config=params), []
        while not rows or not rows[-1]["done"]:
            rows.append(trainable.step())
        trainable.stop()
    finally:
        torch.set_num_threads(threads)
    return [(r["r2"], r["loss"], r["mcc"]) for r in rows]


def test_a_trial_whose_process_dies_between_points_is_run_again_in_the_same_run(ray_session, tmp_path, caplog):
    """issue 46: Tune reuses a trial's actor for the next grid point; an actor that dies as it is handed its point
    ends that point ERROR before it trains, and Ray does not retry it. The runner runs it again in the same run,
    from its own record, and says so; its numbers are those of an undisturbed trial. A point that keeps dying stops at
    --max-failures, counted over Ray's retries and the runner's together."""
    from ablate.service.execution.retries import PROCESS_DIED
    from ablate.service.records.outcome import retry_line
    from tests.service.execution.faulty import dying

    hit = run_grid(
        _four_point_grid(), storage=str(tmp_path), name="hit", verbose=0, trainable=dying(tmp_path / "deaths")
    )
    assert not hit.failed, [t.error for t in hit.failed]
    died = {f.name for f in (tmp_path / "deaths").iterdir()}
    assert died, "no actor was reused for a next point: the test did not test the case"
    assert set(hit.retried) == died and {w for ws in hit.retried.values() for w in ws} == {PROCESS_DIED}, hit.retried
    (again,) = [r.getMessage() for r in caplog.records if "run again" in r.getMessage()]  # the runner's retry
    assert again == f"{len(died)} trial(s) run again: {len(died)}× {PROCESS_DIED}"
    assert retry_line(hit).startswith(f"retried {len(died)} trial(s) ")
    for trial, rows in _log_rows(hit.run_dir).items():  # each report once, the numbers of an undisturbed trial
        params = json.loads((hit.run_dir / trial / "params.json").read_text())
        assert [r["step"] for r in rows] == [5, 10, 15, 20, 25], trial
        assert [(r["r2"], r["loss"], r["mcc"]) for r in rows] == _undisturbed(params), trial

    bounded = run_grid(
        _one_trial_grid(), storage=str(tmp_path), name="bounded", verbose=0, max_failures=1,
        trainable=dying(tmp_path / "always", times=100, at_step=10),
    )  # fmt: skip
    (failed,) = bounded.failed  # it dies each time it trains past step 10: Ray's one retry, then no more
    assert "ActorDiedError" in failed.error, failed.error
    assert bounded.retried == {failed.trial_id: [PROCESS_DIED]}, bounded.retried
    assert (
        len(list((tmp_path / "always").iterdir())) == 1 and (tmp_path / "always" / failed.trial_id).read_text() == "2"
    )
