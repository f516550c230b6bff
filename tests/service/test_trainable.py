"""The Ray Tune trainable (``ablate.service.execution.trainable``): without Ray, save/restore continues the same numbers
and a damaged checkpoint falls back to the one before it; through Ray, a trial equals `ablate train` of its point."""

from __future__ import annotations

from ablate.service.execution.trainable import CHECKPOINT_FILE
from ablate.service.specs.grids import load_grid


def test_trainable_save_restore_round_trip(tmp_path):
    from ablate.service.execution.trainable import AblateTrainable

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


def test_a_trial_continues_from_its_newest_checkpoint_that_loads_and_that_its_log_covers(tmp_path, caplog):
    """The Trainable writes a checkpoint into its trial folder after each report; a new one (a resumed run, Ray's
    retry) continues from the newest that loads and whose report is in the log, else from step 0."""
    from ablate.service.execution.trainable import AblateTrainable
    from ablate.trial_log import append_row

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
    from ablate.rundir import PARAMS_FILE, RESULT_FILE
    from ablate.service.specs.params import config_from_params
    from ablate.trial_log import intact_rows, read_rows

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
