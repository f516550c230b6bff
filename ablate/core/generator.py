"""The fixed generator g: an invertible leaky-ReLU MLP with controlled condition numbers.

Follows the public reference entry scripts (``main_mlp.py`` of brendel-group/cl-ica and
brendel-group/AnInfoNCE, after Hyvärinen's PCL): every layer is a square ``d x d`` linear map without
bias, drawn uniform(-1, 1) and L2-normalised per column, and redrawn until its condition number is at most
a threshold. The threshold is an order statistic of the condition numbers of a pool of ``n_cond_samples``
random draws: entry ``int(n_cond_samples * cond_quantile)`` of the sorted pool. **The papers call it with
``cond_quantile = 0`` and a 25 000-draw pool**, i.e. every layer must beat the pool's *minimum* (≈ 3.6 at
d = 10); the helper's own defaults (0.25, 10 000) give layers up to ≈ 16 at d = 10, a far harder g.
Leaky ReLU (slope 0.2) sits between layers. g is built from its own seed and frozen, so every trial of a
grid can share it; :func:`build_generator` memoises the weights per process.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor, nn

__all__ = [
    "PAPER_COND_QUANTILE",
    "PAPER_COND_SAMPLES",
    "GeneratorInfo",
    "InvertibleMLP",
    "build_generator",
    "condition_numbers",
    "condition_threshold",
]

GENERATOR_SLOPE = 0.2
#: The papers' construction (both reference ``main_mlp.py``: ``cond_thresh_ratio=0.0, n_iter_cond_thresh=25000``).
PAPER_COND_QUANTILE = 0.0
PAPER_COND_SAMPLES = 25_000
#: Candidate matrices drawn and tested per batch while building the pool and searching for a layer.
_BATCH = 2048


@dataclass(frozen=True)
class GeneratorInfo:
    """How hard g is to invert: the threshold each layer had to beat, each layer's condition number, how many
    candidate matrices the layers took, and how many threshold pools were drawn (see :func:`build_generator`)."""

    threshold: float
    layer_conditions: tuple[float, ...]
    draws: int
    pools: int = 1


def _draw_matrices(count: int, d: int, generator: torch.Generator) -> Tensor:
    w = torch.rand(count, d, d, generator=generator, dtype=torch.float64) * 2.0 - 1.0
    return w / w.norm(dim=1, keepdim=True)  # column-normalised


def condition_numbers(w: Tensor) -> Tensor:
    """2-norm condition numbers of a batch of square matrices, √(λ_max/λ_min) of WᵀW in float64 (equal to
    ``torch.linalg.cond`` to ~1e-12 relative here, and ≈ 1.7× faster at d = 60). Shape: ``(n, d, d) -> (n,)``."""
    w = w.to(torch.float64)
    eig = torch.linalg.eigvalsh(w.mT @ w)
    return (eig[..., -1] / eig[..., 0]).sqrt()


def condition_threshold(d: int, *, n_samples: int, quantile: float, generator: torch.Generator) -> float:
    """Entry ``int(n_samples * quantile)`` of the sorted condition numbers of ``n_samples`` random
    column-normalised matrices (``quantile = 0``: the pool's minimum, as in the papers)."""
    if not 0.0 <= quantile < 1.0:
        raise ValueError(f"cond_quantile must be in [0, 1), got {quantile}")
    conds = torch.cat(
        [
            condition_numbers(_draw_matrices(min(_BATCH, n_samples - i), d, generator))
            for i in range(0, n_samples, _BATCH)
        ]
    )
    return float(conds.sort().values[int(n_samples * quantile)])


def _find_layer(d: int, threshold: float, generator: torch.Generator, max_draws: int) -> tuple[Tensor, int] | None:
    """The first draw with condition number <= threshold (the reference's redraw loop, batched), with the
    number of draws it took; None after ``max_draws`` draws."""
    draws = 0
    while draws < max_draws:
        cand = _draw_matrices(_BATCH, d, generator)
        good = (condition_numbers(cand) <= threshold).nonzero()
        if good.numel():
            i = int(good[0, 0])
            return cand[i], draws + i + 1
        draws += _BATCH
    return None


class InvertibleMLP(nn.Module):
    """x = g(z): square linear layers with leaky ReLU (slope 0.2) between them; no gradients.

    Attributes:
        info: the :class:`GeneratorInfo` of the construction (threshold, per-layer condition numbers).

    Shape:
        forward: ``(n, d) -> (n, d)``; inverse: ``(n, d) -> (n, d)``.
    """

    def __init__(self, weights: list[Tensor], info: GeneratorInfo | None = None):
        super().__init__()
        self.layers = nn.ModuleList()
        for w in weights:
            layer = nn.Linear(w.shape[0], w.shape[0], bias=False)
            layer.weight.data.copy_(w.to(layer.weight.dtype))
            layer.weight.requires_grad_(False)
            self.layers.append(layer)
        if info is None:
            conds = tuple(float(c) for c in condition_numbers(torch.stack([w.double() for w in weights])))
            info = GeneratorInfo(threshold=float("nan"), layer_conditions=conds, draws=0)
        self.info = info

    def forward(self, z: Tensor) -> Tensor:
        x = z
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = nn.functional.leaky_relu(x, GENERATOR_SLOPE)
        return x

    @torch.no_grad()
    def inverse(self, x: Tensor) -> Tensor:
        """Invert g numerically (solve each layer, undo each leaky ReLU)."""
        z = x.to(torch.float64)
        for i in reversed(range(len(self.layers))):
            if i < len(self.layers) - 1:
                z = torch.where(z >= 0, z, z / GENERATOR_SLOPE)
            w = self.layers[i].weight.to(torch.float64)
            z = torch.linalg.solve(w, z.T).T
        return z.to(x.dtype)


@functools.lru_cache(maxsize=32)
def _generator_weights(
    d: int, n_layers: int, seed: int, cond_quantile: float, n_cond_samples: int, redraw_factor: int
) -> tuple[tuple[Tensor, ...], GeneratorInfo]:
    gen = torch.Generator().manual_seed(int(seed))
    pools = 0
    while True:
        pools += 1
        threshold = condition_threshold(d, n_samples=n_cond_samples, quantile=cond_quantile, generator=gen)
        weights, draws = [], 0
        for _ in range(n_layers):
            found = _find_layer(d, threshold, gen, redraw_factor * n_cond_samples)
            if found is None:
                break  # an extreme pool minimum: draw a new pool and start g again (same random stream)
            weights.append(found[0])
            draws += found[1]
        else:
            conds = tuple(float(c) for c in condition_numbers(torch.stack(weights)))
            info = GeneratorInfo(threshold=threshold, layer_conditions=conds, draws=draws, pools=pools)
            return tuple(weights), info


def build_generator(
    d: int,
    *,
    n_layers: int = 3,
    seed: int = 0,
    cond_quantile: float = PAPER_COND_QUANTILE,
    n_cond_samples: int = PAPER_COND_SAMPLES,
    redraw_factor: int = 20,
) -> InvertibleMLP:
    """Build g from its own seed: ``n_layers`` square layers, each redrawn until its condition number is at
    most the pool's threshold (defaults: the papers' construction, the minimum of 25 000 draws).

    With ``cond_quantile = 0`` the number of redraws a layer needs is heavy-tailed (the chance that it needs
    more than k draws is about n/(n + k) for a pool of n), and the reference's loop can run for hours when its
    pool's minimum happens to be extreme. Here a layer that needs more than ``redraw_factor × n_cond_samples``
    draws (chance ≈ 1/21 per layer) makes g start over with a fresh pool from the same random stream, so the
    build stays deterministic and bounded; ``g.info.pools`` counts the pools used.

    The weights are memoised per process for each (d, n_layers, seed, cond_quantile, n_cond_samples), so
    the trials of a grid that share g build it once. Returns a fresh frozen :class:`InvertibleMLP` on the CPU
    in float32 (move it with ``.to``); ``g.info`` holds the threshold and the layers' condition numbers.
    """
    if d < 2:
        raise ValueError(f"latent_dim must be >= 2, got {d}")
    if n_layers < 1:
        raise ValueError(f"n_layers must be >= 1, got {n_layers}")
    if redraw_factor < 1:
        raise ValueError(f"redraw_factor must be >= 1, got {redraw_factor}")
    weights, info = _generator_weights(
        int(d), int(n_layers), int(seed), float(cond_quantile), int(n_cond_samples), int(redraw_factor)
    )
    g = InvertibleMLP(list(weights), info)
    g.requires_grad_(False)
    return g.eval()
