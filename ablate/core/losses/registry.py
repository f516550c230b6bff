"""The loss registry: a config's ``loss`` name → how to build the loss, and the loss at the true metric (its floor).

Every entry builds a :class:`~ablate.core.losses.base.ContrastiveLoss`, so the training loop calls
``loss.batch_loss(pairs, negatives)`` without knowing which loss it holds. A name that is not built in is a
plugin's (:mod:`ablate.plugins`, group ``ablate.losses``): its factory ``build(config, generator, **options)``
gets ``config.loss_options`` as keyword arguments, and its optional attribute ``floor(config,
hard_negatives_active)`` gives the loss at the true metric (without one, the loss-floor columns stay empty).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ablate import plugins
from ablate.config import LOSS_NAMES, RunConfig, resolve_concentration
from ablate.core.losses.aninfonce import AnInfoNCE, EnsembleAnInfoNCE, HardNegativeAnInfoNCE
from ablate.core.losses.base import ContrastiveLoss
from ablate.core.losses.infonce import InfoNCE
from ablate.core.losses.tricl import TriCL

__all__ = ["LOSSES", "LossKind", "build_loss", "floor_loss"]


@dataclass(frozen=True)
class LossKind:
    """A registered loss: how to build it for a run, and its floor (the same loss with the true metric, evaluated
    on the true latents: the global minimum of Fig. 2C), or None where there is no true metric (TriCL)."""

    name: str
    build: Callable[[RunConfig, torch.Generator], ContrastiveLoss]
    floor: Callable[[RunConfig, bool], ContrastiveLoss | None]


def _fixed(config: RunConfig) -> list[float] | None:
    if config.fixed_lambda_hat is None:
        return None
    return resolve_concentration(config.fixed_lambda_hat, config.latent_dim, "fixed_lambda_hat")


def _aninfonce(config: RunConfig, generator: torch.Generator) -> ContrastiveLoss:
    d, std = config.latent_dim, config.lambda_hat_init_std
    if config.negative_concentration is not None:
        return HardNegativeAnInfoNCE(
            d, _fixed(config), batch_negatives=config.batch_negatives, init_std=std, generator=generator
        )
    return AnInfoNCE(d, _fixed(config), init_std=std, generator=generator)


def _aninfonce_floor(config: RunConfig, hard_negatives_active: bool) -> ContrastiveLoss:
    d = config.latent_dim
    if config.negative_concentration is not None and hard_negatives_active:  # Cor. B.1: optimum at Λ⁺ − Λ⁻
        optimum = torch.tensor(config.lambda_optimum).clamp_min(1e-6)
        return HardNegativeAnInfoNCE(d, optimum, batch_negatives=config.batch_negatives)
    return AnInfoNCE(d, config.lambda_true)


#: Every loss a config may name (``RunConfig.loss``), by name: one entry per name of
#: :data:`ablate.config.LOSS_NAMES`, in its order (checked below).
LOSSES: dict[str, LossKind] = {
    kind.name: kind
    for kind in (
        LossKind("aninfonce", _aninfonce, _aninfonce_floor),
        LossKind(
            "infonce",
            lambda c, g: InfoNCE(c.tau, c.infonce_layout),
            lambda c, active: InfoNCE(c.tau, c.infonce_layout),
        ),
        LossKind(
            "ensemble_aninfonce",
            lambda c, g: EnsembleAnInfoNCE(
                c.latent_dim, len(c.lambda_ensemble), init_std=c.lambda_hat_init_std, generator=g
            ),
            lambda c, active: EnsembleAnInfoNCE(c.latent_dim, len(c.lambda_ensemble), fixed=c.lambda_ensemble),
        ),
        LossKind(
            "tricl",
            lambda c, g: TriCL(
                c.latent_dim, decorrelation=c.tricl_decorrelation, init_std=c.lambda_hat_init_std, generator=g
            ),
            lambda c, active: None,
        ),
    )
}
if tuple(LOSSES) != LOSS_NAMES:  # a loss added to one place only: fail at import, not when a run names it
    raise ImportError(f"the loss registry holds {tuple(LOSSES)}, but ablate.config.LOSS_NAMES is {LOSS_NAMES}")


def build_loss(config: RunConfig, generator: torch.Generator) -> ContrastiveLoss:
    """The training loss named by the config (a fresh module, Λ̂ initialised from ``generator``)."""
    kind = LOSSES.get(config.loss)
    if kind is not None:
        return kind.build(config, generator)
    plugin = plugins.load("loss", config.loss)
    loss = plugins.call_factory(plugin, config, generator, options=config.loss_options)
    if not isinstance(loss, ContrastiveLoss):
        raise plugins.PluginError(
            f"{plugin.describe()}: its factory returned {type(loss).__name__}, not an ablate.losses.ContrastiveLoss"
        )
    return loss


def floor_loss(config: RunConfig, hard_negatives_active: bool) -> ContrastiveLoss | None:
    """The loss with the true metric (Λ, or Λ⁺ − Λ⁻ while hard negatives are used), or None where there is none
    (TriCL, a plugin without ``floor``)."""
    kind = LOSSES.get(config.loss)
    if kind is not None:
        return kind.floor(config, hard_negatives_active)
    floor = getattr(plugins.load("loss", config.loss).factory, "floor", None)
    return None if floor is None else floor(config, hard_negatives_active)
