"""Tests of `ablate.config`: reference defaults, Λ specs, validation messages and ``--set`` parsing."""

from __future__ import annotations

import re

import pytest

from ablate.config import ConfigError, RunConfig, parse_assignments, resolve_concentration


def build_error(**values) -> str:
    """The message of the ConfigError that ``RunConfig.build(values)`` must raise."""
    with pytest.raises(ConfigError) as info:
        RunConfig.build(values, "test")
    return str(info.value)


# ------------------------------------------------------------------ defaults
def test_defaults_follow_the_reference():
    cfg = RunConfig()
    assert cfg.latent_dim == 10
    assert cfg.batch_size == 1000
    assert cfg.lr == 1e-4
    assert cfg.lr_lambda == 1e-3
    assert cfg.threshold == 0.1
    assert cfg.report_every == 250
    assert cfg.eval_samples == 4096
    assert cfg.loss == "aninfonce"
    assert cfg.lambda_true == [5.0] * 5 + [25.0] * 5


def test_build_without_values_equals_defaults():
    assert RunConfig.build({}) == RunConfig()


# ------------------------------------------------------------ Λ resolution
@pytest.mark.parametrize(
    ("spec", "d", "expected"),
    [
        (7, 3, [7.0, 7.0, 7.0]),
        (2.5, 2, [2.5, 2.5]),
        ([1, 2, 3, 4], 4, [1.0, 2.0, 3.0, 4.0]),
        ("5/25", 4, [5.0, 5.0, 25.0, 25.0]),
        ("5/25", 10, [5.0] * 5 + [25.0] * 5),
        ("1/2/3", 6, [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]),
        ({"blocks": [5, 25]}, 4, [5.0, 5.0, 25.0, 25.0]),
        ({"linspace": [5, 50]}, 10, [5.0 + 5.0 * i for i in range(10)]),
        ({"linspace": [5, 50]}, 2, [5.0, 50.0]),
    ],
)
def test_resolve_concentration(spec, d, expected):
    assert resolve_concentration(spec, d) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "spec",
    [7, [1, 2, 3, 4], "5/25", {"blocks": [5, 25]}, {"linspace": [5, 50]}],
)
def test_every_spec_form_is_accepted_by_runconfig(spec):
    cfg = RunConfig.build({"latent_dim": 4, "concentration": spec})
    assert cfg.lambda_true == resolve_concentration(spec, 4)
    assert len(cfg.lambda_true) == 4


def test_ensemble_and_negative_concentration_resolve():
    cfg = RunConfig.build({"latent_dim": 4, "loss": "ensemble_aninfonce", "ensemble": ["5/25", "25/5"]})
    assert cfg.lambda_ensemble == [[5.0, 5.0, 25.0, 25.0], [25.0, 25.0, 5.0, 5.0]]
    assert cfg.lambda_true == [5.0, 5.0, 25.0, 25.0]
    cfg = RunConfig.build({"latent_dim": 4, "negative_concentration": 2, "n_hard_negatives": 3})
    assert cfg.lambda_negative == [2.0] * 4
    assert RunConfig.build({"latent_dim": 4}).lambda_negative is None


def test_generator_seed_defaults_to_seed():
    assert RunConfig.build({"seed": 3}).effective_generator_seed == 3
    assert RunConfig.build({"seed": 3, "generator_seed": 11}).effective_generator_seed == 11


# ---------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("values", "field", "rule"),
    [
        ({"latent_dim": 1}, "latent_dim", "greater than or equal to 2"),
        ({"latent_dim": 0}, "latent_dim", "greater than or equal to 2"),
        ({"batch_size": 1}, "batch_size", "greater than or equal to 2"),
        ({"concentration": 0}, "concentration", "> 0"),
        ({"concentration": -3.0}, "concentration", "> 0"),
        ({"latent_dim": 4, "concentration": [5, 5, 0, 5]}, "concentration", "> 0"),
        ({"latent_dim": 4, "concentration": [5, -1, 5, 5]}, "concentration", "> 0"),
        ({"latent_dim": 4, "concentration": "5/-25"}, "concentration", "> 0"),
        ({"latent_dim": 4, "concentration": [5, 5, 5]}, "concentration", "latent_dim=4"),
        ({"latent_dim": 4, "concentration": [5] * 5}, "concentration", "latent_dim=4"),
        ({"latent_dim": 4, "concentration": "5/25/7"}, "concentration.blocks", "equal blocks"),
        ({"concentration": "five/25"}, "concentration", "'a/b"),
        ({"concentration": {"linspace": [5]}}, "concentration.linspace", "[low, high]"),
        ({"loss": "simclr"}, "loss", "built-in aninfonce, infonce, ensemble_aninfonce, tricl"),
        ({"batch_size": "big"}, "batch_size", "valid integer"),
        ({"lr": "fast"}, "lr", "valid number"),
        ({"lr": 0}, "lr", "greater than 0"),
        ({"n_hard_negatives": 2}, "negative_concentration", "required when n_hard_negatives > 0"),
        ({"negative_concentration": 2.0}, "n_hard_negatives", ">= 1"),
        ({"negative_concentration": 2.0, "n_hard_negatives": 1, "loss": "infonce"}, "loss", "'aninfonce'"),
        ({"ensemble": ["5/25", "25/5"]}, "ensemble", "only used with loss 'ensemble_aninfonce'"),
        ({"loss": "ensemble_aninfonce"}, "ensemble", "at least 2"),
        ({"loss": "ensemble_aninfonce", "ensemble": ["5/25"]}, "ensemble", "at least 2"),
        ({"loss": "ensemble_aninfonce", "ensemble": ["5/25", 0]}, "ensemble[1]", "> 0"),
        ({"encoder_widths": [10, 0]}, "encoder_widths", "positive"),
        ({"loss": "infonce", "fixed_lambda_hat": 1.0}, "fixed_lambda_hat", "'aninfonce'"),
    ],
)
def test_invalid_values_name_field_and_rule(values, field, rule):
    msg = build_error(**values)
    assert msg.startswith("test: "), msg
    assert f"{field}:" in msg, msg
    assert rule in msg, msg


