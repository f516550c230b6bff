"""Tests of the contrastive losses in ``ablate.core.losses`` against plain slow loops and closed forms (the loss
floor and the optimum of Cor. B.1: test_loss_floor.py)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ablate.core.dgp import sample_conditional, sample_hard_negatives, sample_uniform
from ablate.core.losses import (
    AnInfoNCE,
    EnsembleAnInfoNCE,
    HardNegativeAnInfoNCE,
    InfoNCE,
    TriCL,
    aninfonce_logits,
    pair_targets,
)

F64 = torch.float64


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def views(b: int, d: int, seed: int, *, unit: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(seed)
    h1, h2 = torch.randn(b, d, generator=g, dtype=F64), torch.randn(b, d, generator=g, dtype=F64)
    if unit:
        h1, h2 = F.normalize(h1, dim=-1), F.normalize(h2, dim=-1)
    return h1, h2


# --------------------------------------------------------------------------- slow references


def an_sim(a, b, lam) -> float:
    """s(a, b) = −½ (a − b)ᵀ diag(λ) (a − b), written out."""
    return -0.5 * sum(float(lam[k]) * float(a[k] - b[k]) ** 2 for k in range(len(a)))


def dot_sim(a, b, tau) -> float:
    """s(a, b) = aᵀb / τ, written out."""
    return sum(float(a[k]) * float(b[k]) for k in range(len(a))) / tau


def neg_log_softmax_first(logits: list[float]) -> float:
    """−log( e^{l_0} / Σ_j e^{l_j} ), stabilised by the max."""
    m = max(logits)
    return -(logits[0] - m) + math.log(sum(math.exp(x - m) for x in logits))


def slow_batch_loss(h1, h2, sim) -> float:
    """2B anchors; anchor i's positive is its other view, its negatives the other 2B − 2 encodings."""
    b = h1.shape[0]
    h = torch.cat([h1, h2])
    total = 0.0
    for i in range(2 * b):
        pos = (i + b) % (2 * b)
        logits = [sim(h[i], h[pos])]
        for j in range(2 * b):
            if j != i and j != pos:
                logits.append(sim(h[i], h[j]))
        assert len(logits) == 2 * b - 1
        total += neg_log_softmax_first(logits)
    return total / (2 * b)


def slow_hard_negative_loss(h1, h2, h_neg, lam, batch_negatives: bool) -> float:
    """B anchors h1[i]; candidates: positive h2[i], its M hard negatives, and (optionally) the 2B − 2 others."""
    b = h1.shape[0]
    h = torch.cat([h1, h2])
    total = 0.0
    for i in range(b):
        logits = [an_sim(h1[i], h2[i], lam)]
        for m in range(h_neg.shape[1]):
            logits.append(an_sim(h1[i], h_neg[i, m], lam))
        if batch_negatives:
            for j in range(2 * b):
                if j != i and j != i + b:
                    logits.append(an_sim(h1[i], h[j], lam))
        total += neg_log_softmax_first(logits)
    return total / b


def slow_tricl(h1, h2, s, gamma) -> float:
    """−2 E[h1ᵢᵀ S h2ᵢ] + E_{i≠j}[(h1ᵢᵀ S h2ⱼ)²] + γ ‖C − tr(C)/d I‖²_F, C = mean of h hᵀ over all 2B rows."""
    b, d = h1.shape
    pos = sum(sum(float(h1[i, k] * s[k] * h2[i, k]) for k in range(d)) for i in range(b)) / b
    neg = 0.0
    for i in range(b):
        for j in range(b):
            if i != j:
                neg += sum(float(h1[i, k] * s[k] * h2[j, k]) for k in range(d)) ** 2
    neg /= b * (b - 1)
    rows = list(torch.cat([h1, h2]))
    c = [[sum(float(r[p] * r[q]) for r in rows) / len(rows) for q in range(d)] for p in range(d)]
    tr = sum(c[p][p] for p in range(d)) / d
    dec = sum((c[p][q] - (tr if p == q else 0.0)) ** 2 for p in range(d) for q in range(d))
    return -2.0 * pos + neg + gamma * dec


# --------------------------------------------------------------------------- InfoNCE / AnInfoNCE


