"""The YAML files shipped inside the package: grids (``search_spaces/``), report specs (``dashboards/``) and
presets (``presets/``).

They are package data: found through :mod:`importlib.resources`, so an installed wheel (a user's ``pip
install``, a Ray cluster's nodes) finds them exactly as a checkout does. The repository's top-level
``search_spaces/``, ``dashboards/`` and ``presets/`` are links to these folders.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["DASHBOARDS", "PRESETS", "SEARCH_SPACES", "shipped_dir", "shipped_files"]

SEARCH_SPACES = "search_spaces"
DASHBOARDS = "dashboards"
PRESETS = "presets"


def shipped_dir(kind: str) -> Path:
    """The folder of shipped files of ``kind`` (``search_spaces``, ``dashboards`` or ``presets``)."""
    if kind not in (SEARCH_SPACES, DASHBOARDS, PRESETS):
        raise ValueError(f"unknown kind of shipped files {kind!r}; allowed: {SEARCH_SPACES}, {DASHBOARDS}, {PRESETS}")
    folder = resources.files("ablate").joinpath(kind)
    if not isinstance(folder, Path):  # e.g. a zip import; ablate is installed as files (a wheel unpacks)
        raise RuntimeError(f"ablate's {kind}/ is not on the file system ({folder!r}); install ablate unzipped")
    return folder


def shipped_files(kind: str) -> dict[str, Path]:
    """Name (file stem) → path of every shipped ``*.yaml`` of ``kind``, sorted by name."""
    return {p.stem: p for p in sorted(shipped_dir(kind).glob("*.yaml"))}
