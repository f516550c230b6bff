"""Small ``module:attr`` plugin parts for tests/plugins/test_plugins.py: a conditional, a generator, an encoder."""

from __future__ import annotations

import torch


def gaussian_positive(config, scale: float = 0.1):
    """An isotropic Gaussian step on the sphere, of fixed ``scale`` (Λ is ignored)."""

    def sample(z, lam, generator):
        x = z + scale * torch.randn(z.shape, generator=generator, device=z.device, dtype=z.dtype)
        return x / x.norm(dim=-1, keepdim=True)

    return sample


def orthogonal_g(config):
    """A random orthogonal map from the run's generator seed: linear, so its linear R² is 1."""
    gen = torch.Generator().manual_seed(config.effective_generator_seed)
    q, _ = torch.linalg.qr(torch.randn(config.latent_dim, config.latent_dim, generator=gen))
    g = torch.nn.Linear(config.latent_dim, config.latent_dim, bias=False)
    with torch.no_grad():
        g.weight.copy_(q)
    return g


def linear_encoder(config, generator, bias: bool = True):
    """One linear layer, its weights drawn from ``generator``."""
    f = torch.nn.Linear(config.latent_dim, config.latent_dim, bias=bias)
    with torch.no_grad():
        f.weight.copy_(torch.randn(f.weight.shape, generator=generator) / config.latent_dim**0.5)
        if bias:
            f.bias.zero_()
    return f


def not_a_module(config, generator):
    return "not a module"
