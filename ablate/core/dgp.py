"""Latent data generating process: marginal and conditionals on the unit hypersphere S^(d-1).

Conventions: anchors and plain negatives are uniform on the sphere; a positive is
``z+ = (z + eps) / ||z + eps||`` with ``eps ~ N(0, Lambda^-1)`` (density ∝ exp(-1/2 eps^T Lambda eps)),
redrawn while ``| ||z + eps|| - 1 | >= threshold`` as in the public reference implementation.

Everything here is pure torch: no I/O, and the random generator, device and dtype come from the
arguments (the conditionals take them from ``z``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "LowAcceptanceError",
    "as_concentration",
    "sample_conditional",
    "sample_hard_negatives",
    "sample_uniform",
    "sample_vmf",
]

#: Below this measured acceptance rate the rejection sampler gives up with a clear error.
MIN_ACCEPTANCE = 1e-3
#: Candidates drawn at least before the acceptance rate is judged.
_MIN_DRAWS_FOR_VERDICT = 2000
#: Upper bound on candidate elements (rows x dims) drawn in one round of the rejection sampler.
_MAX_CANDIDATE_ELEMENTS = 1 << 23


class LowAcceptanceError(ValueError):
    """The rejection sampler's acceptance rate is too low to finish in reasonable time."""


