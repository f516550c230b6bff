"""Alignment and uniformity on the hypersphere (Wang & Isola, "Understanding Contrastive Representation Learning
through Alignment and Uniformity on the Hypersphere", ICML 2020, arXiv:2005.10242), as an ablate loss plugin.

    L = align_weight · E‖f(x) − f(x⁺)‖^alpha + uniform_weight · (U(h1) + U(h2)) / 2,
    U(h) = log E_{i≠j} exp(−t ‖h_i − h_j‖²)

over the B positive pairs of a batch (their paper's defaults: alpha = 2, t = 2, both weights 1). Unlike InfoNCE it
has no temperature and no softmax over negatives: uniformity is a Gaussian-potential energy over all pairs of one
view. A grid passes options as ``loss_options: {t: 2, alpha: 2, align_weight: 1, uniform_weight: 1}``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ablate.losses import ContrastiveLoss

__all__ = ["AlignUniform", "build"]


class AlignUniform(ContrastiveLoss):
    """Wang & Isola's alignment + uniformity loss on ``(B, d)`` encodings of two views (no learned parameters)."""

    def __init__(self, t: float = 2.0, alpha: float = 2.0, align_weight: float = 1.0, uniform_weight: float = 1.0):
        super().__init__()
        if t <= 0 or alpha <= 0:
            raise ValueError(f"t and alpha must be > 0, got t={t}, alpha={alpha}")
        if align_weight < 0 or uniform_weight < 0:
            raise ValueError(f"the weights must be >= 0, got {align_weight}, {uniform_weight}")
        self.t, self.alpha = float(t), float(alpha)
        self.align_weight, self.uniform_weight = float(align_weight), float(uniform_weight)

    def alignment(self, h1: Tensor, h2: Tensor) -> Tensor:
        """E‖h1_i − h2_i‖^alpha over the positive pairs."""
        return (h1 - h2).norm(dim=1).pow(self.alpha).mean()

    def uniformity(self, h: Tensor) -> Tensor:
        """log E_{i<j} exp(−t ‖h_i − h_j‖²) over distinct pairs of one view."""
        return torch.pdist(h, p=2).pow(2).mul(-self.t).exp().mean().log()

    def forward(self, h1: Tensor, h2: Tensor) -> Tensor:
        if h1.shape != h2.shape or h1.ndim != 2 or h1.shape[0] < 2:
            raise ValueError(f"views must both be (B, d) with B >= 2, got {tuple(h1.shape)} and {tuple(h2.shape)}")
        uniform = (self.uniformity(h1) + self.uniformity(h2)) / 2
        return self.align_weight * self.alignment(h1, h2) + self.uniform_weight * uniform


def build(config, generator: torch.Generator, **options) -> AlignUniform:
    """ablate's factory (entry point ``align_uniform`` in ``ablate.losses``): the loss for a run's config, with
    ``loss_options`` as keyword arguments (t, alpha, align_weight, uniform_weight). No parameters are drawn, so
    ``generator`` is unused. There is no ``floor``: the loss has no true metric to evaluate at."""
    return AlignUniform(**options)
