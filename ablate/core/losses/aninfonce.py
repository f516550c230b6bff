"""AnInfoNCE (Rusak et al. 2024): ``s(a, b) = −½ (a − b)ᵀ Λ̂ (a − b)`` with a trainable diagonal Λ̂ (keep the ½),
and its hard-negative (Cor. B.1) and ensemble (Cor. B.2) forms.

Logits come from one matmul (``‖a‖²_Λ + ‖b‖²_Λ − 2 (aΛ)bᵀ``); the diagonal is masked with ``-inf``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ablate.core.losses.base import ContrastiveLoss, check_views, mask_diagonal, use_fused
from ablate.core.losses.pair import pair_cross_entropy, pair_targets

__all__ = [
    "AnInfoNCE",
    "EnsembleAnInfoNCE",
    "HardNegativeAnInfoNCE",
    "aninfonce_logits",
    "aninfonce_loss",
    "hard_negative_loss",
]


def aninfonce_logits(h: Tensor, lambda_hat: Tensor) -> Tensor:
    """Pairwise ``−½ (a − b)ᵀ diag(λ̂) (a − b)`` for all rows of ``h``, diagonal masked with ``-inf``.

    Shape:
        h: ``(n, d)``; lambda_hat: ``(d,)``; returns ``(n, n)``.
    """
    hw = h * lambda_hat
    sq = (hw * h).sum(-1)
    logits = hw @ h.T - 0.5 * (sq[:, None] + sq[None, :])
    return mask_diagonal(logits)


def _training_logits_aninfonce(h: Tensor, lambda_hat: Tensor) -> Tensor:
    """Logits equal to :func:`aninfonce_logits` up to a constant per row (``−½‖a‖²_Λ̂``).

    Cross-entropy is invariant to a per-row shift, so the loss is the same; this form needs one fused
    ``addmm`` and an in-place diagonal fill instead of three n×n broadcasts and an n×n mask.
    """
    hw = h * lambda_hat
    sq = (hw * h).sum(-1)
    logits = torch.addmm(sq.mul(-0.5).unsqueeze(0), hw, h.T)
    return logits.fill_diagonal_(float("-inf"))


def aninfonce_loss(h1: Tensor, h2: Tensor, lambda_hat: Tensor) -> Tensor:
    """AnInfoNCE of one batch with the metric ``lambda_hat``: all 2B encodings are anchors (see the module doc).

    Shape:
        h1, h2: ``(B, d)``; lambda_hat: ``(d,)``; returns a scalar.
    """
    h = torch.cat([h1, h2])
    if use_fused(h, lambda_hat):
        return pair_cross_entropy(h, lambda_hat, 0.5)
    logits = _training_logits_aninfonce(h, lambda_hat)
    return F.cross_entropy(logits, pair_targets(h1.shape[0], h1.device))


def hard_negative_loss(h1: Tensor, h2: Tensor, h_neg: Tensor, lambda_hat: Tensor, batch_negatives: bool) -> Tensor:
    """AnInfoNCE with hard negatives (:class:`HardNegativeAnInfoNCE`): anchors ``h1``, each picking ``h2[i]`` among
    its own hard negatives ``h_neg[i]`` and, with ``batch_negatives``, the other ``2B − 2`` encodings.

    Shape:
        h1, h2: ``(B, d)``; h_neg: ``(B, M, d)``; lambda_hat: ``(d,)``; returns a scalar.
    """
    b = h1.shape[0]
    pos = -0.5 * ((h1 - h2) ** 2 * lambda_hat).sum(-1, keepdim=True)  # (B, 1)
    hard = -0.5 * ((h1.unsqueeze(1) - h_neg) ** 2 * lambda_hat).sum(-1)  # (B, M)
    parts = [pos, hard]
    if batch_negatives:
        h = torch.cat([h1, h2])
        all_logits = aninfonce_logits(h, lambda_hat)[:b]  # rows: anchors h1[i]
        all_logits = all_logits.scatter(1, (torch.arange(b, device=h1.device) + b)[:, None], float("-inf"))
        parts.append(all_logits)  # own positive masked (it is column 0 already)
    logits = torch.cat(parts, dim=1)
    return F.cross_entropy(logits, torch.zeros(b, dtype=torch.long, device=h1.device))


class AnInfoNCE(ContrastiveLoss):
    """AnInfoNCE with a trainable diagonal metric ``Λ̂ = softplus(θ)``, ``θ₀ ~ N(0, init_std²)``.

    Args:
        dim: latent dimension d.
        fixed: hold Λ̂ at this value (scalar or ``(d,)``) instead of training it.
        init_std: standard deviation of θ's initialisation.
        generator: random generator for θ's initialisation (CPU).

    Shape:
        h1, h2: ``(B, d)``; returns a scalar.
    """

    def __init__(
        self,
        dim: int,
        fixed: Tensor | float | list[float] | None = None,
        *,
        init_std: float = 0.1,
        generator: torch.Generator | None = None,
    ):
        super().__init__()
        self.dim = int(dim)
        if fixed is None:
            self.theta = nn.Parameter(torch.randn(self.dim, generator=generator) * init_std)
            self.register_buffer("fixed_lambda", None)
        else:
            lam = torch.as_tensor(fixed, dtype=torch.float32)
            lam = lam.expand(self.dim).clone() if lam.ndim == 0 else lam.clone()
            if lam.shape != (self.dim,) or not bool((lam > 0).all()):
                raise ValueError(f"fixed Λ̂ must be > 0 with shape ({self.dim},), got {lam.tolist()}")
            self.theta = None
            self.register_buffer("fixed_lambda", lam)

    @property
    def lambda_hat(self) -> Tensor:
        """The current Λ̂ diagonal, shape ``(d,)``."""
        if self.fixed_lambda is not None:
            return self.fixed_lambda
        return F.softplus(self.theta)

    def forward(self, h1: Tensor, h2: Tensor) -> Tensor:
        check_views(h1, h2)
        return aninfonce_loss(h1, h2, self.lambda_hat.to(h1.dtype))


class HardNegativeAnInfoNCE(AnInfoNCE):
    """AnInfoNCE with ``M`` hard negatives per sample (Rusak et al., Cor. B.1).

    The anchors are the ``B`` first-view encodings ``h1`` (the hard negatives were drawn around
    them); each picks its positive ``h2[i]`` among its own hard negatives ``h_neg[i]`` and, with
    ``batch_negatives=True``, the other ``2B − 2`` encodings of the batch. With only hard negatives
    drawn with concentration Λ⁻, the optimum sits at ``Λ̂ = Λ⁺ − Λ⁻``.

    Shape:
        h1, h2: ``(B, d)``; h_neg: ``(B, M, d)``; returns a scalar.
    """

    def __init__(self, dim: int, fixed=None, *, batch_negatives: bool = True, init_std: float = 0.1, generator=None):
        super().__init__(dim, fixed, init_std=init_std, generator=generator)
        self.batch_negatives = bool(batch_negatives)

    def forward(self, h1: Tensor, h2: Tensor, h_neg: Tensor | None = None) -> Tensor:  # type: ignore[override]
        """With ``h_neg`` None (before hard negatives start, Fig. 10B) this is plain AnInfoNCE."""
        if h_neg is None:
            return super().forward(h1, h2)
        check_views(h1, h2)
        b, d = h1.shape
        if h_neg.ndim != 3 or h_neg.shape[0] != b or h_neg.shape[2] != d:
            raise ValueError(f"h_neg must be (B={b}, M, d={d}), got {tuple(h_neg.shape)}")
        return hard_negative_loss(h1, h2, h_neg, self.lambda_hat.to(h1.dtype), self.batch_negatives)

    def batch_loss(self, pairs: list[tuple[Tensor, Tensor]], negatives: Tensor | None = None) -> Tensor:
        """The loss of one batch with its hard negatives (None: plain AnInfoNCE)."""
        h1, h2 = pairs[0]
        return self(h1, h2, negatives)


class EnsembleAnInfoNCE(ContrastiveLoss):
    """Sum of AnInfoNCE losses over ``k`` DGPs that share g, with one Λ̂ⁱ per DGP (Cor. B.2).

    ``fixed`` holds every Λ̂ⁱ at the given values (the loss floor: the true Λⁱ).

    Shape:
        views: a sequence of ``k`` pairs ``(h1, h2)``, each ``(B, d)``; returns a scalar.
    """

    def __init__(
        self,
        dim: int,
        k: int,
        *,
        fixed: list | None = None,
        init_std: float = 0.1,
        generator: torch.Generator | None = None,
    ):
        super().__init__()
        if k < 1:
            raise ValueError(f"an ensemble needs k >= 1 DGPs, got {k}")
        if fixed is not None and len(fixed) != k:
            raise ValueError(f"fixed: one Λ̂ per DGP ({k}), got {len(fixed)}")
        self.members = nn.ModuleList(
            AnInfoNCE(dim, None if fixed is None else fixed[i], init_std=init_std, generator=generator)
            for i in range(k)
        )

    @property
    def lambda_hat(self) -> Tensor:
        """The Λ̂ⁱ of each member, shape ``(k, d)``."""
        return torch.stack([m.lambda_hat for m in self.members])

    def forward(self, views: list[tuple[Tensor, Tensor]]) -> Tensor:
        if len(views) != len(self.members):
            raise ValueError(f"expected {len(self.members)} view pairs, got {len(views)}")
        losses = [m(h1, h2) for m, (h1, h2) in zip(self.members, views)]
        return torch.stack(losses).sum()

    def batch_loss(self, pairs: list[tuple[Tensor, Tensor]], negatives: Tensor | None = None) -> Tensor:
        """The sum over the ``k`` DGPs' view pairs."""
        return self(list(pairs))
