"""The names of the reported metrics that carry a number in their name: built here, and parsed here.

One evaluation (:meth:`ablate.core.experiment.Experiment.evaluate`) reports, next to ``r2``:

- ``r2_lambda_<Λ>``: the R² of the block of dimensions whose true concentration is Λ (``r2_lambda_25``);
- ``r2_dim_<i>``: the R² of latent dimension i;
- ``lambda_hat_<i>``: the learned concentration Λ̂ of dimension i, or ``lambda_hat_<k>_<i>`` for member k of
  an ensemble loss (one Λ̂ per DGP).

Everything downstream (the tidy table, the report's panels, the claims, ``ablate train``'s lines) finds these
columns through the parsers below, so the spelling lives in this module only. It is a top-level module, so the
maths (``ablate.core``) may import it; it imports nothing of ablate.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = [
    "lambda_hat_column",
    "lambda_hat_columns",
    "parse_lambda_hat",
    "r2_block_column",
    "r2_block_lambda",
    "r2_dim_column",
    "r2_dim_index",
]

_R2_BLOCK = "r2_lambda_"
_R2_DIM = re.compile(r"^r2_dim_(\d+)$")
_LAMBDA_HAT = re.compile(r"^lambda_hat_(?:(\d+)_)?(\d+)$")


def r2_block_column(lam: float) -> str:
    """The column of the R² of the block with true concentration ``lam``: 25 → ``r2_lambda_25``, 2.5 →
    ``r2_lambda_2.5`` (the shortest text of the number, ``:g``)."""
    return f"{_R2_BLOCK}{float(lam):g}"


def r2_block_lambda(name: str) -> float | None:
    """The Λ of a per-block R² column (``r2_lambda_25`` → 25.0); None when ``name`` is not one."""
    if not name.startswith(_R2_BLOCK):
        return None
    try:
        return float(name.removeprefix(_R2_BLOCK))
    except ValueError:
        return None


def r2_dim_column(i: int) -> str:
    """The column of the R² of latent dimension ``i``: ``r2_dim_<i>``."""
    return f"r2_dim_{i}"


def r2_dim_index(name: str) -> int | None:
    """The dimension of a per-dimension R² column (``r2_dim_3`` → 3); None when ``name`` is not one."""
    m = _R2_DIM.match(name)
    return int(m.group(1)) if m else None


def lambda_hat_column(i: int, member: int | None = None) -> str:
    """The column of the learned Λ̂ of dimension ``i``: ``lambda_hat_<i>``, or ``lambda_hat_<member>_<i>`` for
    one member of an ensemble loss."""
    return f"lambda_hat_{i}" if member is None else f"lambda_hat_{member}_{i}"


def parse_lambda_hat(name: str) -> tuple[int | None, int] | None:
    """``(member, dim)`` of a Λ̂ column: ``lambda_hat_3`` → (None, 3), ``lambda_hat_1_3`` → (1, 3); None for
    any other name (``lambda_hat_sorted`` too)."""
    m = _LAMBDA_HAT.match(name)
    if not m:
        return None
    member, dim = m.groups()
    return (int(member) if member is not None else None, int(dim))


def lambda_hat_columns(columns: Iterable[str], member: int | None = None) -> list[str]:
    """The Λ̂ columns among ``columns`` that belong to ``member`` (None: the one Λ̂ of a loss that is not an
    ensemble), in the order given."""
    return [c for c in columns if (parsed := parse_lambda_hat(c)) is not None and parsed[0] == member]
