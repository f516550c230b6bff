"""Statistical tests of the latent samplers in ``ablate.core.dgp``.

Every test uses a fixed ``torch.Generator`` seed, so it is deterministic; tolerances are stated next to
each assertion and are a few standard errors of the estimate at the sample size used (so a wrong law,
not Monte-Carlo noise, is what makes them fail).
"""

from __future__ import annotations

import math
import signal

import pytest
import torch
from scipy import stats
from scipy.special import ive

from ablate.core.dgp import (
    LowAcceptanceError,
    sample_conditional,
    sample_hard_negatives,
    sample_uniform,
    sample_vmf,
)

F64 = torch.float64
#: Two-sample tolerance in standard errors (per compared quantity; ~7e-6 two-sided false-alarm rate each).
K_SE = 4.5


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def slow_conditional(z: torch.Tensor, concentration, threshold, generator: torch.Generator) -> torch.Tensor:
    """Plain reference of the positive law: one row at a time, eps ~ N(0, diag(1/Λ)), redraw while
    | ||z + eps|| - 1 | >= threshold (never when threshold is None), then normalise."""
    n, d = z.shape
    std = 1.0 / torch.as_tensor(concentration, dtype=F64).expand(d).sqrt()
    out = torch.empty(n, d, dtype=F64)
    for i in range(n):
        while True:
            x = z[i].to(F64) + torch.randn(d, generator=generator, dtype=F64) * std
            norm = float(x.norm())
            if threshold is None or abs(norm - 1.0) < threshold:
                break
        out[i] = x / norm
    return out


def spread_stats(z: torch.Tensor, z_pos: torch.Tensor) -> torch.Tensor:
    """Per-row statistics whose means describe the conditional: (z⁺ − z)_j² for every j, and zᵀz⁺.

    Averaged over uniform anchors, E[z⁺ − z] = 0 by symmetry, so the mean of (z⁺ − z)_j² is the
    per-dimension variance of z⁺ − z.
    """
    diff = (z_pos - z).to(F64)
    cos = (z.to(F64) * z_pos.to(F64)).sum(-1, keepdim=True)
    return torch.cat([diff**2, cos], dim=1)


def two_sample_z(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """z-statistic of the difference of column means of two independent samples (rows = draws)."""
    se = (a.var(0) / a.shape[0] + b.var(0) / b.shape[0]).sqrt()
    return (a.mean(0) - b.mean(0)) / se


# --------------------------------------------------------------------------- uniform marginal


@pytest.mark.parametrize("d", [3, 10])
def test_uniform_moments_and_marginal(d):
    n = 20_000
    x = sample_uniform(n, d, generator=gen(0), dtype=F64)
    assert x.shape == (n, d)
    assert torch.allclose(x.norm(dim=1), torch.ones(n, dtype=F64), atol=1e-12), "norms must be 1 (to 1e-12)"
    # mean: each coordinate has variance 1/d, so the sample mean has SE sqrt(1/(d n)); allow 5 SE.
    se_mean = math.sqrt(1.0 / (d * n))
    assert x.mean(0).abs().max() < 5 * se_mean, f"mean {x.mean(0)} not within 5 SE ({5 * se_mean:.2g}) of 0"
    # second moments E[x xᵀ] = I/d. Var(x_i²) = 3/(d(d+2)) − 1/d², Var(x_i x_j) = 1/(d(d+2)); allow 5 SE.
    cov = x.T @ x / n
    se_diag = math.sqrt((3.0 / (d * (d + 2)) - 1.0 / d**2) / n)
    se_off = math.sqrt(1.0 / (d * (d + 2)) / n)
    eye = torch.eye(d, dtype=F64)
    diag_err = (cov.diagonal() - 1.0 / d).abs().max()
    off_err = (cov - eye * cov.diagonal()).abs().max()
    assert diag_err < 5 * se_diag, f"diag of E[xxᵀ] off from 1/d by {diag_err:.3g} (tol {5 * se_diag:.3g})"
    assert off_err < 5 * se_off, f"off-diag of E[xxᵀ] off from 0 by {off_err:.3g} (tol {5 * se_off:.3g})"
    # full marginal: (x_1 + 1)/2 ~ Beta((d−1)/2, (d−1)/2) on the uniform sphere (d=3: x_1 uniform on [−1, 1]).
    a = (d - 1) / 2.0
    p = stats.kstest(((x[:, 0] + 1) / 2).numpy(), stats.beta(a, a).cdf).pvalue
    assert p > 1e-3, f"KS test rejects the Beta({a}, {a}) marginal of x_1 (p={p:.2g}, tol p > 1e-3)"


def test_uniform_is_reproducible_from_generator():
    a = sample_uniform(100, 7, generator=gen(3))
    b = sample_uniform(100, 7, generator=gen(3))
    c = sample_uniform(100, 7, generator=gen(4))
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)


