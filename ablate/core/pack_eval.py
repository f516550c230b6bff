"""One evaluation of every member of a pack per report, on the batched path (a GPU's): the numbers of
:meth:`ablate.core.experiment.Experiment.evaluate`, computed for all members at once on the device and brought to
the host in one transfer.

Each member draws its evaluation samples from its own evaluation generator, seeded as its solo run seeds it, in
the same order (the R² fit set, the score set, then one batch of latents), so a member's numbers are its solo
run's up to float reassociation (tests/core/test_pack_eval.py compares them). What differs from the solo path:
g and f run as one batched product per layer; the least squares of R² is one batched solve (LAPACK's ``gelsd`` on
the CPU as the solo path, the pseudo-inverse on a GPU, whose ``lstsq`` has no rank-revealing driver); the
similarity histograms are ``bucketize`` and ``bincount`` on the device (:func:`histograms`, equal to
``torch.histogram``). Only the Hungarian matching of MCC runs on the host, on the correlations that came over
with the rest. Pure torch and numpy: no I/O.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from ablate.columns import lambda_hat_column, r2_block_column, r2_dim_column
from ablate.core import dgp, metrics
from ablate.core.batched import pack_loss
from ablate.core.experiment import _EVAL_STREAM, _OVERLAP_SAMPLES
from ablate.core.losses import floor_loss

#: A :class:`ablate.core.pack.PackedExperiment` (not imported: the pack imports this module).
PackedExperiment = Any

__all__ = ["evaluate_members", "histograms"]

#: Bins of the similarity histograms (as :meth:`Experiment.evaluate` asks of :func:`metrics.similarity_overlap`).
_BINS = 40


def histograms(values: Tensor, edges: Tensor) -> Tensor:
    """Counts of each row of ``values`` in the bins ``edges`` on the device, as ``torch.histogram`` counts them:
    bin i holds ``edges[i] <= v < edges[i+1]``, the last bin also ``v == edges[-1]``; values outside are dropped.

    Shape:
        values: ``(k, n)``; edges: ``(bins + 1,)``; returns ``(k, bins)`` float64.
    """
    k, bins = values.shape[0], edges.numel() - 1
    index = torch.bucketize(values, edges, right=True) - 1
    index = torch.where(values == edges[-1], bins - 1, index)
    inside = (index >= 0) & (index < bins)
    offset = torch.arange(k, device=values.device).unsqueeze(1) * bins
    flat = torch.where(inside, index + offset, k * bins)  # one overflow bin for the values outside
    return torch.bincount(flat.flatten(), minlength=k * bins + 1)[: k * bins].view(k, bins).double()


def _r2_per_dim(h_fit: Tensor, z_fit: Tensor, h_eval: Tensor, z_eval: Tensor) -> Tensor:
    """:func:`metrics.linear_r2`'s per-dimension R² of each member, in float64 ``(k, d)``."""
    ones = torch.ones(*h_fit.shape[:2], 1, dtype=torch.float64, device=h_fit.device)
    xf = torch.cat([h_fit.double(), ones], dim=-1)
    if xf.device.type == "cpu":
        coef = torch.linalg.lstsq(xf, z_fit.double(), driver="gelsd").solution
    else:
        coef = torch.linalg.pinv(xf) @ z_fit.double()
    pred = torch.cat([h_eval.double(), ones], dim=-1) @ coef
    target = z_eval.double()
    ss_res = ((target - pred) ** 2).sum(1)
    ss_tot = ((target - target.mean(1, keepdim=True)) ** 2).sum(1)
    return 1.0 - ss_res / ss_tot


def _abs_corr(a: Tensor, b: Tensor) -> Tensor:
    """|Pearson r| between every output and latent of each member ``(k, d, d)``, as :func:`metrics.match_dimensions`."""
    a, b = a.double(), b.double()
    a = (a - a.mean(1, keepdim=True)) / a.std(1, keepdim=True).clamp_min(1e-12)
    b = (b - b.mean(1, keepdim=True)) / b.std(1, keepdim=True).clamp_min(1e-12)
    return (a.mT @ b / (a.shape[1] - 1)).abs()


def _similarity(h: Tensor, h_pos: Tensor) -> Tensor:
    """:func:`metrics.similarity_overlap` of each member: ``(k, 4 + 2 · bins)`` = pos_mean, neg_mean, overlap,
    nn_is_positive, then the normalised positive and negative histograms."""
    a = torch.nn.functional.normalize(h.double(), dim=-1)
    b = torch.nn.functional.normalize(h_pos.double(), dim=-1)
    sims = (a @ b.mT).clamp(-1.0, 1.0)
    n = sims.shape[1]
    pos = sims.diagonal(dim1=1, dim2=2).contiguous()
    neg_sum = sims.sum((1, 2)) - pos.sum(1)
    off = sims.clone()
    off.diagonal(dim1=1, dim2=2).fill_(float("-inf"))
    nn_is_pos = (pos > off.amax(2)).double().mean(1)
    edges = torch.linspace(-1.0, 1.0, _BINS + 1, dtype=torch.float64, device=sims.device)
    hp = histograms(pos, edges)
    hn = histograms(sims.flatten(1), edges) - hp  # every pair's, less the positives'
    hp, hn = hp / hp.sum(1, keepdim=True), hn / hn.sum(1, keepdim=True)
    overlap = torch.minimum(hp, hn).sum(1)
    stats = torch.stack([pos.mean(1), neg_sum / (n * (n - 1)), overlap, nn_is_pos], dim=1)
    return torch.cat([stats, hp, hn], dim=1)