@pytest.mark.parametrize("tau", [0.1, 0.5, 1.0])
def test_infonce_matches_slow_loop(tau):
    h1, h2 = views(5, 4, seed=0)
    got = float(InfoNCE(tau)(h1, h2))
    want = slow_batch_loss(h1, h2, lambda a, b: dot_sim(a, b, tau))
    assert got == pytest.approx(want, rel=1e-10, abs=1e-10)


@pytest.mark.parametrize("unit", [True, False])
def test_aninfonce_matches_slow_loop(unit):
    h1, h2 = views(6, 4, seed=1, unit=unit)
    lam = torch.tensor([0.5, 2.0, 7.0, 30.0])
    loss = AnInfoNCE(4, fixed=lam).double()
    want = slow_batch_loss(h1, h2, lambda a, b: an_sim(a, b, lam))
    assert float(loss(h1, h2)) == pytest.approx(want, rel=1e-10)
    # trainable Λ̂ = softplus(θ): same formula with that Λ̂
    trainable = AnInfoNCE(4, generator=gen(3)).double()
    lam_t = F.softplus(trainable.theta.detach())
    want_t = slow_batch_loss(h1, h2, lambda a, b: an_sim(a, b, lam_t))
    assert float(trainable(h1, h2).detach()) == pytest.approx(want_t, rel=1e-10)


@pytest.mark.parametrize("tau", [0.05, 0.3, 1.0])
def test_infonce_equals_aninfonce_with_isotropic_metric(tau):
    # on unit vectors −½‖a − b‖²/τ = aᵀb/τ − 1/τ: a constant shift, which the softmax cancels
    h1, h2 = views(16, 8, seed=2)
    h1, h2 = h1.float(), h2.float()
    a = float(InfoNCE(tau)(h1, h2))
    b = float(AnInfoNCE(8, fixed=1.0 / tau)(h1, h2))
    assert abs(a - b) < 1e-5 * max(1.0, abs(a)), f"InfoNCE {a} vs AnInfoNCE(I/τ) {b} (tol 1e-5)"


@pytest.mark.parametrize(("b", "d", "tau"), [(3, 3, 0.5), (4, 6, 1.0), (5, 5, 0.2)])
def test_closed_form_on_identical_orthonormal_views(b, d, tau):
    # h1 = h2 = B orthonormal rows. Anchor i: positive = itself (aᵀb = 1), negatives = the other B − 1 rows
    # of each view (2B − 2 of them, all orthogonal: aᵀb = 0, ‖a − b‖² = 2).
    h = torch.eye(d, dtype=F64)[:b]
    info = float(InfoNCE(tau)(h, h.clone()))
    assert info == pytest.approx(-math.log(math.exp(1 / tau) / (math.exp(1 / tau) + 2 * b - 2)), rel=1e-12)
    lam = 3.0  # AnInfoNCE with Λ̂ = λI: positive logit 0, negative logit −λ
    an = float(AnInfoNCE(d, fixed=lam).double()(h, h.clone()))
    assert an == pytest.approx(math.log(1 + (2 * b - 2) * math.exp(-lam)), rel=1e-12)


def test_aninfonce_parameter_and_state_dict():
    loss = AnInfoNCE(5, generator=gen(0))
    assert isinstance(loss.theta, nn.Parameter) and loss.theta.requires_grad
    assert [p is loss.theta for p in loss.parameters()] == [True]
    assert "theta" in loss.state_dict()
    assert torch.equal(loss.lambda_hat, F.softplus(loss.theta))
    # a reload restores Λ̂
    other = AnInfoNCE(5, generator=gen(1))
    assert not torch.equal(other.lambda_hat, loss.lambda_hat)
    other.load_state_dict(loss.state_dict())
    assert torch.equal(other.lambda_hat, loss.lambda_hat)
    # θ₀ ~ N(0, init_std²): with 20 000 dims the sample std is within 2% of init_std (SE ≈ 0.5%)
    big = AnInfoNCE(20_000, init_std=0.1, generator=gen(2))
    assert abs(float(big.theta.detach().std()) - 0.1) < 0.002
    assert abs(float(big.theta.detach().mean())) < 0.004  # SE 0.1/sqrt(20000) ≈ 7e-4