# --------------------------------------------------------------------------- conditional (positives)


@pytest.mark.parametrize(
    ("concentration", "threshold", "n"),
    [
        ([5.0] * 5 + [25.0] * 5, 0.1, 6000),  # d=10, acceptance ~9%: rejection reshapes the law a lot
        ([5.0] * 5 + [25.0] * 5, None, 6000),
        ([50.0] * 3 + [200.0] * 3, 0.1, 6000),  # d=6, acceptance ~60%
        ([50.0] * 3 + [200.0] * 3, None, 6000),
    ],
)
def test_conditional_matches_slow_reference(concentration, threshold, n):
    d = len(concentration)
    z = sample_uniform(n, d, generator=gen(0), dtype=F64)
    fast = sample_conditional(z, concentration, threshold=threshold, generator=gen(1))
    slow = slow_conditional(z, concentration, threshold, gen(2))
    assert fast.shape == (n, d) and fast.dtype == F64
    assert torch.allclose(fast.norm(dim=1), torch.ones(n, dtype=F64), atol=1e-12), "outputs must be unit norm"
    s_fast, s_slow = spread_stats(z, fast), spread_stats(z, slow)
    zs = two_sample_z(s_fast, s_slow)
    # per-dimension variance of z⁺ − z (d columns) and the mean cosine zᵀz⁺ must agree within K_SE SE
    assert zs.abs().max() < K_SE, f"fast vs slow reference differ: z-scores {zs.numpy().round(2)} (tol {K_SE})"
    # the anisotropy is really there: the low-Λ block spreads more than the high-Λ block, by ~Λ ratio
    var = s_fast[:, :d].mean(0)
    lam = torch.tensor(concentration, dtype=F64)
    lo, hi = var[lam == lam.min()].mean(), var[lam == lam.max()].mean()
    ratio = float(lam.max() / lam.min())
    assert 0.6 * ratio < lo / hi < 1.2 * ratio, f"block variance ratio {lo / hi:.2f} vs Λ ratio {ratio}"


def test_conditional_threshold_changes_the_law_detectably():
    """Power check of the comparison above: rejected and unrejected laws are told apart.

    At Λ = 5/25 in d=10, E‖z+ε‖² = 1 + Σ1/Λ = 2.2, so accepted draws (‖z+ε‖ ≈ 1) need zᵀε ≈ −‖ε‖²/2:
    rejection *widens* the spread of z⁺ − z (measured: E‖z⁺ − z‖² ≈ 0.73 vs 0.64 without it).
    """
    concentration = [5.0] * 5 + [25.0] * 5
    n = 6000
    z = sample_uniform(n, 10, generator=gen(0), dtype=F64)
    fast_rej = sample_conditional(z, concentration, threshold=0.1, generator=gen(1))
    fast_none = sample_conditional(z, concentration, threshold=None, generator=gen(1))
    slow_none = slow_conditional(z, concentration, None, gen(2))
    msd = [((x - z) ** 2).sum(1, keepdim=True) for x in (fast_rej, fast_none, slow_none)]
    z_rej_vs_none = float(two_sample_z(msd[0], msd[2]))
    z_none_vs_none = float(two_sample_z(msd[1], msd[2]))
    assert z_rej_vs_none > 8, f"threshold 0.1 should widen E‖z⁺−z‖² by many SE, z={z_rej_vs_none:.1f} (tol > 8)"
    assert abs(z_none_vs_none) < K_SE, f"unrejected fast vs slow: z={z_none_vs_none:.2f} (tol {K_SE})"


def _normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


