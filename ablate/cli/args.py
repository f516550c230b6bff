"""Arguments that `ablate run` and `ablate slurm` share: which grid points to run, at which scale, under which name."""

from __future__ import annotations

import argparse

from ablate.service.specs import DEFAULT_SCALE, SCALES

__all__ = ["add_grid_selection"]


def add_grid_selection(parser: argparse.ArgumentParser) -> None:
    """Add --scale, --name, --set, --variants and --preset to ``parser``."""
    parser.add_argument("--scale", default=DEFAULT_SCALE, choices=SCALES)
    parser.add_argument("--name", help="run name (default: <grid>-<scale>, or <grid>-<scale>-<preset>)")
    parser.add_argument("--set", nargs="*", metavar="KEY=VALUE", help="override a setting for every trial")
    parser.add_argument("--variants", metavar="NAME[,NAME]", help="run only these of the grid's variants")
    parser.add_argument(
        "--preset", help="train every trial with a named preset, e.g. fast; the grid's axes and --set win"
    )
