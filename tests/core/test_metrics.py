"""Tests of the identifiability metrics in ``ablate.core.metrics``."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from ablate.core.dgp import sample_uniform
from ablate.core.metrics import (
    iterations_to_target,
    lambda_recovery,
    linear_r2,
    matched_lambda,
    mcc,
    r2_per_block,
    similarity_overlap,
)

F64 = torch.float64


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def orthogonal(d: int, seed: int) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=gen(seed), dtype=F64))
    return q


# --------------------------------------------------------------------------- linear R²


def test_linear_r2_is_one_for_an_orthogonal_map():
    d = 10
    q = orthogonal(d, 0)
    z_fit, z_eval = sample_uniform(2000, d, generator=gen(1)), sample_uniform(2000, d, generator=gen(2))
    out = linear_r2(z_fit @ q.T.float(), z_fit, z_eval @ q.T.float(), z_eval)
    assert abs(out["r2"] - 1.0) < 1e-6, f"R² = {out['r2']} for an orthogonal map (tol 1e-6)"
    assert len(out["r2_per_dim"]) == d
    assert all(abs(v - 1.0) < 1e-6 for v in out["r2_per_dim"])
    # an affine map (scale + shift) is still linearly identifiable: the fit has a bias term
    out = linear_r2(3.0 * z_fit @ q.T.float() + 5.0, z_fit, 3.0 * z_eval @ q.T.float() + 5.0, z_eval)
    assert abs(out["r2"] - 1.0) < 1e-6


def test_linear_r2_is_zero_for_independent_noise():
    # out-of-sample R² of a least-squares fit on pure noise: E ≈ −(k+1)/n ≈ −0.003, SE ≈ 0.003 at n=4000
    d, n = 10, 4000
    z_fit, z_eval = sample_uniform(n, d, generator=gen(0)), sample_uniform(n, d, generator=gen(1))
    noise_fit, noise_eval = torch.randn(n, d, generator=gen(2)), torch.randn(n, d, generator=gen(3))
    out = linear_r2(noise_fit, z_fit, noise_eval, z_eval)
    assert abs(out["r2"]) < 0.02, f"R² = {out['r2']} on independent noise (tol |R²| < 0.02)"


def test_linear_r2_per_dimension():
    # ẑ = the first 4 coordinates of z: those dims are recovered exactly, the rest (uncorrelated with them
    # on the uniform sphere) not at all (|R²| < 0.02, SE ≈ 0.003 at n=4000).
    d, k, n = 8, 4, 4000
    z_fit, z_eval = sample_uniform(n, d, generator=gen(0)), sample_uniform(n, d, generator=gen(1))
    out = linear_r2(z_fit[:, :k], z_fit, z_eval[:, :k], z_eval)
    per_dim = out["r2_per_dim"]
    assert all(abs(v - 1.0) < 1e-6 for v in per_dim[:k]), per_dim
    assert all(abs(v) < 0.02 for v in per_dim[k:]), per_dim
    assert out["r2"] == pytest.approx(sum(per_dim) / d)


def test_linear_r2_scores_on_the_evaluation_set():
    # a map fitted on one set must be scored on the other: if ẑ_eval is unrelated to z_eval, R² is poor
    d, n = 6, 2000
    z_fit, z_eval = sample_uniform(n, d, generator=gen(0)), sample_uniform(n, d, generator=gen(1))
    out = linear_r2(z_fit, z_fit, sample_uniform(n, d, generator=gen(2)), z_eval)
    assert out["r2"] < -0.5, f"R² = {out['r2']}: a fit on independent data should score ≈ −1 (tol < −0.5)"


# --------------------------------------------------------------------------- MCC


def test_mcc_is_one_for_a_signed_permutation():
    d, n = 6, 3000
    z = sample_uniform(n, d, generator=gen(0), dtype=F64)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    signs = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, -1.0], dtype=F64)
    z_hat = z[:, perm] * signs * torch.tensor([1.0, 2.0, 0.5, 3.0, 1.0, 7.0], dtype=F64)  # per-dim scale too
    assert mcc(z_hat, z) == pytest.approx(1.0, abs=1e-9)


def test_mcc_of_a_45_degree_rotation():
    # independent Gaussian latents, each pair rotated by 45°: every |corr| is cos 45° = 0.7071.
    # SE of a correlation at n=20000 is (1 − r²)/sqrt(n) ≈ 0.0035; tolerance 0.01 on the mean of 4.
    n = 20_000
    z = torch.randn(n, 4, generator=gen(0), dtype=F64)
    c = math.sqrt(0.5)
    rot = torch.tensor([[c, -c, 0, 0], [c, c, 0, 0], [0, 0, c, -c], [0, 0, c, c]], dtype=F64)
    assert mcc(z @ rot.T, z) == pytest.approx(c, abs=0.01)
    # independent noise: |corr| ≈ 0 up to the Hungarian pick of the largest of ~|N(0, 1/n)| values
    assert mcc(torch.randn(n, 4, generator=gen(1), dtype=F64), z) < 0.03


# --------------------------------------------------------------------------- per-block R², Λ̂ recovery


def test_r2_per_block_groups_by_equal_concentration():
    r2 = [0.9, 0.5, 0.7, 0.3, 0.8]
    lam = [25.0, 5.0, 25.0, 5.0, 25.0]
    out = r2_per_block(r2, lam)
    assert list(out) == [5.0, 25.0], "blocks keyed by Λ, ascending"
    assert out[5.0] == pytest.approx(0.4)
    assert out[25.0] == pytest.approx(0.8)
    assert r2_per_block([0.1, 0.2], [3.0, 3.0]) == {3.0: pytest.approx(0.15)}
    with pytest.raises(ValueError):
        r2_per_block([0.1, 0.2], [1.0, 2.0, 3.0])


def test_lambda_recovery_sorts_both_sides():
    out = lambda_recovery([25.0, 5.5, 24.0], [5.0, 25.0, 25.0])
    assert out["lambda_hat_sorted"] == [5.5, 24.0, 25.0]
    assert out["lambda_true_sorted"] == [5.0, 25.0, 25.0]
    # relative errors of the sorted pairs: 0.5/5 = 0.1, 1/25 = 0.04, 0
    assert out["max_rel_error"] == pytest.approx(0.1)
    assert out["mean_rel_error"] == pytest.approx((0.1 + 0.04 + 0.0) / 3)
    # a permutation of the truth is a perfect recovery; tensors are accepted
    perfect = lambda_recovery(torch.tensor([25.0, 5.0, 25.0], requires_grad=True), torch.tensor([5.0, 25.0, 25.0]))
    assert perfect["max_rel_error"] == 0.0
    with pytest.raises(ValueError):
        lambda_recovery([1.0, 2.0], [1.0, 2.0, 3.0])


# --------------------------------------------------------------------------- iterations to target


def test_iterations_to_target_first_crossing_and_none():
    steps = [0, 100, 200, 300, 400]
    r2 = [0.1, 0.92, 0.85, 0.95, 0.97]
    out = iterations_to_target(steps, r2, [0.5, 0.9, 0.95, 0.99])
    assert out == {0.5: 100, 0.9: 100, 0.95: 300, 0.99: None}  # first crossing, even if R² dips after
    assert iterations_to_target(steps, r2, [0.1]) == {0.1: 0}  # reaching the target exactly counts
    assert iterations_to_target([], [], [0.5]) == {0.5: None}


# --------------------------------------------------------------------------- similarity overlap


def test_similarity_overlap_independent_positives():
    # h_pos independent of h: positive and negative cosines have the same law. With 2000 positives in
    # 20 bins the histogram sampling error keeps the overlap above ~0.95 (measured 0.97); tolerance 0.9.
    n, d = 2000, 5
    h = sample_uniform(n, d, generator=gen(0), dtype=F64)
    h_pos = sample_uniform(n, d, generator=gen(1), dtype=F64)
    out = similarity_overlap(h, h_pos, bins=20)
    assert out["overlap"] > 0.9, f"overlap {out['overlap']:.3f} (tol > 0.9)"
    assert abs(out["pos_mean"]) < 5 / math.sqrt(d * n)  # 5 SE of a mean of cosines (var 1/d)
    assert abs(out["neg_mean"]) < 0.01
    assert out["nn_is_positive"] < 0.01  # chance level is 1/(n − 1)
    assert sum(out["pos_hist"]) == pytest.approx(1.0) and sum(out["neg_hist"]) == pytest.approx(1.0)
    assert len(out["bin_edges"]) == 21 and len(out["pos_hist"]) == 20


def test_similarity_overlap_identical_positives():
    # h_pos = h: every positive cosine is 1 (last bin); negatives of uniform points in d=5 rarely exceed 0.96
    n, d = 1000, 5
    h = sample_uniform(n, d, generator=gen(0), dtype=F64)
    out = similarity_overlap(h, h.clone())
    assert out["overlap"] < 0.01, f"overlap {out['overlap']:.4f} (tol < 0.01)"
    assert out["pos_mean"] == pytest.approx(1.0, abs=1e-12)
    assert out["nn_is_positive"] == 1.0
    assert out["pos_hist"][-1] == pytest.approx(1.0)


def test_similarity_overlap_keeps_cosines_that_round_above_one():
    # Regression: normalised rows whose self-cosine rounds to 1 + 2⁻⁵² fell outside the histogram's
    # [−1, 1] range, so with all positives like that the positive histogram was 0/0 = NaN.
    h = torch.randn(2000, 5, generator=gen(0), dtype=F64)
    for _ in range(20):  # keep only rows whose (re-normalised) self-cosine rounds above 1
        a = F.normalize(h, dim=-1)
        keep = (a @ a.T).diagonal() > 1.0
        if keep.all() or not keep.any():
            break
        h = h[keep]
    out = similarity_overlap(h, h.clone())
    assert math.isfinite(out["overlap"]), "overlap is NaN"
    assert out["pos_hist"][-1] == pytest.approx(1.0), "positives with cosine 1 must land in the last bin"
    assert out["overlap"] < 0.05


def test_matched_lambda_follows_the_output_that_encodes_each_latent():
    g = torch.Generator().manual_seed(3)
    z = torch.randn(2000, 5, generator=g)
    perm = torch.tensor([3, 0, 4, 1, 2])
    signs = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0])
    z_hat = z[:, perm] * signs  # output i encodes latent perm[i]
    truth = torch.tensor([5.0, 10.0, 15.0, 20.0, 25.0])
    learned = truth[perm]  # each output learned its latent's concentration
    out = matched_lambda(z_hat, z, learned, truth)
    assert out["lambda_hat_matched"] == pytest.approx(truth.tolist())
    assert out["rank_corr"] == pytest.approx(1.0)
    # the same values on the wrong outputs: sorted lists would still agree, the matched ones do not
    wrong = matched_lambda(z_hat, z, truth.flip(0)[perm], truth)
    assert wrong["rank_corr"] == pytest.approx(-1.0)
    assert math.isnan(matched_lambda(z_hat, z, learned, torch.full((5,), 7.0))["rank_corr"])
