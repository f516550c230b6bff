"""Batched pieces of a pack (:mod:`ablate.core.pack`): the linear layers and contrastive losses of k models at once.

Every function takes tensors with a leading member dimension ``k`` and computes, for each member, the same
operations the solo code (:mod:`ablate.core.encoder`, :mod:`ablate.core.losses`) does, in the same order.

Two kernel paths (:attr:`ablate.core.pack.PackedExperiment.solo_kernels` picks one):

- **solo kernels** (the CPU's default): each member's matrix products are the solo run's own ``mm``/``addmm``
  calls, on buffers of their own, and its loss is the solo loss function itself (:func:`member_losses`), so a
  member equals its solo run to the last bit on any x86 CPU. Three things make a batched CPU computation differ,
  all measured on torch 2.13's MKL: ``bmm`` of k ≥ 2 matrices calls MKL's batched gemm (``cblas_sgemm_batch``),
  a pack of 1 its plain ``sgemm``; ``sgemm`` itself rounds differently when an operand does not start on the
  alignment of a fresh tensor (a member's slice of a stacked tensor does not; measured on an AMD EPYC at 16-byte
  offsets, and AVX-512 kernels would need 64); and ``softplus`` (forward and backward) has a vector and a scalar
  kernel that differ in the last bit, so which elements fall in the vector loop's tail changes the numbers. The
  element-wise ops left batched (``leaky_relu``, ``normalize``, Adam's arithmetic) give the same bits on either
  kernel, and their reductions run row by row in the same order as the solo run's.
- **batched kernels** (a GPU's): one ``bmm``/``baddbmm`` per layer for the whole pack, and the fused pair loss
  over k members (:func:`packed_pair_cross_entropy`); equal to the solo run up to float reassociation.

Two details make the batched path's reductions mirror the solo ones:

- autograd's ``bmm`` backward computes the gradient of a transposed right operand ``bᵀ`` as ``aᵀ @ g``, while
  ``mm``/``linear`` compute ``gᵀ @ a`` in the operand's own layout (torch's ``mm_mat2_backward``): another
  summation order. :func:`linear_nt` (``x @ Wᵀ + b``) therefore has its own backward that mirrors linear's;
- ``F.cross_entropy(..., reduction="mean")`` and a ``reduction="none"`` mean differ in the last bit, so the
  plain batched losses take one ``cross_entropy`` per member on the CPU (cheap: one call on a small matrix).

:func:`packed_pair_cross_entropy` is :func:`ablate.core.losses.pair.pair_cross_entropy` over k members: the
same blocks of rows, the same fused gradient, one batched matmul per block for the whole pack.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch.nn import functional as F

from ablate.core.losses.aninfonce import aninfonce_loss, hard_negative_loss
from ablate.core.losses.base import use_fused
from ablate.core.losses.infonce import infonce_loss
from ablate.core.losses.pair import BLOCK_ELEMENTS, exp_floor, pair_targets

__all__ = ["adam_update_", "linear_nt", "member_losses", "pack_loss", "packed_pair_cross_entropy"]


class _LinearNT(torch.autograd.Function):
    """``x @ wᵀ (+ b)`` per member, with linear's backward (``gx = g @ w``, ``gw = gᵀ @ x``, ``gb = Σ_rows g``);
    with ``solo`` each member's products are separate ``addmm``/``mm`` calls on fresh copies of its operands, as
    ``F.linear`` and its backward make them in a solo run."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, b: Tensor | None, solo: bool) -> Tensor:
        ctx.has_bias, ctx.solo = b is not None, solo
        if solo:
            xs, ws = [m.clone() for m in x], [m.clone() for m in w]
            ctx.members = xs, ws
            if b is None:
                return torch.stack([torch.mm(xi, wi.t()) for xi, wi in zip(xs, ws)])
            return torch.stack([torch.addmm(bi.clone(), xi, wi.t()) for bi, xi, wi in zip(b, xs, ws)])
        ctx.save_for_backward(x, w)
        if b is None:
            return torch.bmm(x, w.mT)
        return torch.baddbmm(b.unsqueeze(1), x, w.mT)

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor):
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        if ctx.solo:
            xs, ws = ctx.members
            gs = [m.clone() for m in g]
            gx = torch.stack([torch.mm(gi, wi) for gi, wi in zip(gs, ws)]) if need_x else None
            gw = torch.stack([torch.mm(gi.t(), xi) for gi, xi in zip(gs, xs)]) if need_w else None
            gb = torch.stack([gi.sum(0) for gi in gs]) if ctx.has_bias and need_b else None
            return gx, gw, gb, None
        x, w = ctx.saved_tensors
        gx = torch.bmm(g, w) if need_x else None
        gw = torch.bmm(g.mT, x) if need_w else None
        gb = g.sum(1) if ctx.has_bias and need_b else None
        return gx, gw, gb, None


