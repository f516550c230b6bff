"""How many grid points a Ray trial trains as one pack (``ablate run --pack K|auto``).

Packs pay where a single trial leaves its device waiting on the host: a GPU, whose single-trial step uses a small
share of the card's matmul rate (docs/performance.md, "GPU check", has the measured rates of packs, fractions and
single trials). On the CPU they help only tiny steps, so ``auto`` means no packing there.
"""

from __future__ import annotations

from ablate.config import ConfigError
from ablate.service.records.rundir import RunError
from ablate.service.specs.grids import Grid

__all__ = ["AUTO_MAX", "resolve_pack"]

#: The largest pack ``auto`` chooses (the measured gain flattens past 32 members).
AUTO_MAX = 32
#: The share of the trial's GPU memory ``auto`` fills.
_GPU_SHARE = 0.8


def resolve_pack(value: str | int | None, grid: Grid, gpus_per_trial: float) -> int:
    """The pack size for ``--pack``: an integer ≥ 1 (more than 1 only for a grid search: a search runs one setting
    per trial), or ``auto``: 1 on the CPU; on a GPU the largest group of points that share a shape, capped by
    :data:`AUTO_MAX` and by what fits in the trial's share of the card."""
    if value is None:
        return 1
    if str(value) != "auto":
        try:
            size = int(value)
        except ValueError:
            raise ConfigError(f"--pack {value!r}: expected a whole number of grid points per trial, or auto") from None
        if size < 1:
            raise ConfigError(f"--pack {size}: expected at least 1 grid point per trial")
        if size > 1 and grid.search != "grid":
            raise RunError(f"--pack {size}: {grid.name} is an Optuna search; a search runs one setting per trial")
        return size
    if grid.search != "grid" or gpus_per_trial <= 0:
        return 1
    import torch

    if not torch.cuda.is_available():
        return 1
    from ablate.core.pack_fields import pack_groups

    configs = [t.config for t in grid.trials]
    largest = max(len(g) for g in pack_groups(configs))
    total = torch.cuda.get_device_properties(0).total_memory * min(gpus_per_trial, 1.0) * _GPU_SHARE
    from ablate.service.specs.costs import peak_memory

    fits = max(1, int(total // max(peak_memory(c, gpu=True).device for c in configs)))
    return max(1, min(AUTO_MAX, largest, fits))