@pytest.mark.parametrize("threshold", [0.3, None])
def test_conditional_rejection_rule_exact_in_one_dimension(threshold):
    """d = 1 gives a closed form: z = ±1, x = z + ε, z⁺ = sign(x). A flip (z⁺ = −z) needs x on the far side.

    For z = 1, σ = Λ^{-1/2}: accepted iff |x| ∈ (1 − t, 1 + t), i.e. ε ∈ (−t, t) (no flip) or
    ε ∈ (−2 − t, −2 + t) (flip), so P(flip) = P_far / (P_near + P_far); without rejection P(flip) = Φ(−1/σ).
    """
    n, lam = 20_000, 0.25
    sigma = lam**-0.5
    z = torch.where(torch.rand(n, 1, generator=gen(0), dtype=F64) < 0.5, -1.0, 1.0).to(F64)
    out = sample_conditional(z, lam, threshold=threshold, generator=gen(1))
    assert torch.equal(out.abs(), torch.ones_like(out)), "in d=1 every output is ±1"
    flip = float((out != z).double().mean())
    if threshold is None:
        expected = _normal_cdf(-1.0 / sigma)  # 0.3085
    else:
        t = threshold
        near = _normal_cdf(t / sigma) - _normal_cdf(-t / sigma)
        far = _normal_cdf((-2.0 + t) / sigma) - _normal_cdf((-2.0 - t) / sigma)
        expected = far / (near + far)  # 0.3785
    se = math.sqrt(expected * (1 - expected) / n)  # binomial SE ≈ 0.0034
    assert abs(flip - expected) < 5 * se, f"P(flip) {flip:.4f} vs exact {expected:.4f} (tol 5 SE = {5 * se:.4f})"


@pytest.mark.parametrize("threshold", [0.1, 0.3, None])
def test_conditional_rejection_bound_is_exact(threshold):
    """Make the unnormalised norm observable: d=2, z = e₂, Λ = (1, 1e12), so ε ≈ (ε₁, 0) and
    z⁺ ∝ (ε₁, 1): r = z⁺₁ / z⁺₂ recovers ε₁ and ‖z + ε‖ = sqrt(1 + r²) (to ~1e-6, from ε₂ ~ N(0, 1e-12)).

    Accepted draws must have sqrt(1 + r²) − 1 < t, and with 8000 draws the largest |r| must come within
    0.01 of the bound sqrt((1 + t)² − 1) (ε₁ ~ N(0, 1) has density ≈ 0.36–0.4 there, so the chance that no
    draw lands in the last 0.01 is < 1e-10). Rejecting on ‖z+ε‖² or on 2t moves the bound well beyond 0.01.
    Accepted r is N(0, 1) truncated to that bound (KS test); without a threshold, plain N(0, 1).
    """
    n = 8000
    z = torch.zeros(n, 2, dtype=F64)
    z[:, 1] = 1.0
    out = sample_conditional(z, [1.0, 1e12], threshold=threshold, generator=gen(5))
    assert (out[:, 1] > 0).all()
    r = (out[:, 0] / out[:, 1]).numpy()
    if threshold is None:
        dist = stats.norm()
    else:
        bound = math.sqrt((1.0 + threshold) ** 2 - 1.0)
        norm_minus_one = (1.0 + out[:, 0] ** 2 / out[:, 1] ** 2).sqrt() - 1.0
        assert float(norm_minus_one.max()) < threshold + 1e-5, "a draw with |‖z+ε‖ − 1| ≥ t was accepted"
        assert float(abs(r).max()) > bound - 0.01, f"max |ε₁| = {abs(r).max():.4f}, bound {bound:.4f} (tol 0.01)"
        dist = stats.truncnorm(-bound, bound)
    p = stats.kstest(r, dist.cdf).pvalue
    assert p > 1e-3, f"accepted ε₁ is not {'N(0,1)' if threshold is None else 'truncated N(0,1)'} (KS p={p:.2g})"


