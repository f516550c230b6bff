"""A run's checks before Ray starts, made once: the grid resolved with its options
(:func:`ablate.service.specs.resolve.resolve_grid`), its pack size (:mod:`.packs`), its plugins and sampler
(:mod:`.probes`) and its memory (:mod:`.memory`). :func:`check_run` returns a :class:`CheckedRun`, which
:func:`ablate.service.execution.runner.run_grid` runs without checking it again; `ablate run` checks every grid it
is given before the first starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ablate.service.execution.memory import check_memory
from ablate.service.execution.options import RunOptions, build_options
from ablate.service.execution.packs import resolve_pack
from ablate.service.execution.probes import probe_acceptance, probe_plugins
from ablate.service.specs.grids import Grid
from ablate.service.specs.resolve import resolve_grid

__all__ = ["CheckedRun", "check_run", "prepare_run"]


@dataclass(frozen=True)
class CheckedRun:
    """A grid resolved with its options and checked to run on this machine: what :func:`run_grid` runs."""

    grid: Grid  # resolved: its scale, preset, --set and --variants are those of ``options``
    options: RunOptions
    pack: int  # grid points per Ray trial (``options.pack`` decided: ``auto`` is a number here)
    num_cpus: int | None = None  # the CPUs an embedded Ray gets (None: the machine's)


def check_run(grid: Grid, options: RunOptions, *, num_cpus: int | None = None) -> CheckedRun:
    """Check a grid that :func:`resolve_grid` resolved with ``options`` before anything starts: its pack size (a
    pack only on a grid search), its plugins, its rejection sampler's acceptance, and whether its trials fit this
    machine's memory. The first problem is a one-line error."""
    cpus, gpus = options.cpus_per_trial, options.gpus_per_trial or 0.0
    pack = resolve_pack(options.pack, grid, gpus)
    probe_plugins(grid)
    probe_acceptance(grid)
    check_memory(grid, cpus, gpus, options.max_concurrent, address=options.address, num_cpus=num_cpus, pack=pack)
    return CheckedRun(grid, options, pack, num_cpus)


def prepare_run(
    grid: str | os.PathLike[str] | Grid,
    options: RunOptions | None = None,
    *,
    num_cpus: int | None = None,
    note: Callable[[str], None] | None = None,
    **fields: Any,
) -> CheckedRun:
    """Resolve ``grid`` with ``options`` (``fields`` set over them) and check it (:func:`check_run`). A
    :class:`Grid` keeps the scale it was loaded at unless the options name one."""
    opts = build_options(options, **fields)
    if isinstance(grid, Grid) and "scale" not in opts.model_fields_set:
        opts = build_options(opts, scale=grid.scale)
    return check_run(resolve_grid(grid, opts, note=note), opts, num_cpus=num_cpus)
