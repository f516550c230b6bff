"""TriCL (Zhang, Wang & Wang, NeurIPS 2023), for Rusak et al.'s Appx. H.4 comparison."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ablate.core.losses.base import ContrastiveLoss, check_views

__all__ = ["TriCL"]


class TriCL(ContrastiveLoss):
    """Tri-factor contrastive loss (Zhang, Wang & Wang, NeurIPS 2023), as the paper defines it.

    ``L = −2 E[f(x)ᵀ S f(x⁺)] + E[(f(x)ᵀ S f(x⁻))²] + γ ‖C − tr(C)/d · I‖²_F`` with ``S = diag(softplus(θ))``
    learnable and ``C = E[f(x) f(x)ᵀ]``. Here S weights *every* term, following the paper's
    definition; Rusak et al. (Appx. H.4) note the public code applies S to only half of them. The
    decorrelation target is isotropic at the encodings' own scale, so unit-norm outputs can reach it.
    Negatives are all pairs of distinct samples in the two views.

    Shape:
        h1, h2: ``(B, d)``; returns a scalar.
    """

    def __init__(self, dim: int, *, decorrelation: float = 1.0, init_std: float = 0.1, generator=None):
        super().__init__()
        self.theta = nn.Parameter(torch.randn(int(dim), generator=generator) * init_std)
        self.decorrelation = float(decorrelation)

    @property
    def lambda_hat(self) -> Tensor:
        """The diagonal importance S, shape ``(d,)``."""
        return F.softplus(self.theta)

    def forward(self, h1: Tensor, h2: Tensor) -> Tensor:
        check_views(h1, h2)
        b, d = h1.shape
        s = self.lambda_hat.to(h1.dtype)
        pos = (h1 * s * h2).sum(-1).mean()
        cross = (h1 * s) @ h2.T  # (B, B); off-diagonal entries are negative pairs
        sq = cross**2
        neg = (sq.sum() - sq.diagonal().sum()) / (b * (b - 1))
        h = torch.cat([h1, h2])
        cov = h.T @ h / h.shape[0]
        target = torch.eye(d, dtype=h.dtype, device=h.device) * cov.diagonal().mean()
        return -2.0 * pos + neg + self.decorrelation * ((cov - target) ** 2).sum()
