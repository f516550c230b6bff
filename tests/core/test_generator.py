"""Tests of the fixed generator g (``ablate.core.generator``); the encoder f is tested in test_encoder.py."""

from __future__ import annotations

import pytest
import torch

from ablate.config import RunConfig
from ablate.core.dgp import sample_uniform
from ablate.core.generator import (
    GENERATOR_SLOPE,
    PAPER_COND_QUANTILE,
    PAPER_COND_SAMPLES,
    InvertibleMLP,
    build_generator,
    condition_numbers,
    condition_threshold,
)

F64 = torch.float64


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- generator g


@pytest.mark.parametrize(("d", "seed", "quantile"), [(10, 0, 0.25), (20, 3, 0.25), (6, 1, 0.1)])
def test_every_layer_is_below_the_condition_threshold(d, seed, quantile):
    g = build_generator(d, n_layers=3, seed=seed, cond_quantile=quantile, n_cond_samples=4000)
    # build_generator draws the threshold pool first from Generator().manual_seed(seed): recompute it
    threshold = condition_threshold(d, n_samples=4000, quantile=quantile, generator=gen(seed))
    assert len(g.layers) == 3
    for layer in g.layers:
        w = layer.weight.detach().to(F64)
        assert w.shape == (d, d) and layer.bias is None
        # the float32 copy of the accepted float64 matrix moves its condition number by ~1e-6 relative
        cond = float(torch.linalg.cond(w))
        assert cond < threshold * (1 + 1e-4), f"layer condition number {cond:.3f} >= threshold {threshold:.3f}"
        # column-L2-normalised draws from uniform(−1, 1)
        assert torch.allclose(w.norm(dim=0), torch.ones(d, dtype=F64), atol=1e-6), "columns must have unit norm"
    assert g.info.threshold == pytest.approx(threshold, rel=1e-12)
    # the threshold is a real constraint: a fresh pool of draws exceeds it ~(1 − quantile) of the time
    fresh = torch.rand(2000, d, d, generator=gen(99), dtype=F64) * 2 - 1
    frac_above = float((torch.linalg.cond(fresh / fresh.norm(dim=1, keepdim=True)) >= threshold).double().mean())
    assert abs(frac_above - (1 - quantile)) < 0.05, f"{frac_above:.3f} of fresh draws above threshold (tol 0.05)"


def test_condition_threshold_is_the_order_statistic_of_its_pool():
    # the reference: sort the pool's condition numbers ascending and take entry int(n * ratio)
    d, n = 5, 3000
    w = torch.rand(n, d, d, generator=gen(7), dtype=F64) * 2 - 1
    conds = torch.linalg.cond(w / w.norm(dim=1, keepdim=True)).sort().values
    for q in (0.0, 0.25):
        t = condition_threshold(d, n_samples=n, quantile=q, generator=gen(7))
        assert abs(t - float(conds[int(n * q)])) < 1e-8 * t
    assert condition_threshold(d, n_samples=n, quantile=0.0, generator=gen(7)) == pytest.approx(
        float(conds.min()), rel=1e-8
    )
    with pytest.raises(ValueError, match="cond_quantile"):
        condition_threshold(d, n_samples=n, quantile=1.0, generator=gen(7))


def test_condition_numbers_match_torch_linalg_cond():
    w = torch.rand(200, 12, 12, generator=gen(3), dtype=F64) * 2 - 1
    assert torch.allclose(condition_numbers(w), torch.linalg.cond(w), rtol=1e-7)


def test_defaults_are_the_papers_construction():
    # both reference main_mlp.py: construct_invertible_mlp(..., cond_thresh_ratio=0.0, n_iter_cond_thresh=25000)
    assert (PAPER_COND_QUANTILE, PAPER_COND_SAMPLES) == (0.0, 25_000)
    cfg = RunConfig()
    assert cfg.generator_cond_quantile == 0.0 and cfg.generator_cond_samples == 25_000 and cfg.generator_layers == 3


def test_default_g_at_d10_is_as_well_conditioned_as_the_papers():
    """Would have caught the loose g: every layer must beat the best draws of an independent 25 000 pool.

    The layers are at most their own pool's minimum; an independent pool's minimum is itself random
    (3.5-3.9 at d = 10 over seeds), so the test compares with its 10th smallest value (≈ 4.2), far below
    what the helper's default (quantile 0.25: ≈ 16) gives.
    """
    cfg = RunConfig()
    g = build_generator(
        10,
        n_layers=cfg.generator_layers,
        seed=0,
        cond_quantile=cfg.generator_cond_quantile,
        n_cond_samples=cfg.generator_cond_samples,
    )
    fresh = torch.cat([condition_numbers(_draws(5000, 10, seed)) for seed in range(500, 505)]).sort().values
    assert fresh.numel() == 25_000
    conds = [float(torch.linalg.cond(layer.weight.double())) for layer in g.layers]
    assert max(conds) < float(fresh[9]), (
        f"layer condition numbers {conds} vs a fresh pool's 10th smallest {float(fresh[9]):.3f}"
    )
    assert max(conds) <= g.info.threshold * (1 + 1e-5)
    assert g.info.threshold < float(fresh[9]) and g.info.threshold > 3.0  # ≈ 3.6-4 at d = 10
    assert g.info.layer_conditions == pytest.approx(conds, rel=1e-5)
    # the helper's own default (0.25 of 10 000) is what ablate wrongly used: far worse, and the test above would fail
    loose = build_generator(10, seed=0, cond_quantile=0.25, n_cond_samples=10_000)
    assert max(loose.info.layer_conditions) > 2 * float(fresh[9])


