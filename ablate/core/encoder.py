"""The encoder f: an MLP with leaky ReLU (slope 0.01) and an L2-normalised output."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ablate.config import REFERENCE_WIDTHS

__all__ = ["Encoder"]


class Encoder(nn.Module):
    """MLP ``d_in → width_1 d → … → d_out`` with leaky ReLU (0.01) and unit-norm output.

    Args:
        d_in: observation dimension.
        d_out: latent dimension.
        width_multipliers: hidden widths as multiples of ``d_out`` (the reference by default).
        normalize: L2-normalise the output onto the unit sphere.
        slope: negative slope of the leaky ReLU.

    Shape:
        forward: ``(n, d_in) -> (n, d_out)``.
    """

    def __init__(
        self,
        d_in: int,
        d_out: int,
        width_multipliers: Sequence[int] = REFERENCE_WIDTHS,
        *,
        normalize: bool = True,
        slope: float = 0.01,
    ):
        super().__init__()
        widths = [d_in, *(int(m) * d_out for m in width_multipliers), d_out]
        layers: list[nn.Module] = []
        for i in range(len(widths) - 1):
            layers.append(nn.Linear(widths[i], widths[i + 1]))
            if i < len(widths) - 2:
                layers.append(nn.LeakyReLU(slope))
        self.net = nn.Sequential(*layers)
        self.normalize = normalize

    def forward(self, x: Tensor) -> Tensor:
        h = self.net(x)
        return nn.functional.normalize(h, dim=-1) if self.normalize else h

    def matmul_flops(self, n_rows: int) -> int:
        """FLOPs of the linear layers' forward pass over ``n_rows`` inputs (2 per multiply-add)."""
        return sum(2 * n_rows * m.in_features * m.out_features for m in self.net if isinstance(m, nn.Linear))


def init_encoder_(encoder: Encoder, generator: torch.Generator) -> None:
    """Re-initialise the encoder's linear layers like torch's default, but from an explicit generator."""
    with torch.no_grad():
        for m in encoder.net:
            if isinstance(m, nn.Linear):
                bound = 1.0 / m.in_features**0.5
                m.weight.copy_(torch.rand(m.weight.shape, generator=generator) * 2 * bound - bound)
                m.bias.copy_(torch.rand(m.bias.shape, generator=generator) * 2 * bound - bound)