def _floor_lambda(pack: PackedExperiment, hard: bool) -> Tensor | None:
    """Each member's Λ̂ of its loss floor ``(k, d)`` (:func:`floor_loss`: the true metric), or None (InfoNCE); built
    once per pack and hard-negative phase."""
    cache = pack.__dict__.setdefault("_floor_lambdas", {})
    if hard not in cache:
        lams = [getattr(floor_loss(c, hard), "lambda_hat", None) for c in pack.configs]
        cache[hard] = None if lams[0] is None else torch.stack(lams).to(pack.device, pack.dtype)
    return cache[hard]


@torch.no_grad()
def evaluate_members(pack: PackedExperiment, members: list[int]) -> list[dict[str, Any]]:
    """The dict :meth:`Experiment.evaluate` returns, for each listed member of ``pack`` (all at one step), from one
    batched evaluation and one transfer to the host (module doc)."""
    cfg, dev, dt = pack.configs[0], pack.device, pack.dtype
    exps = [pack._members[i] for i in members]
    steps = {m.step for m in exps}
    if len(steps) > 1:
        raise ValueError(f"a batched evaluation needs members at one step, got steps {sorted(steps)}")
    step, d, n = steps.pop(), cfg.latent_dim, cfg.eval_samples
    rows = torch.tensor(members, device=dev)
    params = pack._params if len(members) == pack.k else [p[rows] for p in pack._params]
    rngs = [torch.Generator(device=dev).manual_seed(pack.configs[i].seed * 7919 + _EVAL_STREAM + step) for i in members]
    z_fit = torch.stack([dgp.sample_uniform(n, d, generator=r, device=dev, dtype=dt) for r in rngs])
    z_eval = torch.stack([dgp.sample_uniform(n, d, generator=r, device=dev, dtype=dt) for r in rngs])

    def encode(z: Tensor) -> Tensor:
        return pack._encode(pack._apply_g(z, members), params)

    h_eval = encode(z_eval)
    r2 = _r2_per_dim(encode(z_fit), z_fit, h_eval, z_eval)
    corr = _abs_corr(h_eval, z_eval)
    hard = pack._hard_negatives(step)
    latents, _ = pack._latents(members, hard, rngs)
    latents = torch.stack(latents) if isinstance(latents, list) else latents
    b = cfg.batch_size
    full = None if len(members) == pack.k else members
    eval_loss = pack._losses(pack._apply_g(latents, members), params, full, hard, None if full is None else rows)
    lam_hat = pack.lambda_hat()
    lam_hat = None if lam_hat is None else lam_hat[rows]
    z_neg = latents[:, 2 * b :].reshape(len(members), b, cfg.n_hard_negatives, d) if hard else None

    def loss_on_latents(lam: Tensor | None) -> Tensor:
        tau, inv_tau = pack._tau[rows], pack._inv_tau[rows]
        return pack_loss(
            cfg.loss, latents[:, :b], latents[:, b : 2 * b], z_neg, lam=lam, tau=tau, inv_tau=inv_tau,
            layout=cfg.infonce_layout, batch_negatives=cfg.batch_negatives,
        )  # fmt: skip

    true_loss = loss_on_latents(lam_hat)
    floor_lam = _floor_lambda(pack, hard)
    floor = loss_on_latents(None if floor_lam is None else floor_lam[rows])
    m = min(_OVERLAP_SAMPLES, b)
    sim = _similarity(encode(latents[:, :m]), encode(latents[:, b : b + m]))
    losses = torch.stack([eval_loss, true_loss, floor], dim=1).double()
    parts = [r2.mean(1, keepdim=True), r2, corr.flatten(1), losses, sim]
    if lam_hat is not None:
        parts.append(lam_hat.double())
    host = torch.cat(parts, dim=1).tolist()  # the one transfer of the report
    return [_member_result(pack.configs[i], exps[j], host[j], d) for j, i in enumerate(members)]


def _member_result(cfg, exp, values: list[float], d: int) -> dict[str, Any]:
    """One member's :meth:`Experiment.evaluate` dict from its row of the transferred values."""
    r2, per_dim = values[0], values[1 : 1 + d]
    at = 1 + d
    corr = np.asarray(values[at : at + d * d]).reshape(d, d)
    at += d * d
    eval_loss, true_loss, floor = values[at : at + 3]
    at += 3
    pos_mean, neg_mean, overlap, nn_is_pos = values[at : at + 4]
    at += 4
    pos_hist, neg_hist = values[at : at + _BINS], values[at + _BINS : at + 2 * _BINS]
    lam_hat = values[at + 2 * _BINS :] or None
    out: dict[str, Any] = {"r2": r2}
    for i, v in enumerate(per_dim):
        out[r2_dim_column(i)] = v
    for lam, v in metrics.r2_per_block(per_dim, cfg.lambda_true).items():
        out[r2_block_column(lam)] = v
    matching = (corr, *linear_sum_assignment(-corr))
    out["mcc"] = metrics.mcc(None, None, matching)
    out["eval_loss"] = eval_loss
    out["true_latent_loss"] = true_loss
    out["loss_floor"] = floor
    out["loss_gap"] = eval_loss - floor
    if lam_hat is not None:
        for i, v in enumerate(lam_hat):
            out[lambda_hat_column(i)] = v
        truth = cfg.lambda_optimum
        out["lambda_max_rel_error"] = metrics.lambda_recovery(lam_hat, truth)["max_rel_error"]
        out["lambda_rank_corr"] = metrics.matched_lambda(None, None, lam_hat, truth, matching)["rank_corr"]
    out["sim_pos_mean"], out["sim_neg_mean"], out["sim_overlap"] = pos_mean, neg_mean, overlap
    out["nn_is_positive"] = nn_is_pos
    out["sim_pos_hist"], out["sim_neg_hist"] = pos_hist, neg_hist
    out.update(exp.generator_stats)
    return out