def _draws(n: int, d: int, seed: int) -> torch.Tensor:
    w = torch.rand(n, d, d, generator=gen(seed), dtype=F64) * 2 - 1
    return w / w.norm(dim=1, keepdim=True)


def test_generator_weights_are_shared_within_a_process():
    a = build_generator(6, seed=11, n_cond_samples=500)
    b = build_generator(6, seed=11, n_cond_samples=500)
    assert a is not b, "each call returns its own module, so moving one to a device leaves the other alone"
    for la, lb in zip(a.layers, b.layers):
        assert torch.equal(la.weight, lb.weight)
    a.double()
    assert b.layers[0].weight.dtype == torch.float32
    assert build_generator(6, seed=11, n_cond_samples=500).layers[0].weight.dtype == torch.float32
    assert build_generator(6, seed=11, n_cond_samples=400).info.threshold != a.info.threshold


def test_generator_is_invertible():
    z = sample_uniform(2000, 10, generator=gen(1))
    g = build_generator(10, seed=0)
    x = g(z)
    assert x.shape == z.shape and x.dtype == torch.float32
    err = float((g.inverse(x) - z).abs().max())
    assert err < 1e-4, f"float32 g.inverse(g(z)) error {err:.2g} (tol 1e-4)"
    # in float64 the inversion is exact to rounding, also at d=20 with 4 layers
    z64 = sample_uniform(2000, 20, generator=gen(2), dtype=F64)
    g64 = build_generator(20, n_layers=4, seed=1).double()
    err64 = float((g64.inverse(g64(z64)) - z64).abs().max())
    assert err64 < 1e-9, f"float64 g.inverse(g(z)) error {err64:.2g} (tol 1e-9)"


def test_generator_forward_is_linear_leaky_relu_chain():
    g = build_generator(4, n_layers=3, seed=2)
    z = sample_uniform(50, 4, generator=gen(0))
    w = [layer.weight.detach() for layer in g.layers]
    h = z @ w[0].T
    h = torch.where(h >= 0, h, GENERATOR_SLOPE * h) @ w[1].T
    h = torch.where(h >= 0, h, GENERATOR_SLOPE * h) @ w[2].T  # no activation after the last layer
    assert GENERATOR_SLOPE == 0.2
    assert torch.allclose(g(z), h, atol=1e-6)
    # the leaky ReLU is really non-linear here (some pre-activations are negative)
    assert not torch.allclose(g(z), z @ (w[2] @ w[1] @ w[0]).T, atol=1e-3)


def test_generator_seeding():
    a, b, c = build_generator(8, seed=5), build_generator(8, seed=5), build_generator(8, seed=6)
    for la, lb, lc in zip(a.layers, b.layers, c.layers):
        assert torch.equal(la.weight, lb.weight), "same seed must give the same weights"
        assert not torch.allclose(la.weight, lc.weight), "different seeds must give different weights"
    # and the layers of one g differ from each other
    assert not torch.allclose(a.layers[0].weight, a.layers[1].weight)


def test_generator_is_frozen():
    g = build_generator(6, seed=0)
    params = list(g.parameters())
    assert len(params) == 3
    assert all(not p.requires_grad for p in params), "g must have no trainable parameters"
    assert not g.training
    assert not g(sample_uniform(5, 6, generator=gen(0))).requires_grad


def test_generator_rejects_bad_arguments():
    with pytest.raises(ValueError, match="latent_dim"):
        build_generator(1)
    with pytest.raises(ValueError, match="n_layers"):
        build_generator(4, n_layers=0)


def test_invertible_mlp_from_explicit_weights():
    w = [torch.eye(3) * 2.0, torch.eye(3)]
    g = InvertibleMLP(w)
    z = torch.tensor([[1.0, -1.0, 0.5]])
    assert torch.allclose(g(z), torch.tensor([[2.0, -0.4, 1.0]]))  # 2z, leaky ReLU (0.2), identity
    assert torch.allclose(g.inverse(g(z)), z)


def test_an_extreme_pool_minimum_starts_g_over_with_a_fresh_pool():
    # with redraw_factor 1 a layer gets as many draws as the pool has; an extreme minimum then forces a new pool
    infos = [build_generator(3, seed=s, n_cond_samples=50, redraw_factor=1).info for s in range(30)]
    assert any(i.pools > 1 for i in infos), [i.pools for i in infos]
    for info in infos:
        assert max(info.layer_conditions) <= info.threshold
    again = build_generator(
        3, seed=next(s for s, i in enumerate(infos) if i.pools > 1), n_cond_samples=50, redraw_factor=1
    )
    assert again.info in infos, "the restart is deterministic"


def test_g_alone_is_as_linear_as_in_zimmermann_table_1():
    """Zimmermann et al. 2021, Table 1, row 1, column "Identity": the linear R² of z from g(z) for the sphere,
    uniform marginal, d = 10, 3-layer g, is 66.98 ± 2.79 % over 5 seeds. The papers' g gives 64.9 ± 2.3 % here;
    the loose helper-default g (quantile 0.25 of 10 000) gave 53.0 ± 2.9 %, four of the paper's sd below."""
    import statistics

    from ablate.core.experiment import generator_stats

    scores = [generator_stats(RunConfig(seed=s))["g_linear_r2"] for s in range(5)]
    assert abs(statistics.mean(scores) - 0.6698) < 2 * 0.0279, scores