def test_aninfonce_fixed_has_no_trainable_parameter():
    loss = AnInfoNCE(4, fixed=[1.0, 2.0, 3.0, 4.0])
    assert list(loss.parameters()) == []
    assert loss.theta is None
    assert torch.equal(loss.state_dict()["fixed_lambda"], torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert torch.equal(AnInfoNCE(3, fixed=2.5).lambda_hat, torch.full((3,), 2.5))
    h1, h2 = views(4, 4, seed=0)
    h1 = h1.float().requires_grad_(True)
    loss(h1, h2.float()).backward()
    assert h1.grad is not None and torch.isfinite(h1.grad).all()
    with pytest.raises(ValueError):
        AnInfoNCE(3, fixed=[1.0, 0.0, 1.0])
    with pytest.raises(ValueError):
        AnInfoNCE(3, fixed=[1.0, 1.0])


def test_losses_reject_mismatched_views():
    h1, h2 = views(4, 3, seed=0)
    with pytest.raises(ValueError, match="views"):
        AnInfoNCE(3, fixed=1.0).double()(h1, h2[:3])
    with pytest.raises(ValueError, match="views"):
        InfoNCE()(h1, h2[:, :2])
    with pytest.raises(ValueError, match="h_neg"):
        HardNegativeAnInfoNCE(3, fixed=1.0).double()(h1, h2, torch.zeros(4, 2, 5, dtype=F64))


# --------------------------------------------------------------------------- hard negatives


@pytest.mark.parametrize("batch_negatives", [False, True])
def test_hard_negative_aninfonce_matches_slow_loop(batch_negatives):
    b, m, d = 5, 3, 4
    h1, h2 = views(b, d, seed=4)
    h_neg = F.normalize(torch.randn(b, m, d, generator=gen(5), dtype=F64), dim=-1)
    lam = torch.tensor([1.0, 4.0, 9.0, 0.5])
    loss = HardNegativeAnInfoNCE(d, fixed=lam, batch_negatives=batch_negatives).double()
    want = slow_hard_negative_loss(h1, h2, h_neg, lam, batch_negatives)
    assert float(loss(h1, h2, h_neg)) == pytest.approx(want, rel=1e-10)
    # trainable variant uses softplus(θ)
    tr = HardNegativeAnInfoNCE(d, batch_negatives=batch_negatives, generator=gen(6)).double()
    lam_t = F.softplus(tr.theta.detach())
    assert float(tr(h1, h2, h_neg).detach()) == pytest.approx(
        slow_hard_negative_loss(h1, h2, h_neg, lam_t, batch_negatives)
    )


def test_batch_loss_passes_hard_negatives_and_falls_back_to_plain_aninfonce_without_them():
    # hard-negative form (Cor. B.1): batch_loss forwards the negatives; without them it is plain AnInfoNCE
    d = 6
    g = gen(1)
    z = sample_uniform(300, d, generator=g)
    z_pos = sample_conditional(z, 150.0, generator=g)
    z_neg = sample_hard_negatives(z, 100.0, 4, generator=g)
    loss = HardNegativeAnInfoNCE(d, generator=gen(2))
    with torch.no_grad():
        with_negatives = float(loss.batch_loss([(z, z_pos)], z_neg))
        assert with_negatives == pytest.approx(float(loss(z, z_pos, z_neg)), rel=1e-6)
        plain = AnInfoNCE(d, fixed=loss.lambda_hat)
        assert float(loss.batch_loss([(z, z_pos)], None)) == pytest.approx(float(plain(z, z_pos)), rel=1e-6)
        assert float(loss.batch_loss([(z, z_pos)], None)) != pytest.approx(with_negatives, rel=1e-3)


# --------------------------------------------------------------------------- ensemble / TriCL


def test_ensemble_is_sum_of_members():
    k, b, d = 3, 6, 4
    ens = EnsembleAnInfoNCE(d, k, generator=gen(0)).double()
    pairs = [views(b, d, seed=10 + i) for i in range(k)]
    total = float(ens(pairs).detach())
    parts = [float(member(h1, h2).detach()) for member, (h1, h2) in zip(ens.members, pairs)]
    assert total == pytest.approx(sum(parts), rel=1e-12)
    # and each member is the plain slow loop with its own Λ̂ⁱ
    for member, (h1, h2), part in zip(ens.members, pairs, parts):
        lam = member.lambda_hat.detach()
        assert part == pytest.approx(slow_batch_loss(h1, h2, lambda a, c, lam=lam: an_sim(a, c, lam)), rel=1e-10)
    assert ens.lambda_hat.shape == (k, d)
    assert len(list(ens.parameters())) == k
    assert not torch.equal(ens.members[0].theta, ens.members[1].theta), "members need their own Λ̂ⁱ"
    with pytest.raises(ValueError):
        ens(pairs[:2])


@pytest.mark.parametrize("gamma", [0.0, 1.0, 3.5])
def test_tricl_matches_slow_formula(gamma):
    b, d = 5, 3
    h1, h2 = views(b, d, seed=7)
    loss = TriCL(d, decorrelation=gamma, generator=gen(8)).double()
    s = F.softplus(loss.theta.detach())
    assert torch.equal(loss.lambda_hat.detach(), s)
    assert float(loss(h1, h2).detach()) == pytest.approx(slow_tricl(h1, h2, s, gamma), rel=1e-10)


def test_tricl_decorrelation_vanishes_for_isotropic_batch():
    # rows ±e_k in both views: C = I/d exactly, so the decorrelation term is zero and γ does not matter
    d = 3
    e = torch.eye(d, dtype=F64)
    h = torch.cat([e, -e])
    a = TriCL(d, decorrelation=0.0, generator=gen(0)).double()
    b = TriCL(d, decorrelation=10.0, generator=gen(0)).double()
    assert float(a(h, h.clone()).detach()) == pytest.approx(float(b(h, h.clone()).detach()), rel=1e-12)


# --------------------------------------------------------------------------- gradients


def _loss_cases():
    b, d, m = 6, 4, 3
    return [
        ("InfoNCE", InfoNCE(0.2), False),
        ("AnInfoNCE", AnInfoNCE(d, generator=gen(0)), False),
        ("HardNegativeAnInfoNCE", HardNegativeAnInfoNCE(d, generator=gen(1)), True),
        ("HardNegativeAnInfoNCE-no-batch", HardNegativeAnInfoNCE(d, batch_negatives=False, generator=gen(2)), True),
        ("TriCL", TriCL(d, generator=gen(3)), False),
    ], (b, d, m)


@pytest.mark.parametrize("identical", [False, True])
def test_all_losses_have_finite_gradients(identical):
    cases, (b, d, m) = _loss_cases()
    for name, loss, hard in cases:
        g = gen(11)
        h1 = F.normalize(torch.randn(b, d, generator=g), dim=-1)
        h2 = h1.clone() if identical else F.normalize(torch.randn(b, d, generator=g), dim=-1)
        h1.requires_grad_(True)
        h2.requires_grad_(True)
        args = [h1, h2]
        if hard:
            h_neg = F.normalize(torch.randn(b, m, d, generator=g), dim=-1).requires_grad_(True)
            args.append(h_neg)
        out = loss(*args)
        assert out.ndim == 0 and torch.isfinite(out), name
        out.backward()
        for t in args:
            assert t.grad is not None and torch.isfinite(t.grad).all(), f"{name}: non-finite input gradient"
        for p in loss.parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), f"{name}: non-finite Λ̂/θ gradient"
            assert p.grad.abs().sum() > 0, f"{name}: Λ̂/θ gets no gradient"
    ens = EnsembleAnInfoNCE(d, 2, generator=gen(4))
    pairs = [tuple(F.normalize(torch.randn(b, d, generator=gen(20 + i)), dim=-1) for _ in range(2)) for i in range(2)]
    ens(pairs).backward()
    for p in ens.parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


