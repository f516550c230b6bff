"""The contrastive cross-entropy over all pairs of a batch, computed in row blocks with its gradient fused.

Both InfoNCE and AnInfoNCE score every pair of the ``n = 2B`` encodings ``h`` with a bilinear form plus a
term per column, ``S_ij = (h_i ⊙ w) · h_j − c · q_j`` with ``q_j = Σ_k w_k h_jk²``:
- AnInfoNCE: ``w = Λ̂``, ``c = ½`` (``−½ (h_i − h_j)ᵀ Λ̂ (h_i − h_j)`` minus ``−½ q_i``, a constant per row that
  the cross-entropy ignores);
- InfoNCE: ``w = 1/τ`` on every dimension, ``c = 0``.
The diagonal is excluded, the target of row ``i`` is its other view, and the loss is the mean over rows of
``logsumexp_j S_ij − S_i,target(i)``.

Plain autograd materialises the ``n × n`` logits, then its softmax and their gradients: several memory-bound
passes over ``n²`` floats, which dominate the step at large batches. Here the forward pass walks blocks of
rows, keeps one ``rows × n`` block alive, and accumulates the gradients of ``h`` and ``w`` as it goes (the
softmax's normalisation and the one-hot target are applied to the small ``rows × d`` factors, not to the
block), so the backward pass only scales them. The arithmetic is the same 6 n²d multiply-adds as autograd's.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["BLOCK_ELEMENTS", "pair_cross_entropy", "pair_targets"]

#: Target size of one logits block (rows × n floats): large enough for efficient matmuls, small enough to
#: stay in cache-friendly memory.
BLOCK_ELEMENTS = 1 << 18


def pair_targets(b: int, device: torch.device) -> Tensor:
    """Index of each anchor's positive in the ``2B`` layout: ``i -> i + B`` and ``i + B -> i``."""
    idx = torch.arange(b, device=device)
    return torch.cat([idx + b, idx])


def pair_cross_entropy(h: Tensor, w: Tensor, column_coef: float, *, block_rows: int | None = None) -> Tensor:
    """Mean cross-entropy of picking each row's other view among all other rows of ``h`` (see module doc).

    Args:
        h: ``(n, d)`` encodings, the first half one view and the second half the other (``n`` even).
        w: ``(d,)`` positive weights (Λ̂, or ``1/τ`` repeated); gradients flow to it if it requires them.
        column_coef: ``c`` of the per-column term ``−c · q_j`` (½ for AnInfoNCE, 0 for InfoNCE).
        block_rows: rows per block (default: about :data:`BLOCK_ELEMENTS` logits per block).

    Returns:
        A scalar tensor.
    """
    n, d = h.shape
    if n % 2 or n < 4 or w.shape != (d,):
        raise ValueError(f"need h (2B, d) with B >= 2 and w (d,), got h {tuple(h.shape)} and w {tuple(w.shape)}")
    rows = block_rows or max(1, min(n, BLOCK_ELEMENTS // n))
    return _PairCrossEntropy.apply(h, w, float(column_coef), int(rows))


def exp_floor(dtype: torch.dtype) -> float:
    """The clamp applied to the shifted logits before exp on CPU: half the log of the smallest normal number.

    On CPU, torch's vectorised exp takes a slow path for arguments whose result is not a normal number (measured
    with torch 2.13: 8–30× slower per element), and products with such tiny values slow the matmuls that follow.
    Late in training most shifted logits of a sharp similarity are there, and a step ran 2× slower (batch 1024,
    d = 4, step 5000: 68 ms against 35 ms early on). Clamped at −43.7 (fp32), a term is below 1e-19 against a
    row sum ≥ 1 (the row's maximum contributes exp(0) = 1): far below the rounding of any sum it enters, and a
    normal number in every product. The excluded diagonal is set to exactly 0 after the exp.
    """
    return 0.5 * math.log(torch.finfo(dtype).tiny)


class _PairCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, w: Tensor, c: float, rows: int) -> Tensor:
        n = h.shape[0]
        b = n // 2
        hw = h * w
        q = (hw * h).sum(1)
        col = q * (-c)
        target = pair_targets(b, h.device)
        total = h.new_zeros(())
        grad_h = torch.zeros_like(h)
        grad_w = torch.zeros_like(w)
        col_grad = torch.zeros_like(q)  # Σ_i ∂L/∂S_ij, for the −c q_j term
        floor = exp_floor(h.dtype) if h.device.type == "cpu" else None
        for start in range(0, n, rows):
            stop = min(start + rows, n)
            r = stop - start
            local = torch.arange(r, device=h.device)
            block = torch.addmm(col.unsqueeze(0), hw[start:stop], h.T)  # S[start:stop, :]
            block[local, local + start] = float("-inf")
            tgt = target[start:stop]
            positive = block[local, tgt]
            peak = block.amax(1, keepdim=True)
            block.sub_(peak)
            if floor is not None:
                block.clamp_min_(floor)
            block.exp_()  # E = exp(S − max): the block is reused in place
            block[local, local + start] = 0.0
            norm = block.sum(1, keepdim=True)
            total += (peak.squeeze(1) + norm.log().squeeze(1) - positive).sum()
            inv = norm.reciprocal()  # softmax P = E / norm, applied to the rows × d factors below
            # ∂L/∂S = P − Y (Y the one-hot targets); S_ij = hw_i · h_j − c q_j
            ph = torch.mm(block, h).mul_(inv)  # P @ h  (rows × d)
            g_rows = ph - h[tgt]  # (P − Y) @ h
            grad_h[start:stop] += g_rows * w
            grad_w += (g_rows * h[start:stop]).sum(0)
            # column side: (P − Y)ᵀ @ hw_rows, and the column sums of P − Y
            scaled = torch.cat([hw[start:stop] * inv, inv], dim=1)
            back = torch.mm(block.T, scaled)  # Eᵀ @ [hw_rows / norm, 1 / norm]
            grad_h += back[:, :-1]
            grad_h.index_add_(0, tgt, -hw[start:stop])
            col_grad += back[:, -1]
            col_grad.index_add_(0, tgt, -torch.ones(r, dtype=h.dtype, device=h.device))
        if c:
            # −c q_j with q_j = Σ_k w_k h_jk²: ∂/∂h_j = −2c w h_j · colsum_j, ∂/∂w_k = −c Σ_j colsum_j h_jk²
            grad_h -= (2 * c) * col_grad.unsqueeze(1) * hw
            grad_w -= c * (col_grad.unsqueeze(1) * h * h).sum(0)
        ctx.save_for_backward(grad_h / n, grad_w / n)
        return total / n

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        grad_h, grad_w = ctx.saved_tensors
        return grad_out * grad_h, grad_out * grad_w if ctx.needs_input_grad[1] else None, None, None
