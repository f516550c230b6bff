"""Tests of the encoder f (``ablate.core.encoder``): the reference widths, unit-norm outputs, configurable widths."""

from __future__ import annotations

import torch
from torch import nn

from ablate.config import REFERENCE_WIDTHS, RunConfig
from ablate.core.encoder import Encoder


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _linear_shapes(enc: Encoder) -> list[tuple[int, int]]:
    return [(m.in_features, m.out_features) for m in enc.net if isinstance(m, nn.Linear)]


def test_encoder_reference_widths():
    d = 4
    enc = Encoder(d, d)
    assert REFERENCE_WIDTHS == (10, 50, 50, 50, 50, 10) and RunConfig().encoder_widths == list(REFERENCE_WIDTHS)
    widths = [d, 10 * d, 50 * d, 50 * d, 50 * d, 50 * d, 10 * d, d]  # d→10d→50d→50d→50d→50d→10d→d
    assert _linear_shapes(enc) == list(zip(widths[:-1], widths[1:]))
    acts = [m for m in enc.net if isinstance(m, nn.LeakyReLU)]
    assert len(acts) == 6 and all(a.negative_slope == 0.01 for a in acts)
    assert not isinstance(list(enc.net)[-1], nn.LeakyReLU), "no activation after the last layer"


def test_encoder_output_shape_and_unit_norm():
    torch.manual_seed(0)
    enc = Encoder(7, 3)
    h = enc(torch.randn(64, 7, generator=gen(0)))
    assert h.shape == (64, 3)
    assert torch.allclose(h.norm(dim=1), torch.ones(64), atol=1e-5)
    raw = Encoder(7, 3, normalize=False)(torch.randn(64, 7, generator=gen(0)))
    assert not torch.allclose(raw.norm(dim=1), torch.ones(64), atol=1e-2), "normalize=False must not normalise"


def test_encoder_configurable_multipliers():
    enc = Encoder(5, 3, (2, 4), slope=0.1)
    assert _linear_shapes(enc) == [(5, 6), (6, 12), (12, 3)]
    assert [m.negative_slope for m in enc.net if isinstance(m, nn.LeakyReLU)] == [0.1, 0.1]
    assert _linear_shapes(Encoder(5, 3, ())) == [(5, 3)]
    assert enc.matmul_flops(10) == 2 * 10 * (5 * 6 + 6 * 12 + 12 * 3)
