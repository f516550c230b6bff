"""The interface every contrastive loss of ablate implements, and helpers the loss families share.

Batch layout: ``h1`` and ``h2`` are the encodings of the two views of ``B`` samples.
All ``2B`` encodings are anchors; the positive of ``h1[i]`` is ``h2[i]`` and vice versa; the
negatives of an anchor are the other ``2B - 2`` encodings. The loss is the cross-entropy of picking
the positive, averaged over the ``2B`` anchors.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["ContrastiveLoss", "check_views", "mask_diagonal", "use_fused"]


class ContrastiveLoss(nn.Module):
    """A contrastive loss. Each loss keeps its own ``forward`` (its natural arguments); :meth:`batch_loss` is the
    one call the training loop makes for every loss.

    Shape:
        pairs: ``k`` pairs ``(h1, h2)`` of ``(B, d)`` encodings, one pair per DGP (``k = 1`` except ensembles);
        negatives: ``(B, M, d)`` hard-negative encodings of the first pair's anchors, or None. Returns a scalar.
    """

    def batch_loss(self, pairs: list[tuple[Tensor, Tensor]], negatives: Tensor | None = None) -> Tensor:
        """The loss of one batch: by default ``forward`` on the first pair (losses with more inputs override)."""
        h1, h2 = pairs[0]
        return self(h1, h2)

    @property
    def lambda_hat(self) -> Tensor | None:
        """The learned (or fixed) concentration the loss holds, or None (InfoNCE)."""
        return None


def mask_diagonal(logits: Tensor) -> Tensor:
    """``logits`` with its diagonal (an anchor against itself) set to ``-inf``."""
    eye = torch.eye(logits.shape[0], dtype=torch.bool, device=logits.device)
    return logits.masked_fill(eye, float("-inf"))


#: On a GPU the plain loss (one (2B)² logits matrix and autograd) is used up to this many logits (1 GiB in fp32).
GPU_PLAIN_MAX_LOGITS = 1 << 28


def use_fused(*tensors: Tensor) -> bool:
    """Use the row-blocked loss with its fused gradient (ablate.core.losses.pair) when a gradient is wanted on the
    CPU, where it saves memory traffic; without a gradient (evaluation) the plain forward pass is cheaper. On a GPU
    the row blocks (2¹⁸ logits each, launched from Python) make the step host-bound (400 ms per step at B = 8192 on
    an H200, docs/performance.md), so the plain loss is used there unless its logits would exceed
    :data:`GPU_PLAIN_MAX_LOGITS`."""
    h = tensors[0]
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors) and h.shape[0] >= 4):
        return False
    return h.device.type == "cpu" or h.shape[0] ** 2 > GPU_PLAIN_MAX_LOGITS


def check_views(h1: Tensor, h2: Tensor) -> None:
    """Both views must be `(B, d)` tensors of the same shape."""
    if h1.shape != h2.shape or h1.ndim != 2:
        raise ValueError(f"views must both be (B, d), got {tuple(h1.shape)} and {tuple(h2.shape)}")
