"""Tests of `ablate.core.experiment.Experiment`: learning, determinism, bit-exact resume, metrics and NaN guard.

Every run is small (d = 4, narrow encoder, batches of 128) and on the CPU, so the whole file takes seconds.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from ablate.config import RunConfig
from ablate.core.experiment import Experiment, NonFiniteLossError

#: Small settings shared by every test; each test overrides what it exercises.
SMALL = {
    "latent_dim": 4,
    "batch_size": 128,
    "encoder_widths": [10, 10, 10],
    "eval_samples": 1024,
    "lr": 1e-3,
    "concentration": "5/25",
    "device": "cpu",
}

#: Loss variants of the save/load/resume test.
VARIANTS = {
    "aninfonce": {},
    "infonce": {"loss": "infonce"},
    "ensemble_aninfonce": {"loss": "ensemble_aninfonce", "ensemble": ["5/25", "25/5"]},
    "hard_negatives": {"negative_concentration": 2.0, "n_hard_negatives": 2, "hard_negatives_from_step": 10},
    "tricl": {"loss": "tricl"},
}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Run on one CPU thread: several threads are far slower on a small shared machine for these tiny runs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make(**overrides) -> Experiment:
    return Experiment(RunConfig.build({**SMALL, **overrides}))


def params(exp: Experiment) -> list[torch.Tensor]:
    return [p.detach().clone() for p in [*exp.encoder.parameters(), *exp.loss.parameters()]]


def assert_same_params(a: Experiment, b: Experiment) -> None:
    pa, pb = params(a), params(b)
    assert len(pa) == len(pb)
    for x, y in zip(pa, pb):
        assert torch.equal(x, y)


def test_small_concentration_splits_evenly():
    assert RunConfig.build(SMALL).lambda_true == [5.0, 5.0, 25.0, 25.0]


# ------------------------------------------------------------------ learning
def test_aninfonce_training_lifts_r2():
    # lr 3e-3 and lr_lambda 5e-2 let 300 steps show learning; measured (seed 0, CPU): R² 0.50 -> 0.83.
    # Over seeds 0-4 the gain was 0.18-0.33; an untrained or wrongly-signed run does not move R² up.
    exp = make(lr=3e-3, lr_lambda=5e-2)
    before = exp.evaluate()
    result = exp.train(300)
    after = exp.evaluate()
    assert result["step"] == 300 and exp.step == 300
    assert result["samples_seen"] == 300 * 128
    assert math.isfinite(result["loss"])
    assert after["r2"] > before["r2"] + 0.2, (before["r2"], after["r2"])
    assert after["r2"] > 0.75, (before["r2"], after["r2"])
    assert after["mcc"] > before["mcc"]
    # Λ̂ grows from softplus(θ₀) ≈ 0.7 towards the true Λ, and the loss approaches its floor.
    assert min(after[f"lambda_hat_{i}"] for i in range(4)) > 2.0
    assert after["loss_gap"] < before["loss_gap"]


# --------------------------------------------------------------- determinism
def train_and_evaluate(steps: int = 30, **overrides) -> dict:
    exp = make(**overrides)
    exp.train(steps)
    return exp.evaluate()


def test_same_seed_gives_identical_metrics():
    a, b = train_and_evaluate(seed=3), train_and_evaluate(seed=3)
    assert a == b


def test_another_seed_gives_different_metrics():
    a, b = train_and_evaluate(seed=3), train_and_evaluate(seed=4)
    assert a["r2"] != b["r2"]
    assert a["eval_loss"] != b["eval_loss"]
    assert a["lambda_hat_0"] != b["lambda_hat_0"]


def test_shared_generator_seed_fixes_g_but_not_the_run():
    a, b = make(seed=1, generator_seed=9), make(seed=2, generator_seed=9)
    for x, y in zip(a.generator.parameters(), b.generator.parameters()):
        assert torch.equal(x, y)
    assert not torch.equal(next(a.encoder.parameters()), next(b.encoder.parameters()))


# --------------------------------------------------------- save/load/resume
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_resume_equals_uninterrupted(variant, tmp_path):
    overrides = VARIANTS[variant]
    whole = make(**overrides)
    whole.train(40)

    first = make(**overrides)
    first.train(20)
    path = tmp_path / "checkpoint.pt"
    torch.save(first.state_dict(), path)
    del first
    state = torch.load(path, weights_only=True)
    resumed = make(**overrides)
    resumed.load_state_dict(state)
    assert resumed.step == 20
    resumed.train(20)

    assert resumed.step == whole.step == 40
    for x, y in zip(whole.encoder.parameters(), resumed.encoder.parameters()):
        assert torch.equal(x, y)
    assert_same_params(whole, resumed)
    assert whole.evaluate() == resumed.evaluate()


def test_resume_differs_without_the_checkpoint():
    # Guards the resume test: a fresh run trained 20 steps is not where the resumed one is.
    whole, fresh = make(), make()
    whole.train(40)
    fresh.train(20)
    assert not torch.equal(next(whole.encoder.parameters()), next(fresh.encoder.parameters()))


@pytest.mark.parametrize("change", [{"seed": 1}, {"lr": 2e-3}, {"batch_size": 64}])
def test_loading_a_checkpoint_of_another_configuration_fails(change):
    # lr and batch_size are science fields (RunConfig.science_fields says why): the resumed run would be neither run
    state = make(seed=0).state_dict()
    with pytest.raises(ValueError, match="different configuration"):
        make(**change).load_state_dict(state)


def test_checkpoint_may_change_budget_and_reporting_fields():
    exp = make()
    exp.train(5)
    other = make(max_steps=77, report_every=3, eval_samples=512)
    other.load_state_dict(exp.state_dict())
    assert other.step == 5
    assert_same_params(exp, other)


# ------------------------------------------------------------------ evaluate
def test_evaluate_keys():
    out = make().evaluate()
    expected = {"r2", "mcc", "loss_floor", "loss_gap", "eval_loss", "r2_lambda_5", "r2_lambda_25"}
    expected |= {f"r2_dim_{i}" for i in range(4)} | {f"lambda_hat_{i}" for i in range(4)}
    assert expected <= set(out)
    assert "r2_dim_4" not in out and "lambda_hat_4" not in out
    assert out["r2_lambda_5"] == pytest.approx((out["r2_dim_0"] + out["r2_dim_1"]) / 2)
    assert out["r2_lambda_25"] == pytest.approx((out["r2_dim_2"] + out["r2_dim_3"]) / 2)
    assert out["r2"] == pytest.approx(sum(out[f"r2_dim_{i}"] for i in range(4)) / 4)
    assert out["loss_gap"] == pytest.approx(out["eval_loss"] - out["loss_floor"])
    assert all(out[f"lambda_hat_{i}"] > 0 for i in range(4))
    assert 0 <= out["mcc"] <= 1


def test_evaluate_is_reproducible_and_does_not_change_training():
    plain = make()
    plain.train(20)

    probed = make()
    probed.train(10)
    first = probed.evaluate()
    assert probed.evaluate() == first  # same checkpoint, same numbers
    probed.train(10)

    assert_same_params(plain, probed)
    assert plain.evaluate() == probed.evaluate()
    assert probed.encoder.training


def test_evaluate_keys_of_the_other_losses():
    ens = make(**VARIANTS["ensemble_aninfonce"]).evaluate()
    assert {f"lambda_hat_{k}_{i}" for k in range(2) for i in range(4)} <= set(ens)
    assert "loss_floor" in ens
    info = make(loss="infonce").evaluate()
    assert not any(k.startswith("lambda_hat") for k in info)
    assert "loss_floor" in info
    tricl = make(loss="tricl").evaluate()
    assert "lambda_hat_0" in tricl and "loss_floor" not in tricl


# ---------------------------------------------------------------- NaN guard
def test_huge_learning_rate_raises_non_finite_loss_error():
    # Unnormalised outputs let a learning rate of 1e6 blow the logits up within two steps.
    settings = {"normalize_output": False, "lr": 1e6, "lr_lambda": 1e6, "encoder_widths": [4, 4]}
    with pytest.raises(NonFiniteLossError) as info:
        make(**settings).train(20)
    found = re.fullmatch(
        r"loss became (nan|-?inf) at step (\d+) \(seed 0\); lower the learning rates or check Λ", str(info.value)
    )
    assert found, str(info.value)
    first = int(found.group(2))
    assert 1 <= first <= 20
    # the step it names is the first bad one: the same run stopped just before it trains on, every loss finite
    if first > 1:
        assert math.isfinite(make(**settings).train(first - 1)["loss"])


def test_non_finite_loss_error_names_the_first_bad_step():
    exp = make()
    exp.train(3)
    with torch.no_grad():
        next(exp.encoder.parameters())[0, 0] = float("nan")
    with pytest.raises(NonFiniteLossError, match=r"loss became nan at step 4 "):
        exp.train(5)


# ---------------------------------------------------------------------- vMF
def test_infonce_with_vmf_conditional_trains_and_evaluates():
    exp = make(loss="infonce", conditional="vmf", kappa=1.0)
    start = params(exp)
    result = exp.train(20)
    out = exp.evaluate()
    assert result["step"] == 20 and math.isfinite(result["loss"])
    assert any(not torch.equal(a, b) for a, b in zip(start, params(exp)))
    assert math.isfinite(out["r2"]) and math.isfinite(out["mcc"]) and math.isfinite(out["loss_gap"])
    assert out == train_and_evaluate(20, loss="infonce", conditional="vmf", kappa=1.0)


def test_true_latent_loss_is_the_runs_loss_on_the_true_latents_and_the_floor_at_the_optimum():
    """Fig. 10A's curve as a run reports it: ``true_latent_loss`` is the run's own loss (its fixed Λ̂) on the
    evaluation's true latents, with hard negatives only (Λ⁺ = 150, Λ⁻ = 100, d = 20); ``loss_floor`` is that loss at
    ``lambda_optimum`` = Λ⁺ − Λ⁻ whatever the run's Λ̂. Where the optimum lies (Cor. B.1) is test_loss_floor.py's."""

    def evaluate(lam: float) -> tuple[RunConfig, dict]:
        config = RunConfig(
            latent_dim=20,
            concentration=150.0,
            negative_concentration=100.0,
            n_hard_negatives=16,
            hard_negatives_from_step=0,
            batch_negatives=False,
            fixed_lambda_hat=lam,
            batch_size=2000,
            encoder_widths=[1],
            eval_samples=64,
            generator_cond_samples=100,
        )
        return config, Experiment(config).evaluate()

    config, at_optimum = evaluate(50.0)
    assert config.lambda_optimum == [50.0] * 20
    assert at_optimum["true_latent_loss"] == pytest.approx(at_optimum["loss_floor"], rel=1e-6)
    for lam in (25.0, 100.0):
        _, out = evaluate(lam)
        assert out["loss_floor"] == at_optimum["loss_floor"], "the floor is the truth's, not the run's Λ̂"
        assert out["true_latent_loss"] > out["loss_floor"], (lam, out["true_latent_loss"], out["loss_floor"])


def test_every_evaluation_records_how_hard_g_is_to_invert():
    exp = make()
    out = exp.evaluate()
    info = exp.generator.info
    assert out["g_cond_threshold"] == info.threshold
    assert [out[f"g_cond_layer_{i}"] for i in range(3)] == list(info.layer_conditions)
    assert max(info.layer_conditions) <= info.threshold
    # g alone is non-linear (R² < 1) but not hopeless (R² > 0), the same at every report and for every seed
    assert 0.3 < out["g_linear_r2"] < 0.999
    exp.train(3)
    assert exp.evaluate()["g_linear_r2"] == out["g_linear_r2"]
    assert make(seed=1, generator_seed=0).evaluate()["g_linear_r2"] == out["g_linear_r2"]
    # a linear g (1 layer) is recovered linearly: R² = 1 up to rounding
    assert make(generator_layers=1).evaluate()["g_linear_r2"] == pytest.approx(1.0, abs=1e-6)