def sample_uniform(
    n: int,
    d: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Draw ``n`` points uniformly on the unit sphere S^(d-1).

    Shape:
        returns ``(n, d)``.
    """
    if generator is not None and device is None:
        device = generator.device
    x = torch.randn(n, d, generator=generator, device=device, dtype=dtype)
    return x / x.norm(dim=-1, keepdim=True)


def as_concentration(concentration: Tensor | float | list[float], d: int, like: Tensor) -> Tensor:
    """Return the diagonal of Λ as a ``(d,)`` tensor on ``like``'s device and dtype; checks Λ > 0."""
    lam = torch.as_tensor(concentration, device=like.device, dtype=like.dtype)
    if lam.ndim == 0:
        lam = lam.expand(d)
    if lam.shape != (d,):
        raise ValueError(f"concentration must be a scalar or have length d={d}, got shape {tuple(lam.shape)}")
    if not bool((lam > 0).all()):
        raise ValueError(f"concentration must be > 0 in every dimension, got {lam.tolist()}")
    return lam


def _acceptance_error(lam: Tensor, d: int, threshold: float, accepted: int, drawn: int) -> LowAcceptanceError:
    rate = accepted / max(drawn, 1)
    lo, hi = float(lam.min()), float(lam.max())
    lam_text = f"{lo:g}" if lo == hi else f"{lo:g}..{hi:g}"
    # ||z + eps||^2 ≈ 1 + sum(1/Λ): the norm stays within the threshold when sum(1/Λ) ≲ 2*threshold.
    needed = d / (2.0 * threshold)
    return LowAcceptanceError(
        f"conditional sampler: acceptance {rate:.2e} ({accepted} of {drawn} draws) for Λ={lam_text}, d={d}, "
        f"threshold={threshold:g} is too low to finish. Raise Λ (about Λ ≥ {needed:.0f} keeps |‖z+ε‖−1| "
        f"< {threshold:g} typical at d={d}), raise the threshold, or set threshold to null to disable rejection."
    )


def sample_conditional(
    z: Tensor,
    concentration: Tensor | float | list[float],
    *,
    threshold: float | None = 0.1,
    generator: torch.Generator | None = None,
    min_acceptance: float = MIN_ACCEPTANCE,
) -> Tensor:
    """Draw one positive per anchor from the projected normal conditional around ``z``.

    ``z+ = (z + eps) / ||z + eps||`` with ``eps ~ N(0, diag(concentration)^-1)``. With a ``threshold``,
    draws with ``| ||z + eps|| - 1 | >= threshold`` are rejected and redrawn (vectorised: every
    round draws several candidates per pending row and keeps the first accepted one). If the measured
    acceptance falls below ``min_acceptance``, :class:`LowAcceptanceError` names Λ, d and the rate.

    Args:
        z: anchors on the unit sphere.
        concentration: Λ's diagonal, a scalar or a ``(d,)`` tensor/list, all > 0.
        threshold: rejection threshold on the norm, or None for no rejection.
        generator: random generator on ``z``'s device.
        min_acceptance: smallest acceptance rate tolerated before failing.

    Shape:
        z: ``(n, d)``; returns ``(n, d)``.
    """
    n, d = z.shape
    lam = as_concentration(concentration, d, z)
    std = lam.rsqrt()
    if threshold is None:
        x = z + torch.randn(z.shape, generator=generator, device=z.device, dtype=z.dtype) * std
        return x / x.norm(dim=-1, keepdim=True)
    if threshold <= 0:
        raise ValueError(f"threshold must be > 0 or None, got {threshold}")

    out = torch.empty_like(z)
    pending = torch.arange(n, device=z.device)
    drawn = accepted = 0
    per_row = 1
    while pending.numel() > 0:
        m = pending.numel()
        k = max(1, min(per_row, _MAX_CANDIDATE_ELEMENTS // max(m * d, 1)))
        eps = torch.randn((m, k, d), generator=generator, device=z.device, dtype=z.dtype) * std
        x = z[pending].unsqueeze(1) + eps
        norm = x.norm(dim=-1)
        ok = (norm - 1.0).abs() < threshold
        hit = ok.any(dim=1)
        first = ok.to(torch.int8).argmax(dim=1)
        n_ok = int(ok.sum())  # one host sync per round
        drawn += m * k
        accepted += n_ok
        if n_ok:
            rows = hit.nonzero().squeeze(1)
            chosen = x[rows, first[rows]]
            out[pending[rows]] = chosen / chosen.norm(dim=-1, keepdim=True)
            pending = pending[~hit]
        if drawn >= _MIN_DRAWS_FOR_VERDICT and accepted < min_acceptance * drawn:
            raise _acceptance_error(lam, d, threshold, accepted, drawn)
        rate = max(accepted, 1) / drawn
        # enough candidates that a pending row succeeds with high probability in the next round
        per_row = max(1, math.ceil(3.0 / rate))
    return out


def sample_hard_negatives(
    z: Tensor,
    concentration: Tensor | float | list[float],
    n_negatives: int,
    *,
    threshold: float | None = 0.1,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Draw ``n_negatives`` hard negatives per anchor from the conditional with concentration Λ⁻.

    Cor. B.1 of Rusak et al.: negatives from the same family of conditionals as the positives,
    so the AnInfoNCE optimum sits at Λ̂ = Λ⁺ − Λ⁻.

    Shape:
        z: ``(n, d)``; returns ``(n, n_negatives, d)``.
    """
    n, d = z.shape
    if n_negatives < 1:
        raise ValueError(f"n_negatives must be >= 1, got {n_negatives}")
    rep = z.repeat_interleave(n_negatives, dim=0)
    neg = sample_conditional(rep, concentration, threshold=threshold, generator=generator)
    return neg.view(n, n_negatives, d)


def _sample_vmf_cosine(n: int, d: int, kappa: float, generator, device, dtype) -> Tensor:
    """Wood (1994): sample w = <mu, x> for the vMF distribution on S^(d-1); vectorised rejection."""
    b = (d - 1.0) / (2.0 * kappa + math.sqrt(4.0 * kappa**2 + (d - 1.0) ** 2))
    x0 = (1.0 - b) / (1.0 + b)
    c = kappa * x0 + (d - 1.0) * math.log(1.0 - x0**2)
    out = torch.empty(n, dtype=torch.float64)
    pending = torch.arange(n)
    cpu_gen = torch.Generator().manual_seed(
        int(torch.randint(0, 2**62, (1,), generator=generator, device=device).item())
    )
    for _ in range(1000):
        m = pending.numel()
        if m == 0:
            break
        # Beta((d-1)/2, (d-1)/2) as G1 / (G1 + G2), the Gammas drawn with our own generator
        g1 = _gamma(torch.full((2 * m,), (d - 1.0) / 2.0, dtype=torch.float64), cpu_gen)
        e = g1[:m] / (g1[:m] + g1[m:])
        w = (1.0 - (1.0 + b) * e) / (1.0 - (1.0 - b) * e)
        u = torch.rand(m, generator=cpu_gen, dtype=torch.float64)
        ok = kappa * w + (d - 1.0) * torch.log(1.0 - x0 * w) - c >= torch.log(u)
        out[pending[ok]] = w[ok]
        pending = pending[~ok]
    else:  # pragma: no cover - Wood's acceptance is > 0.5 for every kappa and d
        raise RuntimeError("vMF sampler did not converge")
    return out.to(device=device, dtype=dtype)


def _gamma(alpha: Tensor, generator: torch.Generator) -> Tensor:
    """Marsaglia–Tsang Gamma(alpha, 1) sampler (alpha >= 1/2 here) using an explicit generator."""
    boost = alpha < 1
    a = torch.where(boost, alpha + 1.0, alpha)
    dd = a - 1.0 / 3.0
    cc = 1.0 / torch.sqrt(9.0 * dd)
    out = torch.empty_like(a)
    pending = torch.arange(a.numel())
    while pending.numel() > 0:
        m = pending.numel()
        x = torch.randn(m, generator=generator, dtype=a.dtype)
        v = (1.0 + cc[pending] * x) ** 3
        u = torch.rand(m, generator=generator, dtype=a.dtype)
        ok = (v > 0) & (
            torch.log(u) < 0.5 * x**2 + dd[pending] - dd[pending] * v + dd[pending] * torch.log(v.clamp_min(1e-300))
        )
        out[pending[ok]] = (dd[pending] * v)[ok]
        pending = pending[~ok]
    if bool(boost.any()):
        u = torch.rand(int(boost.sum()), generator=generator, dtype=a.dtype)
        out[boost] = out[boost] * u ** (1.0 / alpha[boost])
    return out


def sample_vmf(z: Tensor, kappa: float, *, generator: torch.Generator | None = None) -> Tensor:
    """Draw one sample per anchor from the von Mises–Fisher distribution vMF(z, kappa) on S^(d-1).

    Used for the InfoNCE rows of Zimmermann et al. (Table 1). Wood's (1994) algorithm.

    Shape:
        z: ``(n, d)`` unit vectors; returns ``(n, d)``.
    """
    if kappa <= 0:
        raise ValueError(f"kappa must be > 0, got {kappa}")
    n, d = z.shape
    w = _sample_vmf_cosine(n, d, float(kappa), generator, z.device, z.dtype).unsqueeze(1)
    v = torch.randn(z.shape, generator=generator, device=z.device, dtype=z.dtype)
    v = v - (v * z).sum(-1, keepdim=True) * z  # tangent direction at z
    v = v / v.norm(dim=-1, keepdim=True)
    return w * z + (1.0 - w**2).clamp_min(0).sqrt() * v
