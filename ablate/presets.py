"""Named presets: bundles of RunConfig settings that any run or grid can start from (``--preset NAME``).

A preset lives in ``presets/<name>.yaml``::

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

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate.config import ConfigError, RunConfig, read_yaml_mapping

__all__ = ["PRESET_DIR", "Preset", "PresetError", "known_presets", "load_preset"]

#: The presets shipped with ablate.
PRESET_DIR = Path(__file__).resolve().parent.parent / "presets"
_TOP_KEYS = ("name", "description", "settings", "measured")


class PresetError(ValueError):
    """A preset is unknown or invalid; the message names the file, the key and what is allowed."""


@dataclass(frozen=True)
class Preset:
    """A validated preset."""

    name: str
    path: Path
    description: str
    settings: dict[str, Any] = field(default_factory=dict)
    measured: str = ""


def known_presets() -> dict[str, Path]:
    """Preset name → YAML path for every preset shipped in presets/."""
    return {p.stem: p for p in sorted(PRESET_DIR.glob("*.yaml"))}


def load_preset(name_or_path: str) -> Preset:
    """Load and validate a shipped preset by name, or a preset YAML file by path."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        presets = known_presets()
        if name_or_path not in presets:
            raise PresetError(f"unknown preset {name_or_path!r}; known presets: {', '.join(presets) or 'none'} "
                              "(or give a path to a .yaml file)")
        path = presets[name_or_path]
    data = read_yaml_mapping(path, PresetError, _TOP_KEYS)
    settings = data.get("settings")
    if not isinstance(settings, dict) or not settings:
        raise PresetError(f"{path}: settings: required: a non-empty mapping of RunConfig fields")
    for key in settings:
        if key not in RunConfig.model_fields:
            raise PresetError(f"{path}: settings.{key}: unknown setting; allowed: "
                              f"{', '.join(sorted(RunConfig.model_fields))}")
    try:
        RunConfig.build(dict(settings), f"{path}: settings")
    except ConfigError as exc:
        raise PresetError(str(exc)) from None
    return Preset(name=str(data.get("name") or path.stem), path=path, description=str(data.get("description", "")),
                  settings=dict(settings), measured=str(data.get("measured", "")))