@pytest.mark.parametrize(("d", "lam", "tiny", "n"), [(3, 2.0, 0.01, 20_000), (10, 10.0, 0.02, 10_000)])
def test_conditional_tiny_threshold_gives_vmf(d, lam, tiny, n):
    """Isotropic N(z, I/Λ) conditioned on ‖z + ε‖ = 1 is exactly vMF(z, κ = Λ): the density on the sphere
    is ∝ exp(−Λ‖x − z‖²/2) = exp(Λ zᵀx − Λ). So with t ≤ 0.02, E[zᵀz⁺] = A_d(Λ) up to O(t²) (≪ SE);
    without rejection the projected normal is much more concentrated (measured > 30 SE away)."""
    z = sample_uniform(n, d, generator=gen(0), dtype=F64)
    a_d = ive(d / 2, lam) / ive(d / 2 - 1, lam)
    for threshold, should_match in ((tiny, True), (None, False)):
        cos = (sample_conditional(z, lam, threshold=threshold, generator=gen(1)) * z).sum(1)
        zscore = (float(cos.mean()) - a_d) / (float(cos.std()) / math.sqrt(n))
        if should_match:
            assert abs(zscore) < 5, f"E[zᵀz⁺]={float(cos.mean()):.4f} vs A_d(Λ)={a_d:.4f}: z={zscore:.1f} (tol 5)"
        else:
            assert zscore > 20, f"unrejected law should be far from vMF(Λ), z={zscore:.1f} (tol > 20)"


def test_conditional_is_reproducible_and_follows_dtype():
    z = sample_uniform(500, 6, generator=gen(0))
    a = sample_conditional(z, [50.0] * 3 + [200.0] * 3, generator=gen(1))
    b = sample_conditional(z, [50.0] * 3 + [200.0] * 3, generator=gen(1))
    assert torch.equal(a, b)
    assert a.dtype == torch.float32
    assert sample_conditional(z.double(), 50.0, generator=gen(1)).dtype == F64


def test_conditional_rejects_bad_arguments():
    z = sample_uniform(10, 4, generator=gen(0))
    with pytest.raises(ValueError, match="> 0"):
        sample_conditional(z, [1.0, 2.0, 0.0, 3.0])
    with pytest.raises(ValueError, match="length d=4"):
        sample_conditional(z, [1.0, 2.0])
    with pytest.raises(ValueError, match="threshold"):
        sample_conditional(z, 10.0, threshold=0.0)


class _Hang(Exception):
    pass


def _alarm(*_):
    raise _Hang("sampler still running after 60 s: it spins instead of failing")


def test_low_acceptance_raises_instead_of_hanging():
    # ‖z+ε‖² ≈ 1 + d/Λ = 129 at Λ=0.5, d=64, so |‖z+ε‖ − 1| < 0.1 essentially never happens.
    z = sample_uniform(100, 64, generator=gen(0))
    old = signal.signal(signal.SIGALRM, _alarm)  # hang guard (turns a spin into a failure), not a timing check
    signal.alarm(60)
    try:
        with pytest.raises(LowAcceptanceError) as info:
            sample_conditional(z, 0.5, threshold=0.1, generator=gen(1))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    msg = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "Λ=0.5" in msg and "d=64" in msg and "acceptance" in msg, msg


def test_min_acceptance_is_honoured():
    # Λ = 5/25, d=10 accepts ~9% of draws: fine by default, an error when 50% is demanded.
    z = sample_uniform(3000, 10, generator=gen(0))
    lam = [5.0] * 5 + [25.0] * 5
    assert sample_conditional(z, lam, generator=gen(1)).shape == (3000, 10)
    with pytest.raises(LowAcceptanceError, match=r"Λ=5\.\.25, d=10"):
        sample_conditional(z, lam, generator=gen(1), min_acceptance=0.5)


# --------------------------------------------------------------------------- hard negatives


def test_hard_negatives_shape_and_law():
    n, m, d = 1000, 8, 20
    lam = [100.0] * 10 + [400.0] * 10
    z = sample_uniform(n, d, generator=gen(0), dtype=F64)
    neg = sample_hard_negatives(z, lam, m, generator=gen(1))
    assert neg.shape == (n, m, d)
    assert torch.allclose(neg.norm(dim=-1), torch.ones(n, m, dtype=F64), atol=1e-12)
    assert not torch.allclose(neg[:, 0], neg[:, 1]), "the M negatives of an anchor must be separate draws"
    # each negative ~ conditional(z, Λ⁻): compare with the conditional sampler on repeated anchors
    rep = z.repeat_interleave(m, dim=0)
    ref = sample_conditional(rep, lam, generator=gen(2))
    zs = two_sample_z(spread_stats(rep, neg.reshape(n * m, d)), spread_stats(rep, ref))
    assert zs.abs().max() < K_SE, f"hard negatives vs conditional: z-scores {zs.numpy().round(2)} (tol {K_SE})"
    # and negative slot m is not special: every slot has the same spread (two-sample z of slot 0 vs the rest)
    msd = ((neg - z[:, None]) ** 2).sum(-1)
    z_slot = float(two_sample_z(msd[:, :1], msd[:, 1:].reshape(-1, 1)))
    assert abs(z_slot) < K_SE, f"slot 0 spread differs from the others, z={z_slot:.2f}"