def test_unknown_key_lists_allowed_keys():
    msg = build_error(latent_dims=4)
    assert "latent_dims: unknown key" in msg
    assert "allowed keys:" in msg
    for key in ("latent_dim", "concentration", "batch_size", "loss", "seed"):
        assert key in msg.split("allowed keys:")[1]


def test_every_config_error_reaches_python_callers_as_a_value_error_naming_the_field():
    """Callers of the Python API catch ValueError whichever rule fails: a field's own (pydantic), a Λ spec
    (ConfigError raised inside the model's validator) or one across fields, at construction or on assignment;
    RunConfig.build re-raises each as a ConfigError naming its source."""
    cases = [
        ({"latent_dim": 1}, "latent_dim"),
        ({"latent_dim": 4, "concentration": "5/x"}, "concentration: pattern '5/x' is not of the form"),
        ({"n_hard_negatives": 2}, "negative_concentration: required when n_hard_negatives > 0"),
    ]
    for values, named in cases:
        with pytest.raises(ValueError, match=re.escape(named)):
            RunConfig(**values)
        with pytest.raises(ConfigError, match=f"^test: .*{re.escape(named)}"):
            RunConfig.build(values, "test")
    cfg = RunConfig(latent_dim=4)
    with pytest.raises(ValueError, match="concentration: pattern '5/x'"):
        cfg.concentration = "5/x"
    with pytest.raises(ValueError, match="concentration: pattern '5/x'"):
        resolve_concentration("5/x", 4)


def test_assignment_is_validated():
    cfg = RunConfig()
    with pytest.raises(ValueError, match="latent_dim"):
        cfg.latent_dim = 1


def test_every_loss_name_a_config_allows_is_registered_and_builds():

    import torch

    from ablate.config import LOSS_NAMES
    from ablate.core.losses import LOSSES, ContrastiveLoss, build_loss

    allowed = set(RunConfig.builtin_names("loss"))
    assert allowed == set(LOSSES) == set(LOSS_NAMES), "RunConfig.loss and the loss registry name the same losses"
    with pytest.raises(ConfigError, match="loss: .*built-in aninfonce, infonce, ensemble_aninfonce, tricl"):
        RunConfig.build({"loss": "nce"})
    for loss in sorted(allowed):
        extra = {"ensemble": ["5/25", "25/5"]} if loss == "ensemble_aninfonce" else {}
        config = RunConfig.build({"loss": loss, "latent_dim": 4, **extra})
        assert config.loss == loss
        assert isinstance(build_loss(config, torch.Generator().manual_seed(0)), ContrastiveLoss)


# ------------------------------------------------------ --set key=value parsing
def test_parse_assignments_reads_yaml_scalars_and_lists():
    out = parse_assignments(
        [
            "latent_dim=4",
            "lr=0.001",
            "lr_lambda=1e-3",
            "tau=2.5E+1",
            "concentration=5/25",
            "encoder_widths=[4, 4]",
            "ensemble=['5/25', 25/5]",
            "normalize_output=false",
            "target_r2=null",
            "loss=infonce",
            "fixed_lambda_hat=[1e2, 3, 0.5]",
            "negative_concentration={blocks: [1, 2]}",
        ]
    )
    assert out == {
        "latent_dim": 4,
        "lr": 0.001,
        "lr_lambda": 0.001,
        "tau": 25.0,
        "concentration": "5/25",
        "encoder_widths": [4, 4],
        "ensemble": ["5/25", "25/5"],
        "normalize_output": False,
        "target_r2": None,
        "loss": "infonce",
        "fixed_lambda_hat": [100.0, 3, 0.5],
        "negative_concentration": {"blocks": [1, 2]},
    }
    assert type(out["latent_dim"]) is int
    assert type(out["lr_lambda"]) is float


def test_parse_assignments_keeps_the_value_after_the_first_equals_sign():
    assert parse_assignments([" loss =a=b"]) == {"loss": "a=b"}


@pytest.mark.parametrize("item", ["latent_dim", "=4", ""])
def test_parse_assignments_rejects_items_without_key_and_value(item):
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_assignments([item])


def test_parsed_assignments_build_a_config():
    cfg = RunConfig.build(parse_assignments(["latent_dim=4", "concentration=[1, 2, 3, 4]", "lr=3e-4"]))
    assert cfg.lambda_true == [1.0, 2.0, 3.0, 4.0]
    assert cfg.lr == 3e-4
