"""Contrastive losses: InfoNCE, AnInfoNCE and its hard-negative and ensemble forms, and TriCL.

Batch layout (DESIGN.md): ``h1`` and ``h2`` are the encodings of the two views of ``B`` samples.
All ``2B`` encodings are anchors; the positive of ``h1[i]`` is ``h2[i]`` and vice versa; the
negatives of an anchor are the other ``2B - 2`` encodings. The loss is the cross-entropy of picking
the positive, averaged over the ``2B`` anchors. Logits come from one matmul
(``||a||²_Λ + ||b||²_Λ − 2 (aΛ)bᵀ``); the diagonal is masked with ``-inf``.

Similarities (keep the ½): AnInfoNCE ``s(a, b) = −½ (a − b)ᵀ Λ̂ (a − b)``; InfoNCE ``s(a, b) = aᵀb / τ``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ablate.core.losses.pair import pair_cross_entropy, pair_targets

__all__ = [
    "AnInfoNCE",
    "EnsembleAnInfoNCE",
    "HardNegativeAnInfoNCE",
    "InfoNCE",
    "TriCL",
    "aninfonce_logits",
    "infonce_logits",
    "pair_targets",
]


def _mask_diagonal(logits: Tensor) -> Tensor:
    eye = torch.eye(logits.shape[0], dtype=torch.bool, device=logits.device)
    return logits.masked_fill(eye, float("-inf"))


def aninfonce_logits(h: Tensor, lambda_hat: Tensor) -> Tensor:
    """Pairwise ``−½ (a − b)ᵀ diag(λ̂) (a − b)`` for all rows of ``h``, diagonal masked with ``-inf``.

    Shape:
        h: ``(n, d)``; lambda_hat: ``(d,)``; returns ``(n, n)``.
    """
    hw = h * lambda_hat
    sq = (hw * h).sum(-1)
    logits = hw @ h.T - 0.5 * (sq[:, None] + sq[None, :])
    return _mask_diagonal(logits)


def _training_logits_aninfonce(h: Tensor, lambda_hat: Tensor) -> Tensor:
    """Logits equal to :func:`aninfonce_logits` up to a constant per row (``−½‖a‖²_Λ̂``).

    Cross-entropy is invariant to a per-row shift, so the loss is the same; this form needs one fused
    ``addmm`` and an in-place diagonal fill instead of three n×n broadcasts and an n×n mask.
    """
    hw = h * lambda_hat
    sq = (hw * h).sum(-1)
    logits = torch.addmm(sq.mul(-0.5).unsqueeze(0), hw, h.T)
    return logits.fill_diagonal_(float("-inf"))


def infonce_logits(h: Tensor, tau: float) -> Tensor:
    """Pairwise ``aᵀb / τ`` for all rows of ``h``, diagonal masked with ``-inf``.

    Shape:
        h: ``(n, d)``; returns ``(n, n)``.
    """
    return _mask_diagonal(h @ h.T / tau)


def _fused(*tensors: Tensor) -> bool:
    """Use the row-blocked loss with its fused gradient (ablate.core.losses.pair) when a gradient is wanted;
    without one (evaluation) the plain forward pass is cheaper."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors) and tensors[0].shape[0] >= 4


def _check_views(h1: Tensor, h2: Tensor) -> None:
    if h1.shape != h2.shape or h1.ndim != 2:
        raise ValueError(f"views must both be (B, d), got {tuple(h1.shape)} and {tuple(h2.shape)}")


class InfoNCE(nn.Module):
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
        _check_views(h1, h2)
        h = torch.cat([h1, h2])
        if _fused(h):
            return pair_cross_entropy(h, h.new_full((h.shape[1],), 1.0 / self.tau), 0.0)
        logits = torch.mm(h / self.tau, h.T).fill_diagonal_(float("-inf"))
        return F.cross_entropy(logits, pair_targets(h1.shape[0], h1.device))


class AnInfoNCE(nn.Module):
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
        _check_views(h1, h2)
        lam = self.lambda_hat.to(h1.dtype)
        h = torch.cat([h1, h2])
        if _fused(h, lam):
            return pair_cross_entropy(h, lam, 0.5)
        logits = _training_logits_aninfonce(h, lam)
        return F.cross_entropy(logits, pair_targets(h1.shape[0], h1.device))


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

    def forward(self, h1: Tensor, h2: Tensor, h_neg: Tensor) -> Tensor:  # type: ignore[override]
        _check_views(h1, h2)
        b, d = h1.shape
        if h_neg.ndim != 3 or h_neg.shape[0] != b or h_neg.shape[2] != d:
            raise ValueError(f"h_neg must be (B={b}, M, d={d}), got {tuple(h_neg.shape)}")
        lam = self.lambda_hat.to(h1.dtype)
        pos = -0.5 * ((h1 - h2) ** 2 * lam).sum(-1, keepdim=True)  # (B, 1)
        hard = -0.5 * ((h1.unsqueeze(1) - h_neg) ** 2 * lam).sum(-1)  # (B, M)
        parts = [pos, hard]
        if self.batch_negatives:
            h = torch.cat([h1, h2])
            all_logits = aninfonce_logits(h, lam)[:b]  # rows: anchors h1[i]
            all_logits = all_logits.scatter(1, (torch.arange(b, device=h1.device) + b)[:, None], float("-inf"))
            parts.append(all_logits)  # own positive masked (it is column 0 already)
        logits = torch.cat(parts, dim=1)
        return F.cross_entropy(logits, torch.zeros(b, dtype=torch.long, device=h1.device))


class EnsembleAnInfoNCE(nn.Module):
    """Sum of AnInfoNCE losses over ``k`` DGPs that share g, with one Λ̂ⁱ per DGP (Cor. B.2).

    Shape:
        views: a sequence of ``k`` pairs ``(h1, h2)``, each ``(B, d)``; returns a scalar.
    """

    def __init__(self, dim: int, k: int, *, init_std: float = 0.1, generator: torch.Generator | None = None):
        super().__init__()
        if k < 1:
            raise ValueError(f"an ensemble needs k >= 1 DGPs, got {k}")
        self.members = nn.ModuleList(AnInfoNCE(dim, init_std=init_std, generator=generator) for _ in range(k))

    @property
    def lambda_hat(self) -> Tensor:
        """The Λ̂ⁱ of each member, shape ``(k, d)``."""
        return torch.stack([m.lambda_hat for m in self.members])

    def forward(self, views: list[tuple[Tensor, Tensor]]) -> Tensor:
        if len(views) != len(self.members):
            raise ValueError(f"expected {len(self.members)} view pairs, got {len(views)}")
        losses = [m(h1, h2) for m, (h1, h2) in zip(self.members, views)]
        return torch.stack(losses).sum()


class TriCL(nn.Module):
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
        _check_views(h1, h2)
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