def test_hard_negative_spread_scales_like_inverse_concentration():
    # Small-noise limit: E‖z⁻ − z‖² ≈ (d − 1)/Λ⁻, so Λ⁻ = 100 vs 400 gives a ratio of 4. The projection's
    # second-order term (≈ −¾(d+1)/Λ⁻ relative) and the 0.1 threshold move it by ~5% (measured ≈ 3.83);
    # using std for variance (ratio 2) or Λ for the variance (ratio 1/4) falls far outside [3.4, 4.4].
    n, m, d = 2000, 16, 20
    z = sample_uniform(n, d, generator=gen(0))
    msd = {}
    for lam in (100.0, 400.0):
        neg = sample_hard_negatives(z, lam, m, generator=gen(1))
        msd[lam] = float(((neg - z[:, None]) ** 2).sum(-1).mean())
    ratio = msd[100.0] / msd[400.0]
    assert 3.4 < ratio < 4.4, f"E‖z⁻−z‖² ratio Λ⁻=100 vs 400 is {ratio:.3f} (tol [3.4, 4.4])"
    assert abs(msd[400.0] - (d - 1) / 400.0) < 0.1 * (d - 1) / 400.0, f"{msd[400.0]} vs (d−1)/Λ⁻ (tol 10%)"


def test_hard_negatives_reject_zero_count():
    with pytest.raises(ValueError, match="n_negatives"):
        sample_hard_negatives(sample_uniform(4, 3, generator=gen(0)), 10.0, 0)


# --------------------------------------------------------------------------- von Mises–Fisher


@pytest.mark.parametrize("d", [2, 3, 10])
@pytest.mark.parametrize("kappa", [1.0, 10.0, 100.0])
def test_vmf_mean_resultant_length(d, kappa):
    n = 10_000
    mu = sample_uniform(n, d, generator=gen(0), dtype=F64)
    x = sample_vmf(mu, kappa, generator=gen(1))
    assert x.shape == (n, d)
    assert torch.allclose(x.norm(dim=1), torch.ones(n, dtype=F64), atol=1e-10)
    w = (mu * x).sum(1)
    a_d = ive(d / 2, kappa) / ive(d / 2 - 1, kappa)  # A_d(κ) = I_{d/2}(κ) / I_{d/2−1}(κ)
    se = float(w.std()) / math.sqrt(n)
    assert abs(float(w.mean()) - a_d) < 5 * se, f"E[μᵀx]={float(w.mean()):.5f} vs A_d(κ)={a_d:.5f} (tol 5 SE)"
    # second moment: E[xxᵀ] = (A/κ) I + (1 − d A/κ) μμᵀ, so E[(μᵀx)²] = 1 − (d − 1) A/κ
    w2 = w**2
    se2 = float(w2.std()) / math.sqrt(n)
    expected2 = 1.0 - (d - 1) * a_d / kappa
    assert abs(float(w2.mean()) - expected2) < 5 * se2, f"E[(μᵀx)²]={float(w2.mean()):.5f} vs {expected2:.5f}"


def test_vmf_mean_vector_points_along_mu():
    # one fixed μ: E[x] = A_d(κ) μ, which also checks the tangent part averages out
    d, n, kappa = 5, 20_000, 3.0
    mu = torch.nn.functional.normalize(torch.arange(1.0, d + 1, dtype=F64), dim=0)
    x = sample_vmf(mu.expand(n, d).clone(), kappa, generator=gen(0))
    a_d = ive(d / 2, kappa) / ive(d / 2 - 1, kappa)
    se = x.std(0) / math.sqrt(n)
    err = (x.mean(0) - a_d * mu).abs()
    assert (err < 5 * se).all(), f"E[x] − Aμ = {err.numpy()} (tol 5 SE = {(5 * se).numpy()})"


def test_vmf_rejects_nonpositive_kappa():
    with pytest.raises(ValueError, match="kappa"):
        sample_vmf(sample_uniform(3, 3, generator=gen(0)), 0.0)
