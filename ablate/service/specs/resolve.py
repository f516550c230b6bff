"""What a run runs, resolved once: a grid at its scale with the preset, ``--set`` and ``--variants`` applied
(:func:`resolve_grid`, for `ablate run`, `ablate slurm` and :func:`ablate.service.execution.runner.run_grid`), or one
run's settings from a preset and ``--set`` (:func:`resolve_config`, for `ablate train`). Both read the preset and the
``--set`` assignments through :func:`chosen_settings`.

A bad value is one line (:class:`GridError`, :class:`PresetError` or :class:`ConfigError`) before any compute. Nothing
here prints, starts Ray or writes a file: what a resolution has to tell the user (an axis a ``--set`` replaced) goes
to the ``note`` it is given.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ablate.config import ConfigError, RunConfig, parse_assignments
from ablate.service.specs.grids import Grid, axis_text, load_grid
from ablate.service.specs.presets import Preset, load_preset

__all__ = ["GridChoice", "chosen_settings", "resolve_config", "resolve_grid"]


class GridChoice(Protocol):
    """What chooses a grid's trials besides its file (:class:`ablate.service.execution.options.RunOptions` is one)."""

    scale: str
    preset: str | None
    settings: list[str] | None
    variants: str | None


def chosen_settings(preset: str | None, settings: Sequence[str] | None) -> tuple[Preset | None, dict[str, Any]]:
    """The preset ``preset`` names (None: none) and the ``--set`` ``settings`` (``KEY=VALUE``) as RunConfig values."""
    return (load_preset(preset) if preset else None), parse_assignments(list(settings or []))


def resolve_config(preset: str | None, settings: Sequence[str] | None) -> RunConfig:
    """One run's settings (`ablate train`): the RunConfig defaults, the preset over them, ``--set`` over both."""
    loaded, assignments = chosen_settings(preset, settings)
    values = {**(loaded.settings if loaded else {}), **assignments}
    return RunConfig.build(values, "--preset/--set" if loaded else "--set")


def resolve_grid(
    grid: str | os.PathLike[str] | Grid,
    options: GridChoice | None = None,
    *,
    note: Callable[[str], None] | None = None,
    named: bool = False,
) -> Grid:
    """The grid to run: ``grid`` (a shipped grid's name or a grid file) loaded at ``options.scale``, or a copy of the
    :class:`Grid` handed in (loaded at that scale), with ``options``' preset, ``--set`` and ``--variants`` applied,
    in that order: the grid's axes and variants win over the preset, ``--set`` over both. A Grid that nothing
    changes is returned as it is; ``options`` None: a name loads at the default scale.

    ``note`` hears what the user should know (the settings a preset leaves to the grid's axes, an axis a ``--set``
    replaced); ``named``: a ``--set``'s note begins with the grid's name (one of several grids).
    """
    if isinstance(grid, Grid):
        if options is not None and options.scale != grid.scale:
            raise ConfigError(
                f"--scale {options.scale}: grid {grid.name} was loaded at scale {grid.scale}; load it at "
                f"{options.scale}, or pass its name or file to resolve it at that scale"
            )
        if options is None or not (options.preset or options.settings or options.variants):
            return grid
        resolved = grid.model_copy(deep=True)  # the caller's grid stays as it was
    elif options is None:
        return load_grid(os.fspath(grid))
    else:
        resolved = load_grid(os.fspath(grid), options.scale)
    say = note or (lambda line: None)
    preset, assignments = chosen_settings(options.preset, options.settings)
    if preset is not None:
        kept = resolved.apply_settings(preset.settings, f"preset {preset.name}:", axes_win=True)
        resolved.preset = preset.name
        if kept:
            say(f"{resolved.name}: preset {preset.name}: {', '.join(kept)} stay as the grid varies them")
    if assignments:
        raw = {item.partition("=")[0].strip(): item.partition("=")[2] for item in options.settings or []}
        before = set(resolved.replaced)
        kept = resolved.apply_settings(assignments, "--set", axes_win=False)
        lead = f"{resolved.name}: " if named else ""
        replaced = {k: v for k, v in resolved.replaced.items() if k not in before}
        for key, was in replaced.items():  # the grid's figure has one axis fewer
            say(f"{lead}--set {key}={raw[key]}: replaces the grid's axis {key} (was {axis_text(was)})")
        for key in kept:
            say(f"{lead}--set {key}={raw[key]}: the grid's variants or search set {key} themselves and keep theirs")
    if options.variants:
        resolved.select_variants(options.variants.split(","), "--variants")
    return resolved