def linear_nt(x: Tensor, w: Tensor, b: Tensor | None = None, *, solo_kernels: bool = False) -> Tensor:
    """k linear layers at once: ``x[i] @ w[i]ᵀ + b[i]``, equal per member to ``F.linear(x[i], w[i], b[i])`` (to the
    last bit with ``solo_kernels``, see the module doc).

    Shape:
        x: ``(k, n, in)``; w: ``(k, out, in)``; b: ``(k, out)`` or None; returns ``(k, n, out)``.
    """
    return _LinearNT.apply(x, w, b, bool(solo_kernels))


def packed_pair_cross_entropy(h: Tensor, w: Tensor, column_coef: float, *, block_rows: int | None = None) -> Tensor:
    """:func:`~ablate.core.losses.pair.pair_cross_entropy` of each of k members (see that module for the maths).

    Shape:
        h: ``(k, 2B, d)``; w: ``(k, d)``; returns ``(k,)``, each member's loss.
    """
    k, n, d = h.shape
    if n % 2 or n < 4 or w.shape != (k, d):
        raise ValueError(f"need h (k, 2B, d) with B >= 2 and w (k, d), got {tuple(h.shape)} and {tuple(w.shape)}")
    rows = block_rows or max(1, min(n, BLOCK_ELEMENTS // n))  # the solo rule: the same blocks per member
    return _PackedPairCrossEntropy.apply(h, w, float(column_coef), int(rows))


class _PackedPairCrossEntropy(torch.autograd.Function):
    """The solo ``_PairCrossEntropy`` line for line, with a member dimension in front."""

    @staticmethod
    def forward(ctx, h: Tensor, w: Tensor, c: float, rows: int) -> Tensor:
        k, n, _ = h.shape
        b = n // 2
        hw = h * w.unsqueeze(1)
        q = (hw * h).sum(2)
        col = q * (-c)
        target = pair_targets(b, h.device)
        total = h.new_zeros(k)
        grad_h = torch.zeros_like(h)
        grad_w = torch.zeros_like(w)
        col_grad = torch.zeros_like(q)
        floor = exp_floor(h.dtype) if h.device.type == "cpu" else None
        for start in range(0, n, rows):
            stop = min(start + rows, n)
            r = stop - start
            local = torch.arange(r, device=h.device)
            block = torch.baddbmm(col.unsqueeze(1), hw[:, start:stop], h.mT)
            block[:, local, local + start] = float("-inf")
            tgt = target[start:stop]
            positive = block[:, local, tgt]
            peak = block.amax(2, keepdim=True)
            block.sub_(peak)
            if floor is not None:
                block.clamp_min_(floor)
            block.exp_()
            block[:, local, local + start] = 0.0
            norm = block.sum(2, keepdim=True)
            total += (peak.squeeze(2) + norm.log().squeeze(2) - positive).sum(1)
            inv = norm.reciprocal()
            ph = torch.bmm(block, h).mul_(inv)
            g_rows = ph - h[:, tgt]
            grad_h[:, start:stop] += g_rows * w.unsqueeze(1)
            grad_w += (g_rows * h[:, start:stop]).sum(1)
            scaled = torch.cat([hw[:, start:stop] * inv, inv], dim=2)
            back = torch.bmm(block.mT, scaled)
            grad_h += back[:, :, :-1]
            grad_h.index_add_(1, tgt, -hw[:, start:stop])
            col_grad += back[:, :, -1]
            col_grad.index_add_(1, tgt, -torch.ones(k, r, dtype=h.dtype, device=h.device))
        if c:
            grad_h -= (2 * c) * col_grad.unsqueeze(2) * hw
            grad_w -= c * (col_grad.unsqueeze(2) * h * h).sum(1)
        ctx.save_for_backward(grad_h / n, grad_w / n)
        return total / n

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        grad_h, grad_w = ctx.saved_tensors
        gw = grad_out.unsqueeze(1) * grad_w if ctx.needs_input_grad[1] else None
        return grad_out[:, None, None] * grad_h, gw, None, None


@torch.no_grad()
def adam_update_(
    p: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    lrs: Tensor,
    groups: Sequence[tuple[int, int]],
    step: int,
    factor: float,
    betas: tuple[float, float],
    eps: float,
    mask: Tensor | None = None,
) -> None:
    """torch.optim.Adam's single-tensor step (no weight decay, no amsgrad) on the flat ``(rows, P)`` buffers of
    several members at once, in place. Column group ``g`` (the columns ``groups[g]``, e.g. the encoder's weights,
    then Λ̂'s θ) of row ``i`` takes the learning rate ``lrs[i, g] · factor``; ``step`` is the step being taken
    (1-based, one for all rows).

    ``lrs`` is a float64 device tensor built once: the step size ``lr · factor / (1 − β₁ᵗ)`` is computed in float64
    and rounded once, as Adam computes it in Python floats, with no host-to-device copy; and ``p + (−step_size · m)
    / denom`` is the order of the CPU's ``addcdiv_``, so each row takes Adam's steps exactly.

    With a ``mask``, only the rows it marks change: the others (a member whose loss was not finite, its gradient
    NaN) keep their weights and moments exactly, chosen on the device with ``torch.where`` (no host sync); the rows
    that change take the same values as without a mask.

    Shape:
        p, grad, exp_avg, exp_avg_sq: ``(rows, P)``; lrs: ``(rows, len(groups))``; mask: ``(rows,)`` bool.
    """
    beta1, beta2 = betas
    bc1 = 1 - beta1 ** float(step)
    bc2_sqrt = (1 - beta2 ** float(step)) ** 0.5
    neg = lrs.mul(factor).div_(bc1).neg_().to(p.dtype)
    if mask is None:
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        m, v = exp_avg, exp_avg_sq
    else:
        m = exp_avg.lerp(grad, 1 - beta1)
        v = exp_avg_sq.mul(beta2).addcmul_(grad, grad, value=1 - beta2)
    denom = (v.sqrt() / bc2_sqrt).add_(eps)
    keep = None if mask is None else mask.unsqueeze(1)
    for g, (start, stop) in enumerate(groups):
        update = m[:, start:stop].mul(neg[:, g : g + 1]).div_(denom[:, start:stop])
        if keep is None:
            p[:, start:stop].add_(update)
        else:
            torch.where(keep, p[:, start:stop] + update, p[:, start:stop], out=p[:, start:stop])
    if keep is not None:
        torch.where(keep, m, exp_avg, out=exp_avg)
        torch.where(keep, v, exp_avg_sq, out=exp_avg_sq)


def _mean_cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """Each member's mean cross-entropy: ``(k, rows, classes)``, ``(rows,)`` → ``(k,)``. One call per member on
    the CPU (bit-equal to the solo loss), one batched call elsewhere."""
    if logits.device.type == "cpu":
        return torch.stack([F.cross_entropy(row, target) for row in logits])
    k, rows, classes = logits.shape
    flat = F.cross_entropy(logits.reshape(k * rows, classes), target.repeat(k), reduction="none")
    return flat.view(k, rows).mean(1)


def _aninfonce_logits(h: Tensor, lam: Tensor) -> Tensor:
    """Batched :func:`ablate.core.losses.aninfonce.aninfonce_logits`: ``(k, n, d)``, ``(k, d)`` → ``(k, n, n)``."""
    hw = h * lam.unsqueeze(1)
    sq = (hw * h).sum(-1)
    logits = linear_nt(hw, h) - 0.5 * (sq[:, :, None] + sq[:, None, :])
    eye = torch.eye(h.shape[1], dtype=torch.bool, device=h.device)
    return logits.masked_fill(eye, float("-inf"))


def _symmetric(h: Tensor, w: Tensor, c: float) -> Tensor:
    """The 2B-anchor loss with ``S_ij = (h_i ⊙ w)·h_j − c q_j`` (AnInfoNCE: w = Λ̂, c = ½; InfoNCE: w = 1/τ, c = 0)."""
    if use_fused(h[0], w[0]):
        return packed_pair_cross_entropy(h, w, c)
    hw = h * w.unsqueeze(1)  # the plain loss (a GPU, or no gradient): one logits matrix per member
    col = (hw * h).sum(-1).mul(-c).unsqueeze(1)
    logits = torch.baddbmm(col, hw, h.mT)
    logits.diagonal(dim1=1, dim2=2).fill_(float("-inf"))
    return _mean_cross_entropy(logits, pair_targets(h.shape[1] // 2, h.device))


def _hard_negatives(h1: Tensor, h2: Tensor, h_neg: Tensor, lam: Tensor, batch_negatives: bool) -> Tensor:
    """Batched :class:`~ablate.core.losses.aninfonce.HardNegativeAnInfoNCE` with hard negatives."""
    k, b, _ = h1.shape
    # one view of Λ̂ per use, as the solo loss uses its (d,) Λ̂ three times: Λ̂'s gradient sums in the same order
    pos = -0.5 * ((h1 - h2) ** 2 * lam[:, None, :]).sum(-1, keepdim=True)  # (k, B, 1)
    hard = -0.5 * ((h1.unsqueeze(2) - h_neg) ** 2 * lam[:, None, None, :]).sum(-1)  # (k, B, M)
    parts = [pos, hard]
    if batch_negatives:
        all_logits = _aninfonce_logits(torch.cat([h1, h2], dim=1), lam)[:, :b]
        own = (torch.arange(b, device=h1.device) + b)[None, :, None].expand(k, b, 1)
        parts.append(all_logits.scatter(2, own, float("-inf")))
    return _mean_cross_entropy(torch.cat(parts, dim=2), torch.zeros(b, dtype=torch.long, device=h1.device))


def _reference_layout(h1: Tensor, h2: Tensor, tau: Tensor) -> Tensor:
    """Batched :func:`ablate.core.losses.infonce.reference_layout_loss` with one τ per member (``(k,)``)."""
    b = h1.shape[1]
    logits = torch.cat([linear_nt(h1, h1), (h1 * h2).sum(-1, keepdim=True)], dim=2) / tau[:, None, None]
    return _mean_cross_entropy(logits, torch.full((b,), b, dtype=torch.long, device=h1.device))


def member_losses(
    kind: str,
    h: Tensor,
    batch_size: int,
    *,
    lam: Sequence[Tensor] | None = None,
    taus: Sequence[float] | None = None,
    hard_negatives: bool = False,
    layout: str = "symmetric",
    batch_negatives: bool = True,
) -> Tensor:
    """Each member's training loss from the solo loss function itself, on a fresh copy of the member's encodings
    laid out as :meth:`ablate.core.experiment.Experiment.compute_loss` lays out a solo run's (``h1``, ``h2`` and the
    hard negatives are views of one ``(N, d)`` tensor): the solo kernels (module doc).

    Args:
        kind: ``"aninfonce"`` (with hard negatives when ``hard_negatives``) or ``"infonce"``.
        h: ``(k, N, d)`` the members' encodings: ``B`` first views, ``B`` second views, then ``B·M`` hard negatives.
        batch_size: ``B``.
        lam: each member's Λ̂ ``(d,)`` (AnInfoNCE).
        taus: each member's τ (InfoNCE).
        hard_negatives, layout, batch_negatives: as in :func:`pack_loss`.

    Returns:
        ``(k,)``.
    """
    b, d = batch_size, h.shape[2]
    out = []
    for i, member in enumerate(h):
        solo = member.clone()
        h1, h2 = solo[:b], solo[b : 2 * b]
        if kind == "infonce":
            out.append(infonce_loss(h1, h2, taus[i], layout))
        elif kind == "aninfonce" and hard_negatives:
            out.append(hard_negative_loss(h1, h2, solo[2 * b :].view(b, -1, d), lam[i], batch_negatives))
        elif kind == "aninfonce":
            out.append(aninfonce_loss(h1, h2, lam[i]))
        else:
            raise ValueError(f"member_losses: loss {kind!r} has no packed form; allowed: aninfonce, infonce")
    return torch.stack(out)


def pack_loss(
    kind: str,
    h1: Tensor,
    h2: Tensor,
    h_neg: Tensor | None,
    *,
    lam: Tensor | None = None,
    tau: Tensor | None = None,
    inv_tau: Tensor | None = None,
    layout: str = "symmetric",
    batch_negatives: bool = True,
) -> Tensor:
    """Each member's training loss, as its solo ``loss.batch_loss([(h1, h2)], h_neg)`` computes it.

    Args:
        kind: ``"aninfonce"`` (with hard negatives when ``h_neg`` is given) or ``"infonce"``.
        lam: ``(k, d)`` Λ̂ per member (AnInfoNCE).
        tau, inv_tau: ``(k,)`` τ and 1/τ per member (InfoNCE), each rounded from the double as the solo loss does.
        layout: InfoNCE's batch layout, ``"symmetric"`` or ``"reference"``.
        batch_negatives: with hard negatives, also use the other batch encodings as negatives.

    Shape:
        h1, h2: ``(k, B, d)``; h_neg: ``(k, B, M, d)`` or None; returns ``(k,)``.
    """
    if kind == "aninfonce":
        if h_neg is not None:
            return _hard_negatives(h1, h2, h_neg, lam, batch_negatives)
        return _symmetric(torch.cat([h1, h2], dim=1), lam, 0.5)
    if kind == "infonce":
        if layout == "reference":
            return _reference_layout(h1, h2, tau)
        inv_tau = inv_tau.unsqueeze(1).expand(-1, h1.shape[2]).contiguous()
        return _symmetric(torch.cat([h1, h2], dim=1), inv_tau, 0.0)
    raise ValueError(f"pack_loss: loss {kind!r} has no packed form; allowed: aninfonce, infonce")
