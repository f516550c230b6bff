"""k AnInfoNCE runs trained as one batched model: the GPU check's alternative to k processes on one GPU.

Each of the k models has its own reference encoder (d→10d→50d→50d→50d→50d→10d→d, leaky ReLU 0.01, unit-norm
output), its own Λ̂ = softplus(θ) and its own data; they share g. Every layer is one batched matmul over the
k models (``baddbmm``), the AnInfoNCE logits are one ``(k, 2B, 2B)`` batched matmul, and the loss is the sum
of the k models' losses, so each model's gradient is its own and Adam (elementwise) updates each model as if
it ran alone. A throughput prototype for the benchmark, not (yet) a Trainable.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from ablate import dgp
from ablate.config import REFERENCE_WIDTHS
from ablate.core.generator import build_generator

__all__ = ["BatchedAnInfoNCEModels", "batched_aninfonce_loss"]


def batched_aninfonce_loss(h1: Tensor, h2: Tensor, lambda_hat: Tensor) -> Tensor:
    """Sum over k of the symmetric AnInfoNCE loss (2B anchors, 2B − 2 negatives, s = −½ (a−b)ᵀΛ̂(a−b)).

    Shape:
        h1, h2: ``(k, B, d)``; lambda_hat: ``(k, d)``; returns a scalar.
    """
    k, b, _ = h1.shape
    h = torch.cat([h1, h2], dim=1)  # (k, 2B, d)
    hw = h * lambda_hat[:, None, :]
    sq = (hw * h).sum(-1)  # ‖a‖²_Λ̂ per row
    logits = torch.baddbmm(-0.5 * sq[:, None, :], hw, h.mT)  # −½‖b‖² + aᵀΛ̂b; the −½‖a‖² row shift cancels
    eye = torch.eye(2 * b, dtype=torch.bool, device=h.device)
    logits = logits.masked_fill(eye, float("-inf"))
    target = torch.cat([torch.arange(b, 2 * b), torch.arange(b)]).to(h.device)
    return F.cross_entropy(logits.reshape(k * 2 * b, 2 * b), target.repeat(k), reduction="sum") / (2 * b)


class BatchedAnInfoNCEModels:
    """k independent AnInfoNCE runs of one setting (lr 1e-4 for f, 1e-3 for Λ̂, as the reference)."""

    def __init__(
        self,
        k: int,
        *,
        d: int,
        batch: int,
        concentration: list[float],
        device: str = "cpu",
        lr: float = 1e-4,
        lr_lambda: float = 1e-3,
        seed: int = 0,
    ):
        self.k, self.d, self.batch = k, d, batch
        self.device = torch.device(device)
        gen = torch.Generator().manual_seed(seed)
        widths = [d, *(m * d for m in REFERENCE_WIDTHS), d]
        self.weights, self.biases = [], []
        for i in range(len(widths) - 1):
            bound = 1.0 / widths[i] ** 0.5
            w = (torch.rand(k, widths[i], widths[i + 1], generator=gen) * 2 - 1) * bound
            b = (torch.rand(k, 1, widths[i + 1], generator=gen) * 2 - 1) * bound
            self.weights.append(w.to(self.device).requires_grad_())
            self.biases.append(b.to(self.device).requires_grad_())
        self.theta = (torch.randn(k, d, generator=gen) * 0.1).to(self.device).requires_grad_()
        self.g = build_generator(d, seed=seed).to(self.device)
        self.lam = torch.tensor(concentration, device=self.device)
        self.rng = torch.Generator(device=self.device).manual_seed(seed + 1)
        self.optimizer = torch.optim.Adam(
            [{"params": self.weights + self.biases, "lr": lr}, {"params": [self.theta], "lr": lr_lambda}]
        )

    def encode(self, x: Tensor) -> Tensor:
        """Shape: ``(k, n, d) -> (k, n, d)``."""
        h = x
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = torch.baddbmm(b, h, w)
            if i < len(self.weights) - 1:
                h = F.leaky_relu(h, 0.01)
        return F.normalize(h, dim=-1)

    def loss(self) -> Tensor:
        n = self.k * self.batch
        z = dgp.sample_uniform(n, self.d, generator=self.rng, device=self.device)
        z_pos = dgp.sample_conditional(z, self.lam, generator=self.rng)
        x = self.g(torch.cat([z, z_pos])).view(2, self.k, self.batch, self.d)
        h = self.encode(torch.cat([x[0], x[1]], dim=1))
        return batched_aninfonce_loss(h[:, : self.batch], h[:, self.batch :], F.softplus(self.theta))

    def train(self, steps: int) -> None:
        for _ in range(steps):
            loss = self.loss()
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
