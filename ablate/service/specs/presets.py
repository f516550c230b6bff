"""Named presets: bundles of RunConfig settings that any run or grid can start from (``--preset NAME``).

A preset lives in ``ablate/presets/<name>.yaml`` (model: :class:`PresetFile`)::

    name: fast
    description: what it is for
    settings: {lr: ..., batch_size: ...}    # RunConfig fields
    measured: ...                            # free text: the measurement behind it (command, machine, numbers)

A preset changes *how* a trial trains (learning rates, schedule, batch size, width, report interval,
steps), never *what* it studies: on a grid, the grid's axes and variants win over the preset, and ``--set``
wins over both. The preset's values replace the grid's base values at every scale, the smoke scale's tiny
ones too: pair it with ``--set max_steps=…`` for a short run. The reference-faithful settings stay the
RunConfig defaults.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from ablate.config import ConfigError, RunConfig, did_you_mean
from ablate.service.specs.base import Settings, Spec, parse_spec, read_yaml
from ablate.shipped import PRESETS, shipped_files

__all__ = [
    "PRESET_FILE_SUFFIXES",
    "Preset",
    "PresetError",
    "PresetFile",
    "known_presets",
    "load_preset",
    "scale_presets",
]

#: A preset named with one of these suffixes is a file (by its path), anything else a shipped preset's name.
PRESET_FILE_SUFFIXES = (".yaml", ".yml")


class PresetFile(Spec):
    """A preset file: RunConfig settings a run or grid can start from (``--preset NAME``)."""

    name: str | None = Field(default=None, description="the preset's name (default: the file name)")
    description: str = Field(default="", description="what the preset is for")
    settings: Settings = Field(min_length=1, description="RunConfig fields")
    measured: str = Field(default="", description="the measurement behind it (command, machine, numbers)")

    @field_validator("settings")
    @classmethod
    def _valid_values(cls, settings: dict[str, Any]) -> dict[str, Any]:
        try:
            RunConfig.build(dict(settings), "settings")
        except ConfigError as exc:
            raise ValueError(str(exc).removeprefix("settings: ")) from None
        return settings


class PresetError(ValueError):
    """A preset is unknown or invalid; the message names the file, the key and what is allowed."""


class Preset(PresetFile):
    """A validated preset: the file's contents, its name (the file's, unless it names itself) and its path."""

    name: str = Field(description="the preset's name")
    path: Path = Field(description="the preset file")


def known_presets() -> dict[str, Path]:
    """Preset name → YAML path for every preset shipped in ablate/presets/."""
    return shipped_files(PRESETS)


def load_preset(name_or_path: str) -> Preset:
    """Load and validate a shipped preset by name, or a preset YAML file by path."""
    path = Path(name_or_path)
    if path.suffix not in PRESET_FILE_SUFFIXES:
        presets = known_presets()
        if name_or_path not in presets:
            raise PresetError(
                f"unknown preset {name_or_path!r}{did_you_mean(name_or_path, presets)}; known presets: {', '.join(presets) or 'none'} "
                "(or give a path to a .yaml file)"
            )
        path = presets[name_or_path]
    spec = parse_spec(PresetFile, read_yaml(path, PresetError), path, PresetError)
    return Preset(**{**dict(spec), "name": spec.name or path.stem}, path=path)


def scale_presets(scales: dict[str, Any], source: str | os.PathLike, error: type[Exception]) -> dict[str, Preset]:
    """The preset each scale of a grid names (``scales.<scale>.preset``), by scale; one that does not load raises
    ``error`` naming ``source`` and the key."""
    out = {}
    for scale, over in scales.items():
        if over.preset is not None:
            try:
                out[scale] = load_preset(over.preset)
            except PresetError as exc:
                raise error(f"{source}: scales.{scale}.preset: {exc}") from None
    return out
