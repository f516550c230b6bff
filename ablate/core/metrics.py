"""Identifiability metrics: linear R², MCC, Λ̂ recovery, loss floor, iterations to target, overlap.

Pure functions of tensors (and plain numbers); no I/O. The Hungarian matching of MCC uses scipy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

__all__ = [
    "iterations_to_target",
    "lambda_recovery",
    "linear_r2",
    "match_dimensions",
    "matched_lambda",
    "mcc",
    "r2_per_block",
    "similarity_overlap",
]


def _float64(values: Sequence[float] | Tensor) -> np.ndarray:
    """``values`` as a float64 array: a tensor widened exactly, a list of Python floats kept as it is (not through
    a float32 tensor)."""
    if isinstance(values, Tensor):
        return values.detach().cpu().double().numpy()
    return np.asarray(values, dtype=float)


def _with_bias(x: Tensor) -> Tensor:
    return torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype, device=x.device)], dim=1)


def linear_r2(z_hat_fit: Tensor, z_fit: Tensor, z_hat_eval: Tensor, z_eval: Tensor) -> dict[str, object]:
    """Linear identifiability: fit ``z ≈ A ẑ + b`` by least squares on one set, score R² on another.

    R² per latent dimension is ``1 − SS_res / SS_tot`` on the evaluation set; ``r2`` is their mean
    (scikit-learn's ``uniform_average``). Computed in float64.

    Shape:
        z_hat_*: ``(n, k)``; z_*: ``(n, d)``. Returns ``{"r2": float, "r2_per_dim": list[float]}``.
    """
    xf = _with_bias(z_hat_fit.detach().double())
    coef = torch.linalg.lstsq(
        xf.cpu(), z_fit.detach().double().cpu(), driver="gelsd"
    ).solution  # gelsy is not bit-reproducible
    pred = _with_bias(z_hat_eval.detach().double()).cpu() @ coef
    target = z_eval.detach().double().cpu()
    ss_res = ((target - pred) ** 2).sum(0)
    ss_tot = ((target - target.mean(0)) ** 2).sum(0)
    per_dim = 1.0 - ss_res / ss_tot
    return {"r2": float(per_dim.mean()), "r2_per_dim": per_dim.tolist()}


def r2_per_block(r2_per_dim: Sequence[float], concentration: Sequence[float]) -> dict[float, float]:
    """Mean R² over each block of dimensions with equal Λ, keyed by that Λ (ascending)."""
    lam = np.asarray(concentration, dtype=float)
    r2 = np.asarray(r2_per_dim, dtype=float)
    if lam.shape != r2.shape:
        raise ValueError(f"r2_per_dim has {r2.size} entries but concentration has {lam.size}")
    return {float(v): float(r2[lam == v].mean()) for v in np.unique(lam)}


Matching = tuple[np.ndarray, np.ndarray, np.ndarray]


def match_dimensions(z_hat: Tensor, z: Tensor) -> Matching:
    """|Pearson r| between every output and latent, and the Hungarian matching maximising it
    (``corr, rows, cols``: output ``rows[i]`` is matched to latent ``cols[i]``). Pass it to :func:`mcc` and
    :func:`matched_lambda` to match once for both."""
    a = z_hat.detach().double().cpu()
    b = z.detach().double().cpu()
    a = (a - a.mean(0)) / a.std(0).clamp_min(1e-12)
    b = (b - b.mean(0)) / b.std(0).clamp_min(1e-12)
    corr = (a.T @ b / (a.shape[0] - 1)).abs().numpy()
    rows, cols = linear_sum_assignment(-corr)
    return corr, rows, cols


def mcc(z_hat: Tensor, z: Tensor, matching: Matching | None = None) -> float:
    """Mean correlation coefficient: |Pearson r| after Hungarian matching of dimensions.

    Shape:
        z_hat: ``(n, k)``; z: ``(n, d)``.
    """
    corr, rows, cols = matching or match_dimensions(z_hat, z)
    return float(corr[rows, cols].mean())


def matched_lambda(
    z_hat: Tensor,
    z: Tensor,
    lambda_hat: Sequence[float] | Tensor,
    lambda_true: Sequence[float] | Tensor,
    matching: Matching | None = None,
) -> dict[str, object]:
    """Λ̂ of the encoder output matched (as in MCC) to each latent, and its rank correlation with Λ.

    Sorting both lists would make their ranks agree by construction; matching outputs to latents first
    tests whether the output that encodes latent j learned latent j's concentration (Fig. 3C). The
    Spearman correlation is nan when Λ is constant.

    Shape:
        z_hat: ``(n, d)``; z: ``(n, d)``; lambda_hat, lambda_true: ``(d,)``.
    """
    from scipy.stats import spearmanr

    _, rows, cols = matching or match_dimensions(z_hat, z)
    hat, true = _float64(lambda_hat), _float64(lambda_true)
    matched = np.empty_like(true)
    matched[cols] = hat[rows]  # latent cols[i] is encoded by output rows[i]
    rho = float("nan") if np.ptp(true) == 0 or np.ptp(matched) == 0 else float(spearmanr(matched, true).statistic)
    return {"lambda_hat_matched": matched.tolist(), "rank_corr": rho}


def lambda_recovery(lambda_hat: Sequence[float] | Tensor, lambda_true: Sequence[float] | Tensor) -> dict[str, object]:
    """Compare learned and true concentrations after sorting both (blocks may permute).

    Returns both sorted value lists and the largest and mean relative error ``|Λ̂ − Λ| / Λ`` of the
    sorted pairs.
    """
    hat, true = np.sort(_float64(lambda_hat)), np.sort(_float64(lambda_true))
    if hat.shape != true.shape:
        raise ValueError(f"lambda_hat has {hat.size} entries but lambda_true has {true.size}")
    rel = np.abs(hat - true) / true
    return {
        "lambda_hat_sorted": hat.tolist(),
        "lambda_true_sorted": true.tolist(),
        "max_rel_error": float(rel.max()),
        "mean_rel_error": float(rel.mean()),
    }


def iterations_to_target(
    steps: Sequence[int], r2: Sequence[float], targets: Sequence[float]
) -> dict[float, int | None]:
    """First step at which R² reached each target (None if never), as in Fig. 8B / 9B."""
    out: dict[float, int | None] = {}
    for t in targets:
        out[float(t)] = next((int(s) for s, v in zip(steps, r2) if v >= t), None)
    return out


def similarity_overlap(h: Tensor, h_pos: Tensor, *, bins: int = 50) -> dict[str, object]:
    """Cosine similarities of positive pairs vs negative pairs (Fig. 8C/F) and their overlap.

    ``overlap`` is the shared area of the two normalised histograms (0 = disjoint, 1 = identical);
    ``nn_is_positive`` is the fraction of anchors whose nearest neighbour is their positive.

    Shape:
        h, h_pos: ``(n, d)``.
    """
    a = torch.nn.functional.normalize(h.detach().double(), dim=-1).cpu()
    b = torch.nn.functional.normalize(h_pos.detach().double(), dim=-1).cpu()
    sims = (a @ b.T).clamp(-1.0, 1.0)  # rounding can give 1 + 1e-16, which the histogram would drop
    n = sims.shape[0]
    pos = sims.diagonal()
    neg_sum = sims.sum() - pos.sum()
    off = sims.clone()
    off.fill_diagonal_(float("-inf"))
    nn_is_pos = float((pos > off.max(1).values).double().mean())
    neg = off[torch.isfinite(off)]
    edges = torch.linspace(-1.0, 1.0, bins + 1, dtype=torch.float64)
    hp = torch.histogram(pos, bins=edges).hist
    hn = torch.histogram(neg, bins=edges).hist
    hp, hn = hp / hp.sum(), hn / hn.sum()
    return {
        "pos_mean": float(pos.mean()),
        "neg_mean": float(neg_sum / (n * (n - 1))),
        "overlap": float(torch.minimum(hp, hn).sum()),
        "nn_is_positive": nn_is_pos,
        "bin_edges": edges.tolist(),
        "pos_hist": hp.tolist(),
        "neg_hist": hn.tolist(),
    }
