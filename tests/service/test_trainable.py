"""The Ray Tune trainable (``ablate.service.trainable``) without Ray: save/restore continues the same numbers, and a
damaged checkpoint falls back to the one before it."""

from __future__ import annotations

from ablate.service.grids import load_grid
from ablate.service.trainable import CHECKPOINT_FILE


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
