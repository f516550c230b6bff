"""Contrastive losses, one module per family, behind one interface and a registry.

- :mod:`.base`: :class:`ContrastiveLoss` (``batch_loss(pairs, negatives)``, ``lambda_hat``);
- :mod:`.infonce`: InfoNCE; :mod:`.aninfonce`: AnInfoNCE, its hard-negative and ensemble forms; :mod:`.tricl`: TriCL;
- :mod:`.pair`: the row-blocked cross-entropy with a fused gradient the training step uses;
- :mod:`.registry`: ``RunConfig.loss`` name → loss and its floor.

Similarities (keep the ½): AnInfoNCE ``s(a, b) = −½ (a − b)ᵀ Λ̂ (a − b)``; InfoNCE ``s(a, b) = aᵀb / τ``.
"""

from ablate.core.losses.aninfonce import AnInfoNCE, EnsembleAnInfoNCE, HardNegativeAnInfoNCE, aninfonce_logits
from ablate.core.losses.base import ContrastiveLoss
from ablate.core.losses.infonce import InfoNCE
from ablate.core.losses.pair import pair_targets
from ablate.core.losses.registry import LOSSES, LossKind, build_loss, floor_loss
from ablate.core.losses.tricl import TriCL

__all__ = [
    "LOSSES",
    "AnInfoNCE",
    "ContrastiveLoss",
    "EnsembleAnInfoNCE",
    "HardNegativeAnInfoNCE",
    "InfoNCE",
    "LossKind",
    "TriCL",
    "aninfonce_logits",
    "build_loss",
    "floor_loss",
    "pair_targets",
]
