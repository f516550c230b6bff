"""The parts of a run other than the loss: the positive conditional, the generator g and the encoder f, each the
built-in one or a plugin's (:mod:`ablate.plugins`). The loss's own registry is :mod:`ablate.core.losses.registry`.

A plugin's factory is called with the run's config and its options (``<kind>_options`` of the config) as keyword
arguments:

- conditional, group ``ablate.conditionals``: ``build(config, **options)`` returns ``sample(z, lam, generator)``,
  the positives ``(n, d)`` on the unit sphere of anchors ``z`` ``(n, d)``, given Λ's diagonal ``lam`` ``(d,)`` (a
  tensor on ``z``'s device and dtype) and a ``torch.Generator`` on that device to draw from;
- generator, group ``ablate.generators``: ``build(config, **options)`` returns a ``torch.nn.Module`` g mapping
  latents ``(n, d)`` to observations ``(n, d)``; ablate freezes it, moves it to the run's device and dtype, and
  builds it from ``config.effective_generator_seed`` (the factory draws its weights from that seed);
- encoder, group ``ablate.encoders``: ``build(config, generator, **options)`` returns a ``torch.nn.Module`` f
  mapping observations ``(n, d)`` to encodings ``(n, d)``, its weights drawn from ``generator`` (a CPU
  ``torch.Generator`` seeded by the run's seed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ablate import plugins
from ablate.config import RunConfig
from ablate.core import dgp
from ablate.core.encoder import Encoder, init_encoder_
from ablate.core.generator import build_generator
from ablate.core.losses.registry import build_loss

__all__ = ["PositiveSampler", "build_conditional", "build_encoder", "build_g", "check_plugins", "plugins_of"]

#: ``sample(z, lam, generator) -> positives``: a positive conditional.
PositiveSampler = Callable[[Tensor, Tensor, torch.Generator], Tensor]


def plugins_of(config: RunConfig) -> list[plugins.Plugin]:
    """The plugins ``config`` names (its loss, conditional, generator, encoder that are not built in), loaded."""
    names = {
        "loss": config.loss,
        "conditional": config.conditional,
        "generator": config.generator,
        "encoder": config.encoder,
    }
    return [plugins.load(kind, name) for kind, name in names.items() if name not in RunConfig.builtin_names(kind)]


def build_conditional(config: RunConfig) -> PositiveSampler:
    """The positive conditional of ``config``: projected normal N(z, Λ⁻¹), von Mises–Fisher(κ), or a plugin's."""
    if config.conditional == "vmf":
        return lambda z, lam, rng: dgp.sample_vmf(z, config.kappa, generator=rng)
    if config.conditional == "normal":
        return lambda z, lam, rng: dgp.sample_conditional(z, lam, threshold=config.threshold, generator=rng)
    found = plugins.load("conditional", config.conditional)
    return plugins.call_factory(found, config, options=config.conditional_options)


def build_g(config: RunConfig) -> nn.Module:
    """The generator g of ``config`` (frozen, on the CPU in float32): the papers' invertible MLP or a plugin's."""
    if config.generator == "invertible_mlp":
        return build_generator(
            config.latent_dim,
            n_layers=config.generator_layers,
            seed=config.effective_generator_seed,
            cond_quantile=config.generator_cond_quantile,
            n_cond_samples=config.generator_cond_samples,
        )
    g = plugins.call_factory(plugins.load("generator", config.generator), config, options=config.generator_options)
    _check_module(g, "generator", config.generator)
    g.requires_grad_(False)
    return g.eval()


def build_encoder(config: RunConfig, generator: torch.Generator) -> nn.Module:
    """The encoder f of ``config``, its weights drawn from ``generator``: the reference MLP or a plugin's."""
    if config.encoder == "mlp":
        d = config.latent_dim
        encoder = Encoder(d, d, config.encoder_widths, normalize=config.normalize_output)
        init_encoder_(encoder, generator)
        return encoder
    found = plugins.load("encoder", config.encoder)
    encoder = plugins.call_factory(found, config, generator, options=config.encoder_options)
    _check_module(encoder, "encoder", config.encoder)
    return encoder


def _check_module(obj: Any, kind: str, name: str) -> None:
    if not isinstance(obj, nn.Module):
        raise plugins.PluginError(f"{kind} {name!r}: its factory returned {type(obj).__name__}, not a torch.nn.Module")


def check_plugins(config: RunConfig) -> None:
    """Build each plugin part ``config`` names once, on the CPU, so that a plugin that cannot load or refuses its
    options fails in one line when the grid loads, before Ray starts (PluginError)."""
    kinds = {p.kind for p in plugins_of(config)}
    if not kinds:
        return
    cpu = config.model_copy(update={"device": "cpu"})
    rng = torch.Generator().manual_seed(0)
    if "loss" in kinds:
        build_loss(cpu, rng)
    if "conditional" in kinds:
        build_conditional(cpu)
    if "generator" in kinds:
        build_g(cpu)
    if "encoder" in kinds:
        build_encoder(cpu, rng)
