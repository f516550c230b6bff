"""A researcher's own parts by entry points (ablate.plugins, ablate.core.parts): the example package
examples/ablate-align-uniform (installed by `make setup`) as the installed plugin, and small factories here as
``module:attr`` plugins."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

import ablate
from ablate.config import ConfigError, RunConfig
from ablate.core.experiment import Experiment
from ablate.core.pack_fields import can_pack
from ablate.core.parts import check_plugins
from ablate.plugins import PluginError, load

align_uniform = pytest.importorskip("ablate_align_uniform", reason="make setup installs examples/ablate-align-uniform")

TINY = {"latent_dim": 4, "encoder_widths": [2, 2], "batch_size": 16, "eval_samples": 64, "generator_cond_samples": 50}


def test_contrastive_loss_imports_from_ablate_losses():
    from ablate.losses import ContrastiveLoss

    assert ablate.losses.ContrastiveLoss is ContrastiveLoss
    assert issubclass(align_uniform.AlignUniform, ContrastiveLoss)


def test_align_uniform_equals_a_slow_loop_over_pairs():
    gen = torch.Generator().manual_seed(0)
    h1 = torch.nn.functional.normalize(torch.randn(7, 4, generator=gen, dtype=torch.float64), dim=1)
    h2 = torch.nn.functional.normalize(torch.randn(7, 4, generator=gen, dtype=torch.float64), dim=1)
    t, alpha, wa, wu = 1.5, 2.0, 0.7, 1.3
    align = sum(float((h1[i] - h2[i]).norm()) ** alpha for i in range(7)) / 7

    def unif(h):
        pairs = list(itertools.combinations(range(7), 2))
        return math.log(sum(math.exp(-t * float((h[i] - h[j]).pow(2).sum())) for i, j in pairs) / len(pairs))

    want = wa * align + wu * (unif(h1) + unif(h2)) / 2
    loss = align_uniform.AlignUniform(t=t, alpha=alpha, align_weight=wa, uniform_weight=wu)
    assert float(loss(h1, h2)) == pytest.approx(want, rel=1e-12)
    assert float(loss.batch_loss([(h1, h2)])) == pytest.approx(want, rel=1e-12)
    assert loss.lambda_hat is None


def test_the_entry_point_names_the_plugin_and_its_distribution():
    found = load("loss", "align_uniform")
    assert found.distribution == "ablate-align-uniform" and found.version == "0.1.0"
    assert found.factory is align_uniform.build
    config = RunConfig(loss="align_uniform", loss_options={"t": 3})
    assert config.science()["loss_options"] == {"t": 3}
    assert "loss_options" not in RunConfig().science(), "the keys of runs made before plugins stay as they were"
    assert can_pack(config) == (False, "loss 'align_uniform' is a plugin's, with no packed form")


def test_an_unknown_name_gets_one_line_with_the_names_and_the_closest():
    with pytest.raises(ConfigError) as err:
        RunConfig.build({"loss": "align_unifrom"}, "grid.yaml")
    text = str(err.value)
    assert "\n" not in text
    assert "unknown loss 'align_unifrom'" in text and "did you mean 'align_uniform'?" in text
    assert "built-in aninfonce, infonce, ensemble_aninfonce, tricl" in text and "align_uniform" in text
    with pytest.raises(ConfigError, match="unknown conditional 'gauss'"):
        RunConfig.build({"conditional": "gauss"})
    with pytest.raises(ConfigError, match="loss_options: the built-in loss 'infonce' takes none"):
        RunConfig.build({"loss": "infonce", "loss_options": {"t": 1}})


def test_bad_options_get_one_line_naming_the_plugin_its_distribution_and_the_option():
    config = RunConfig(loss="align_uniform", loss_options={"temperature": 2}, **TINY)
    with pytest.raises(PluginError) as err:
        check_plugins(config)
    text = str(err.value)
    assert "\n" not in text
    assert "loss 'align_uniform' (ablate-align-uniform 0.1.0)" in text and "temperature" in text
    with pytest.raises(PluginError, match=r"refused option 't'.*t and alpha must be > 0"):
        check_plugins(RunConfig(loss="align_uniform", loss_options={"t": -1}, **TINY))


def test_a_module_attr_factory_trains_and_its_floor_is_empty():
    config = RunConfig(loss="ablate_align_uniform:build", loss_options={"t": 2.0}, max_steps=4, **TINY)
    exp = Experiment(config)
    trained = exp.train(4)
    out = exp.evaluate()
    assert exp.step == 4 and 0 <= out["r2"] <= 1 and math.isfinite(trained["loss"]) and math.isfinite(out["eval_loss"])
    assert "loss_floor" not in out and "loss_gap" not in out, "no floor attribute: the loss-floor columns stay empty"
    assert load("loss", "ablate_align_uniform:build").distribution == "ablate-align-uniform"


def test_a_plugin_conditional_generator_and_encoder_are_built_from_their_factories():
    config = RunConfig(
        conditional="tests.plugins.parts:gaussian_positive",
        conditional_options={"scale": 0.05},
        generator="tests.plugins.parts:orthogonal_g",
        encoder="tests.plugins.parts:linear_encoder",
        encoder_options={"bias": False},
        max_steps=6,
        **TINY,
    )
    exp = Experiment(config)
    assert type(exp.encoder).__name__ == "Linear" and exp.encoder.bias is None
    assert not any(p.requires_grad for p in exp.generator.parameters())
    assert "g_cond_threshold" not in exp.generator_stats and exp.generator_stats["g_linear_r2"] > 0.99
    exp.train(6)
    assert 0 <= exp.evaluate()["r2"] <= 1
    again = Experiment(config)
    again.train(6)
    assert json.dumps(exp.evaluate(), default=str) == json.dumps(again.evaluate(), default=str), (
        "same seed, same numbers"
    )
    with pytest.raises(PluginError, match="encoder 'tests.plugins.parts:not_a_module'.*not a torch.nn.Module"):
        Experiment(config.model_copy(update={"encoder": "tests.plugins.parts:not_a_module", "encoder_options": {}}))
