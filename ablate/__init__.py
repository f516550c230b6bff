"""ablate: Ray Tune service for identifiability ablations of contrastive learning (InfoNCE, AnInfoNCE).

The public API is importable from the top, and loaded only when first used, so ``import ablate`` stays cheap
and ``ablate.Experiment`` (pure torch) never imports Ray, Optuna or Plotly:

- ``ablate.RunConfig``: one run's settings (ablate.config; not Ray's ``tune.RunConfig``);
- ``ablate.Experiment``: one run without Ray (ablate.core.experiment);
- ``ablate.dgp``, ``ablate.losses``, ``ablate.metrics``: the maths (ablate.core);
- ``ablate.load_grid``: a grid YAML at one scale (ablate.service.specs.grids);
- ``ablate.run_grid``: run a grid through Ray Tune (ablate.service.execution.runner; imports Ray when called).

Layers (imports run one way): cli → reports → analysis → service → core → config / rundir / shipped / ray_compat.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: Public name → (module, attribute or None for the module itself).
_LAZY = {
    "RunConfig": ("ablate.config", "RunConfig"),
    "ConfigError": ("ablate.config", "ConfigError"),
    "Experiment": ("ablate.core.experiment", "Experiment"),
    "dgp": ("ablate.core.dgp", None),
    "losses": ("ablate.losses", None),
    "metrics": ("ablate.core.metrics", None),
    "load_grid": ("ablate.service.specs.grids", "load_grid"),
    "run_grid": ("ablate.service.execution.runner", "run_grid"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    """Import a public name on first use (PEP 562)."""
    if name not in _LAZY:
        raise AttributeError(f"module 'ablate' has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = importlib.import_module(module)
    if attr is not None:
        value = getattr(value, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
