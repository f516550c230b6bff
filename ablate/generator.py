"""The fixed generator g: an invertible leaky-ReLU MLP with controlled condition numbers.

Follows the public reference (Zimmermann et al. 2021, after Hyvärinen's PCL): every layer is a
square ``d x d`` linear map without bias, drawn uniform(-1, 1) and L2-normalised per column, and
redrawn until its condition number is below a threshold: the ``cond_quantile`` quantile of the
condition numbers of ``n_cond_samples`` random draws. Leaky ReLU (slope 0.2) sits between layers.
g is built from its own seed and frozen, so every trial of a grid can share it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["InvertibleMLP", "build_generator", "condition_threshold"]

GENERATOR_SLOPE = 0.2


def _draw_matrices(count: int, d: int, generator: torch.Generator) -> Tensor:
    w = torch.rand(count, d, d, generator=generator, dtype=torch.float64) * 2.0 - 1.0
    return w / w.norm(dim=1, keepdim=True)  # column-normalised


def condition_threshold(d: int, *, n_samples: int, quantile: float, generator: torch.Generator) -> float:
    """The ``quantile`` of the condition numbers of ``n_samples`` random column-normalised matrices."""
    conds = torch.linalg.cond(_draw_matrices(n_samples, d, generator))
    return float(torch.quantile(conds, quantile))


class InvertibleMLP(nn.Module):
    """x = g(z): square linear layers with leaky ReLU (slope 0.2) between them; no gradients.

    Shape:
        forward: ``(n, d) -> (n, d)``; inverse: ``(n, d) -> (n, d)``.
    """

    def __init__(self, weights: list[Tensor]):
        super().__init__()
        self.layers = nn.ModuleList()
        for w in weights:
            layer = nn.Linear(w.shape[0], w.shape[0], bias=False)
            layer.weight.data.copy_(w.to(layer.weight.dtype))
            layer.weight.requires_grad_(False)
            self.layers.append(layer)

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


def build_generator(
    d: int,
    *,
    n_layers: int = 3,
    seed: int = 0,
    cond_quantile: float = 0.25,
    n_cond_samples: int = 10_000,
    max_redraws: int = 100_000,
) -> InvertibleMLP:
    """Build g from its own seed: ``n_layers`` square layers, each redrawn until well conditioned.

    Returns a frozen :class:`InvertibleMLP` on the CPU in float32 (move it with ``.to``).
    """
    if d < 2:
        raise ValueError(f"latent_dim must be >= 2, got {d}")
    if n_layers < 1:
        raise ValueError(f"n_layers must be >= 1, got {n_layers}")
    gen = torch.Generator().manual_seed(int(seed))
    threshold = condition_threshold(d, n_samples=n_cond_samples, quantile=cond_quantile, generator=gen)
    weights: list[Tensor] = []
    batch = 64
    for _ in range(n_layers):
        for _ in range(0, max_redraws, batch):
            cand = _draw_matrices(batch, d, gen)
            good = (torch.linalg.cond(cand) < threshold).nonzero()
            if good.numel():
                weights.append(cand[int(good[0, 0])])
                break
        else:  # pragma: no cover - a quantile threshold accepts a fixed fraction of draws
            raise RuntimeError(f"no weight matrix below condition number {threshold:.3g} in {max_redraws} draws")
    g = InvertibleMLP(weights)
    g.requires_grad_(False)
    return g.eval()
