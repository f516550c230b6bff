"""InfoNCE: ``s(a, b) = aᵀb / τ`` on the 2B-anchor batch layout (Zimmermann et al. 2021)."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from ablate.core.losses.base import ContrastiveLoss, check_views, use_fused
from ablate.core.losses.pair import pair_cross_entropy, pair_targets

__all__ = ["InfoNCE"]


class InfoNCE(ContrastiveLoss):
    """InfoNCE with ``s(a, b) = aᵀb / τ`` on the 2B-anchor batch layout.

    Shape:
        h1, h2: ``(B, d)``; returns a scalar.
    """

    def __init__(self, tau: float = 1.0):
        super().__init__()
        if tau <= 0:
            raise ValueError(f"tau must be > 0, got {tau}")
        self.tau = float(tau)

    def forward(self, h1: Tensor, h2: Tensor) -> Tensor:
        check_views(h1, h2)
        h = torch.cat([h1, h2])
        if use_fused(h):
            return pair_cross_entropy(h, h.new_full((h.shape[1],), 1.0 / self.tau), 0.0)
        logits = torch.mm(h / self.tau, h.T).fill_diagonal_(float("-inf"))
        return F.cross_entropy(logits, pair_targets(h1.shape[0], h1.device))
