"""Checks of a grid before any compute, each failing in one line that names the file and the trial: plugins that
cannot load or refuse their options, a rejection sampler that would hardly ever accept; and the plugins a grid
names, for its provenance."""

from __future__ import annotations

import json
from typing import Any

from ablate.service.specs.grids import Grid, GridError

__all__ = ["PLUGIN_SETTINGS", "grid_plugins", "probe_acceptance", "probe_plugins"]


def probe_plugins(grid: Grid) -> None:
    """Fail before any compute, in one line, when a plugin part a trial names cannot load or refuses its options:
    each distinct plugin setting is built once on the CPU (:func:`ablate.core.parts.check_plugins`)."""
    from ablate.core.parts import check_plugins
    from ablate.plugins import PluginError

    seen = set()
    for trial in grid.trials:
        cfg = trial.config
        key = json.dumps({k: getattr(cfg, k) for k in PLUGIN_SETTINGS}, sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        try:
            check_plugins(cfg)
        except PluginError as exc:
            raise GridError(f"{grid.path}: trial {trial.label}: {exc}") from None


def grid_plugins(grid: Grid) -> list[dict[str, Any]]:
    """The plugin parts the grid's trials name, each once, as provenance records them."""
    from ablate.core.parts import plugins_of

    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for trial in grid.trials:
        for plugin in plugins_of(trial.config):
            seen.setdefault((plugin.kind, plugin.name), plugin.provenance())
    return list(seen.values())


#: The settings that decide which plugin parts a trial builds, and with which options.
PLUGIN_SETTINGS = (
    "loss",
    "loss_options",
    "conditional",
    "conditional_options",
    "generator",
    "generator_options",
    "encoder",
    "encoder_options",
    "latent_dim",
)


def probe_acceptance(grid: Grid) -> None:
    """Fail before any compute when a trial's Λ/threshold/d makes the rejection sampler hopeless."""
    import torch

    from ablate.core.dgp import LowAcceptanceError, sample_conditional, sample_uniform

    seen = set()
    for trial in grid.trials:
        cfg = trial.config
        if cfg.conditional != "normal" or cfg.threshold is None:
            continue
        lams = [tuple(lam) for lam in cfg.lambda_ensemble]
        if cfg.lambda_negative is not None:
            lams.append(tuple(cfg.lambda_negative))
        for lam in lams:
            key = (lam, cfg.threshold)
            if key in seen:
                continue
            seen.add(key)
            gen = torch.Generator().manual_seed(0)
            z = sample_uniform(256, len(lam), generator=gen)
            try:
                sample_conditional(z, torch.tensor(lam), threshold=cfg.threshold, generator=gen)
            except LowAcceptanceError as exc:
                raise GridError(f"{grid.path}: trial {trial.label}: {exc}") from None
