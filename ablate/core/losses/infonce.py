"""InfoNCE: ``s(a, b) = aᵀb / τ`` (Zimmermann et al. 2021), on one of two batch layouts.

- ``symmetric`` (ablate's default): all 2B encodings are anchors, each with 2B − 2 negatives.
- ``reference``: the layout of the public cl-ica code (``SimCLRLoss`` in ``losses.py``, called from
  ``main_mlp.py`` with ``z3 = roll(z1, 1)``): the B encodings of view 1 are the anchors; the negatives of anchor i
  are all B encodings of view 1 (rolled, which does not change the set), **including anchor i itself**
  (similarity 1/τ); the positive is appended; the loss is the cross-entropy of picking it, averaged over B.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from ablate.core.losses.base import ContrastiveLoss, check_views, use_fused
from ablate.core.losses.pair import pair_cross_entropy, pair_targets

__all__ = ["LAYOUTS", "InfoNCE", "infonce_loss", "reference_layout_loss"]

#: Batch layouts of InfoNCE (``RunConfig.infonce_layout``).
LAYOUTS = ("symmetric", "reference")


def reference_layout_loss(h1: Tensor, h2: Tensor, tau: float) -> Tensor:
    """cl-ica's one-directional InfoNCE: anchors ``h1``; logits of anchor i are ``h1ᵢ·h1ₖ/τ`` for every k (the self
    pair included) and ``h1ᵢ·h2ᵢ/τ`` (the positive, last); mean cross-entropy of picking the positive.

    Shape:
        h1, h2: ``(B, d)``; returns a scalar.
    """
    logits = torch.cat([h1 @ h1.T, (h1 * h2).sum(-1, keepdim=True)], dim=1) / tau
    target = torch.full((h1.shape[0],), h1.shape[0], dtype=torch.long, device=h1.device)
    return F.cross_entropy(logits, target)


def infonce_loss(h1: Tensor, h2: Tensor, tau: float, layout: str = "symmetric") -> Tensor:
    """InfoNCE of one batch with temperature ``tau`` on one of :data:`LAYOUTS`.

    Shape:
        h1, h2: ``(B, d)``; returns a scalar.
    """
    if layout == "reference":
        return reference_layout_loss(h1, h2, tau)
    h = torch.cat([h1, h2])
    if use_fused(h):
        return pair_cross_entropy(h, h.new_full((h.shape[1],), 1.0 / tau), 0.0)
    logits = torch.mm(h / tau, h.T).fill_diagonal_(float("-inf"))
    return F.cross_entropy(logits, pair_targets(h1.shape[0], h1.device))


class InfoNCE(ContrastiveLoss):
    """InfoNCE with ``s(a, b) = aᵀb / τ`` on the 2B-anchor batch layout.

    Shape:
        h1, h2: ``(B, d)``; returns a scalar.
    """

    def __init__(self, tau: float = 1.0, layout: str = "symmetric"):
        super().__init__()
        if tau <= 0:
            raise ValueError(f"tau must be > 0, got {tau}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        self.tau = float(tau)
        self.layout = layout

    def forward(self, h1: Tensor, h2: Tensor) -> Tensor:
        check_views(h1, h2)
        return infonce_loss(h1, h2, self.tau, self.layout)
