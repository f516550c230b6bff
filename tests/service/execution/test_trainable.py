"""The Ray Tune trainable (``ablate.service.execution.trainable``): without Ray, save/restore continues the same numbers
and a damaged checkpoint falls back to the one before it; through Ray, a trial equals `ablate train` of its point."""

from __future__ import annotations

from ablate.service.execution.trainable import CHECKPOINT_FILE
from ablate.service.specs.grids import load_grid


def test_a_trial_stopped_and_built_again_continues_to_the_numbers_of_one_that_never_stopped(tmp_path):
    """The Trainable's only checkpoints are its record's: a trial that stops after two reports (their rows in the
    log, written by the driver's ResultLog) and is built again (a resume, Ray's retry) reports what a trial that
    never stopped reports, to the bit."""
    from types import SimpleNamespace

    from ablate.service.execution.callbacks import ResultLog
    from ablate.service.execution.trainable import AblateTrainable

    grid = load_grid("batch_vs_dim", "smoke")
    params = {"grid": "batch_vs_dim", **grid.base, "max_steps": 40, "batch_size": 32, "latent_dim": 3, "seed": 1}
    straight = AblateTrainable(config=params)
    first = [straight.train() for _ in range(4)]

    recorded = {**params, "record": {"dir": str(tmp_path), "id": "t", "keep": 2}}
    log, trial = ResultLog(), SimpleNamespace(config=recorded)
    log.on_trial_start(0, [], trial)
    interrupted = AblateTrainable(config=recorded)
    for _ in range(2):
        log.on_trial_result(0, [], trial, interrupted.train())
    interrupted.stop()
    resumed = AblateTrainable(config=recorded)
    assert resumed.experiment.step == 10
    later = [resumed.train() for _ in range(2)]
    for a, b in zip(first[2:], later):
        assert a["step"] == b["step"]
        for key in ("r2", "loss", "mcc", "eval_loss", "lambda_hat_0"):
            assert a[key] == b[key], key
    assert "R²=" in repr(resumed) and "latent_dim=3" in repr(resumed)
    assert "save_checkpoint" not in vars(AblateTrainable), "no Ray checkpoint path: Ray's checkpoints stay off"
    for t in (straight, resumed):
        t.stop()


def test_a_trial_continues_from_its_newest_checkpoint_that_loads_and_that_its_log_covers(tmp_path, caplog):
    """The Trainable writes a checkpoint into its trial folder after each report; a new one (a resumed run, Ray's
    retry) continues from the newest that loads and whose report is in the log, else from step 0."""
    from ablate.service.execution.trainable import AblateTrainable
    from ablate.service.records.trial_log import append_row

    grid = load_grid("batch_vs_dim", "smoke")
    record = {"dir": str(tmp_path), "id": "t", "keep": 3}
    params = {"grid": "batch_vs_dim", **grid.base, "max_steps": 40, "batch_size": 32, "latent_dim": 3, "seed": 1}
    params["record"] = record
    folder = tmp_path / "trial_t"
    t = AblateTrainable(config=params)
    for _ in range(3):
        row = t.train()
        if row["step"] <= 10:  # the driver logged reports 1-2; it was killed before it logged report 3
            append_row(folder / "result.json", {"step": row["step"]})
    t.stop()
    assert sorted(p.name for p in folder.glob("checkpoint_*")) == [f"checkpoint_{s:09d}" for s in (5, 10, 15)]
    fresh = AblateTrainable(config=params)
    assert fresh.experiment.step == 10, "step 15's report is not in the log: its checkpoint is passed over"
    fresh.stop()
    damaged = folder / "checkpoint_000000010" / CHECKPOINT_FILE
    damaged.write_bytes(damaged.read_bytes()[:100])  # a torn write
    with caplog.at_level("WARNING", logger="ablate.service.records.trial"):
        again = AblateTrainable(config=params)
    assert again.experiment.step == 5 and str(damaged) in caplog.text and "earlier checkpoint" in caplog.text
    again.stop()
    (folder / "checkpoint_000000005" / CHECKPOINT_FILE).write_bytes(b"garbage")
    last = AblateTrainable(config=params)
    assert last.experiment.step == 0
    last.stop()


def test_a_trial_through_ray_equals_ablate_train_of_its_point_bit_for_bit(ray_session, tmp_path_factory):
    """Every trial of a real smoke run (Ray, one CPU per trial, the batch prefetch thread as the machine allows)
    reports exactly the numbers of `ablate train` of its point in this process (one thread), so a change that moves
    the numbers shows at once (docs/performance.md: the same code gives other last digits on another CPU)."""
    import json

    import torch
    from conftest import runs_root, smoke_run

    from ablate.core.experiment import Experiment
    from ablate.service.records.rundir import PARAMS_FILE, RESULT_FILE
    from ablate.service.records.trial_log import intact_rows, read_rows
    from ablate.service.specs.params import config_from_params

    run_dir = smoke_run("batch_vs_dim", runs_root(tmp_path_factory))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        folders = sorted(run_dir.glob("trial_*"))
        assert len(folders) == 4
        for folder in folders:
            config = config_from_params(json.loads((folder / PARAMS_FILE).read_text()))
            logged = intact_rows(read_rows(folder / RESULT_FILE))
            exp = Experiment(config)
            for row in logged:
                report = exp.train(row["step"] - exp.step)
                report.update(exp.evaluate())
                for key in ("step", "loss", "r2", "mcc", "eval_loss"):
                    assert report[key] == row[key], (folder.name, row["step"], key, report[key], row[key])
            assert exp.step == config.max_steps
    finally:
        torch.set_num_threads(threads)