def test_aninfonce_gradients_match_finite_differences():
    # autograd vs central differences in float64, w.r.t. the encodings and θ (through softplus)
    loss = AnInfoNCE(3, generator=gen(0)).double()
    h1, h2 = views(4, 3, seed=9)
    h1.requires_grad_(True)

    def f(x, theta):
        loss.theta.data.copy_(theta)
        return loss(x, h2)

    theta0 = loss.theta.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: f(x, theta0.detach()), (h1,), eps=1e-6, atol=1e-6)
    out = loss(h1, h2)
    (g_theta,) = torch.autograd.grad(out, loss.theta)
    eps = 1e-6
    for k in range(3):
        e = torch.zeros(3, dtype=F64)
        e[k] = eps
        with torch.no_grad():
            num = (f(h1, theta0.detach() + e) - f(h1, theta0.detach() - e)) / (2 * eps)
        assert float(num) == pytest.approx(float(g_theta[k]), abs=1e-7), f"dL/dθ_{k}"


# ---------------------------------------------------------------- the row-blocked loss with fused gradient
@pytest.mark.parametrize("block_rows", [1, 3, 7, 16, None])
@pytest.mark.parametrize("column_coef", [0.5, 0.0])
def test_pair_cross_entropy_matches_autograd_on_full_logits(block_rows, column_coef):
    from ablate.core.losses.pair import pair_cross_entropy

    g = torch.Generator().manual_seed(5)
    b, d = 8, 5
    h = torch.nn.functional.normalize(torch.randn(2 * b, d, generator=g, dtype=torch.float64), dim=1)
    theta = torch.randn(d, generator=g, dtype=torch.float64)
    h_ref, theta_ref = h.clone().requires_grad_(), theta.clone().requires_grad_()
    w_ref = torch.nn.functional.softplus(theta_ref) * 3
    if column_coef:
        ref = torch.nn.functional.cross_entropy(aninfonce_logits(h_ref, w_ref), pair_targets(b, h.device))
    else:  # InfoNCE's form: a per-dimension temperature
        logits = (h_ref * w_ref) @ h_ref.T
        ref = torch.nn.functional.cross_entropy(logits.fill_diagonal_(float("-inf")), pair_targets(b, h.device))
    (ref * 1.7).backward()
    h_new, theta_new = h.clone().requires_grad_(), theta.clone().requires_grad_()
    out = pair_cross_entropy(h_new, torch.nn.functional.softplus(theta_new) * 3, column_coef, block_rows=block_rows)
    (out * 1.7).backward()
    assert out.item() == pytest.approx(ref.item(), rel=1e-12, abs=1e-12)
    torch.testing.assert_close(h_new.grad, h_ref.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(theta_new.grad, theta_ref.grad, rtol=1e-10, atol=1e-12)


def test_losses_take_the_fused_path_only_with_gradients_and_agree_with_the_plain_one():
    g = torch.Generator().manual_seed(9)
    h1, h2 = (
        torch.nn.functional.normalize(torch.randn(6, 4, generator=g, dtype=torch.float64), dim=1) for _ in range(2)
    )
    for loss in (AnInfoNCE(4, generator=torch.Generator().manual_seed(1)).double(), InfoNCE(0.3)):
        with torch.no_grad():
            plain = loss(h1, h2)
        a, b = h1.clone().requires_grad_(), h2.clone().requires_grad_()
        fused = loss(a, b)
        fused.backward()
        assert fused.item() == pytest.approx(plain.item(), rel=1e-12)
        assert a.grad is not None and torch.isfinite(a.grad).all()


def test_pair_cross_entropy_is_stable_for_large_concentrations():
    from ablate.core.losses.pair import pair_cross_entropy

    g = torch.Generator().manual_seed(2)
    h = torch.nn.functional.normalize(torch.randn(64, 10, generator=g), dim=1).requires_grad_()
    loss = pair_cross_entropy(h, torch.full((10,), 5000.0), 0.5)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(h.grad).all()


@pytest.mark.parametrize("column_coef", [0.5, 0.0])
def test_pair_cross_entropy_with_sharp_logits_matches_a_float64_reference(column_coef):
    """Most shifted logits below the CPU exp clamp (exp_floor): loss and gradients in fp32 still equal the exact
    fp64 autograd values to fp32 precision, and the excluded diagonal gets no weight."""
    from ablate.core.losses.pair import exp_floor, pair_cross_entropy

    g = torch.Generator().manual_seed(11)
    b, d = 64, 6
    h = torch.nn.functional.normalize(torch.randn(2 * b, d, generator=g), dim=1)
    h[b:] = torch.nn.functional.normalize(h[:b] + 0.05 * torch.randn(b, d, generator=g), dim=1)
    w = torch.full((d,), 400.0)
    h64, w64 = h.double().requires_grad_(), w.double().requires_grad_()
    if column_coef:
        logits = aninfonce_logits(h64, w64)
    else:
        logits = ((h64 * w64) @ h64.T).fill_diagonal_(float("-inf"))
    shifted = logits - logits.amax(1, keepdim=True)
    below = (shifted < exp_floor(torch.float32)).sum() / (2 * b * (2 * b - 1))
    assert below > 0.5  # the clamp is in play for most terms
    ref = torch.nn.functional.cross_entropy(logits, pair_targets(b, h.device))
    ref.backward()
    h32, w32 = h.clone().requires_grad_(), w.clone().requires_grad_()
    out = pair_cross_entropy(h32, w32, column_coef)
    out.backward()
    assert out.item() == pytest.approx(ref.item(), rel=1e-5, abs=1e-6)
    torch.testing.assert_close(h32.grad.double(), h64.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(w32.grad.double(), w64.grad, rtol=1e-4, atol=1e-7)


# ------------------------------------------------------------- InfoNCE, the reference code's batch layout


def _reference_layout_slow(h1, h2, tau):
    """cl-ica's SimCLRLoss as a loop: anchor i, negatives z3 = roll(h1, 1) (every h1ₖ, the anchor included), the
    positive appended; loss_i = −h1ᵢ·h2ᵢ/τ + log Σ exp(logits)."""
    h3 = torch.roll(h1, 1, 0)
    total = 0.0
    for i in range(h1.shape[0]):
        logits = [float(h1[i] @ h3[k]) / tau for k in range(h1.shape[0])] + [float(h1[i] @ h2[i]) / tau]
        total += -float(h1[i] @ h2[i]) / tau + math.log(sum(math.exp(v) for v in logits))
    return total / h1.shape[0]


@pytest.mark.parametrize("tau", [1.0, 0.2])
def test_infonce_reference_layout_matches_a_slow_loop(tau):
    from ablate.core.losses.infonce import InfoNCE

    g = torch.Generator().manual_seed(3)
    h1 = torch.nn.functional.normalize(torch.randn(12, 5, generator=g, dtype=torch.float64), dim=-1)
    h2 = torch.nn.functional.normalize(torch.randn(12, 5, generator=g, dtype=torch.float64), dim=-1)
    got = float(InfoNCE(tau, "reference")(h1, h2))
    assert got == pytest.approx(_reference_layout_slow(h1, h2, tau), rel=1e-12)
    assert got != pytest.approx(float(InfoNCE(tau)(h1, h2)), rel=1e-3), "the layouts must differ"


def test_infonce_reference_layout_closed_form():
    # identical views and orthonormal anchors: each row holds e^{1/τ} twice (self pair, positive) and B − 1 ones
    from ablate.core.losses.infonce import InfoNCE

    b, tau = 4, 0.5
    h = torch.eye(b, dtype=torch.float64)
    expected = -1 / tau + math.log(2 * math.exp(1 / tau) + (b - 1))
    assert float(InfoNCE(tau, "reference")(h, h)) == pytest.approx(expected, rel=1e-12)


def test_infonce_layout_is_checked():
    from ablate.config import ConfigError, RunConfig
    from ablate.core.losses.infonce import InfoNCE

    with pytest.raises(ValueError, match="layout"):
        InfoNCE(1.0, "sideways")
    with pytest.raises(ConfigError, match="infonce_layout"):
        RunConfig.build({"loss": "aninfonce", "infonce_layout": "reference"})
    assert RunConfig.build({"loss": "infonce", "infonce_layout": "reference"}).infonce_layout == "reference"


def test_the_fused_loss_is_used_on_the_cpu_and_the_plain_one_on_accelerators():
    from ablate.core.losses.base import GPU_PLAIN_MAX_LOGITS, use_fused

    cpu = torch.zeros(8, 3, requires_grad=True)
    assert use_fused(cpu)
    with torch.no_grad():
        assert not use_fused(cpu), "evaluation never needs the fused gradient"
    # a tensor off the CPU ('meta' stands in for cuda here): plain logits unless they would exceed the cap
    assert not use_fused(torch.empty(16384, 10, device="meta", requires_grad=True))
    rows = int(GPU_PLAIN_MAX_LOGITS**0.5) + 1
    assert use_fused(torch.empty(rows, 10, device="meta", requires_grad=True))
