"""The metric column names (ablate.columns): what Experiment.evaluate writes is what every reader parses."""

from __future__ import annotations

from ablate.columns import (
    lambda_hat_column,
    lambda_hat_columns,
    parse_lambda_hat,
    r2_block_column,
    r2_block_lambda,
    r2_dim_column,
    r2_dim_index,
)


def test_block_names_round_trip():
    for lam in (5, 25.0, 2.5, 1e-3, 1e6):
        assert r2_block_lambda(r2_block_column(lam)) == float(f"{lam:g}")
    assert r2_block_column(25.0) == "r2_lambda_25" and r2_block_column(2.5) == "r2_lambda_2.5"
    assert [r2_block_lambda(n) for n in ("r2", "r2_lambda_", "r2_lambda_x", "r2_dim_3")] == [None] * 4


def test_dim_and_lambda_hat_names_round_trip():
    assert r2_dim_index(r2_dim_column(7)) == 7 and r2_dim_index("r2_dim_x") is None
    assert parse_lambda_hat(lambda_hat_column(3)) == (None, 3)
    assert parse_lambda_hat(lambda_hat_column(3, member=1)) == (1, 3)
    for other in ("lambda_hat_sorted", "lambda_hat_matched", "lambda_hat_init_std", "lambda_hat_low"):
        assert parse_lambda_hat(other) is None
    cols = ["r2", "lambda_hat_1", "lambda_hat_0_1", "lambda_hat_0", "lambda_hat_1_0", "lambda_hat_sorted"]
    assert lambda_hat_columns(cols) == ["lambda_hat_1", "lambda_hat_0"]
    assert lambda_hat_columns(cols, member=1) == ["lambda_hat_1_0"]


def test_experiment_reports_the_names_the_readers_parse():
    from ablate.config import RunConfig
    from ablate.core.experiment import Experiment

    for loss, extra, members in (
        ("aninfonce", {}, [None]),
        ("ensemble_aninfonce", {"ensemble": [[5, 25], [25, 5]]}, [0, 1]),
    ):
        config = RunConfig(
            latent_dim=2,
            concentration="5/25",
            loss=loss,
            batch_size=16,
            encoder_widths=[2, 2],
            eval_samples=64,
            generator_cond_samples=20,
            **extra,
        )
        out = Experiment(config).evaluate()
        assert sorted(lam for c in out if (lam := r2_block_lambda(c)) is not None) == [5.0, 25.0]
        assert sorted(i for c in out if (i := r2_dim_index(c)) is not None) == [0, 1]
        for member in members:
            assert len(lambda_hat_columns(out, member)) == 2, (loss, member, sorted(out))