def test_reports_travel_together_every_results_every_seconds_and_the_log_gets_each_as_its_row(tmp_path):
    """--results-every: a grid trial trains report after report within one Ray iteration and hands Ray one result
    carrying them all; the driver's result log writes each as the row one result per report would have written
    (same numbers, its own step, rising clocks, done only at the end), and the trial checkpoints once, after the
    last report of the result (an earlier one could never count: its report reaches the log only with the rest)."""
    from types import SimpleNamespace

    from ablate.service.execution.callbacks import ResultLog
    from ablate.service.execution.results import REPORTS_KEY
    from ablate.service.execution.trainable import AblateTrainable
    from ablate.service.records.trial_log import read_rows

    grid = load_grid("batch_vs_dim", "smoke")
    params = {"grid": "batch_vs_dim", **grid.base, "max_steps": 20, "batch_size": 32, "latent_dim": 3, "seed": 1}
    one_by_one = AblateTrainable(config=params)
    each = [one_by_one.train() for _ in range(4)]
    one_by_one.stop()
    assert [r["step"] for r in each] == [5, 10, 15, 20] and REPORTS_KEY not in each[-1]

    together = {**params, "record": {"dir": str(tmp_path), "id": "t", "keep": 2, "results_every": 3600.0}}
    trainable = AblateTrainable(config=together)
    result = trainable.train()
    trainable.stop()
    assert result["done"] and result["step"] == 20 and len(result[REPORTS_KEY]) == 3
    folder = tmp_path / "trial_t"
    assert [p.name for p in folder.glob("checkpoint_*")] == ["checkpoint_000000020"]

    ResultLog().on_trial_result(0, [], SimpleNamespace(config=together), result)
    rows = read_rows(folder / "result.json")
    assert [r["step"] for r in rows] == [5, 10, 15, 20]
    for row, alone in zip(rows, each):
        for key in ("r2", "loss", "mcc", "eval_loss", "lambda_hat_0"):
            assert row[key] == alone[key], (row["step"], key)
    assert [r["training_iteration"] for r in rows] == [1, 2, 3, 4]
    assert [r["done"] for r in rows] == [False, False, False, True]
    assert {r["iterations_since_restore"] for r in rows} == {1}, "one Ray result carried them"
    clocks = [r["time_total_s"] for r in rows]
    assert clocks == sorted(clocks) and clocks[-1] == result["time_total_s"] and clocks[0] > 0
    spent = sum(r["time_this_iter_s"] for r in rows)
    assert abs(spent - result["time_this_iter_s"]) < 1e-9, "each report's own time adds up to the result's"


def test_a_pack_sends_its_members_reports_together_too(tmp_path):
    from types import SimpleNamespace

    from ablate.service.execution.callbacks import ResultLog
    from ablate.service.execution.pack_trainable import PackTrainable
    from ablate.service.execution.results import REPORTS_KEY
    from ablate.service.records.trial_log import read_rows
    from ablate.service.specs.params import PACK_KEY

    grid = load_grid("batch_vs_lambda", "smoke")
    base = {"grid": grid.name, "scale": "smoke", **grid.base, **grid.stop.settings(), "max_steps": 30}
    points = [{"seed": 0}, {"seed": 1}]
    alone = PackTrainable(config={**base, PACK_KEY: points})
    each = [alone.train()]
    while not each[-1]["done"]:
        each.append(alone.train())
    alone.stop()
    record = {"dir": str(tmp_path), "id": "pack-p", "keep": 2, "results_every": 3600.0, "members": ["a", "b"]}
    config = {**base, PACK_KEY: points, "record": record}
    pack = PackTrainable(config=config)
    result = pack.train()
    pack.stop()
    assert result["done"] and len(result[REPORTS_KEY]) == len(each) - 1
    log, trial = ResultLog(), SimpleNamespace(config=config)
    log.on_trial_start(0, [], trial)
    log.on_trial_result(0, [], trial, result)
    for m, member in enumerate("ab"):
        rows = read_rows(tmp_path / f"trial_{member}" / "result.json")
        assert [r["step"] for r in rows] == [r["members"][m]["step"] for r in each]
        assert [r["r2"] for r in rows] == [r["members"][m]["r2"] for r in each]
        assert [r["pack"] for r in rows] == ["pack-p"] * len(each)


def test_an_exception_after_some_reports_of_a_result_hands_them_to_ray_first(tmp_path):
    """A trial that fails part way through a Ray result that carries several reports: the reports before the
    failure still reach Ray (and so the log), without a checkpoint (the experiment is part way into the failing
    report); the exception comes at the next call, where Ray's retry takes over as for any failure."""
    import pytest

    from ablate.service.execution.results import REPORTS_KEY
    from tests.service.execution.faulty import InjectedFault, faulty

    grid = load_grid("batch_vs_dim", "smoke")
    params = {"grid": "batch_vs_dim", **grid.base, "max_steps": 20, "batch_size": 32, "latent_dim": 3, "seed": 1}
    params["record"] = {"dir": str(tmp_path), "id": "t", "keep": 2, "results_every": 3600.0}
    trainable = faulty(tmp_path / "faults", at_step=12)(config=params)
    result = trainable.train()
    assert result["step"] == 10 and [r["step"] for r in result[REPORTS_KEY]] == [5] and not result["done"]
    assert not list((tmp_path / "trial_t").glob("checkpoint_*")), "no checkpoint of a part-trained state"
    with pytest.raises(InjectedFault, match="injected fault at step 12"):
        trainable.train()
    trainable.stop()
