"""The fixed-shape sampler (``sampler: fixed``, ablate/core/fixed_sampler.py): the papers' law, its misses
finished exactly, one host read per batch, and a pack member equal to its solo run bit for bit.

The laws are compared as in tests/core/test_dgp.py: per-dimension variance of z⁺ − z and the mean cosine, a
two-sample z-test at K_SE standard errors against the adaptive sampler (the papers' rejection sampler).
"""

from __future__ import annotations

import pytest
import torch

from ablate.config import ConfigError, RunConfig
from ablate.core.dgp import LowAcceptanceError, sample_conditional, sample_hard_negatives, sample_uniform
from ablate.core.experiment import Experiment
from ablate.core.fixed_sampler import FixedShapeSampler, candidate_count
from ablate.core.pack import PackedExperiment
from benchmarks.step_ops import HostSyncs
from tests.core.test_dgp import K_SE, spread_stats, two_sample_z

F64 = torch.float64
LAM = [5.0] * 5 + [25.0] * 5  # d = 10, acceptance about 9 %: rejection reshapes the law a lot


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _fixed(lam, neg=None, *, batch=6000, negatives=0, candidates=None) -> FixedShapeSampler:
    sampler = FixedShapeSampler(
        torch.tensor([lam], dtype=F64), None if neg is None else torch.tensor([neg], dtype=F64),
        batch_size=batch, n_negatives=negatives,
    )  # fmt: skip
    if candidates is not None:  # a deliberately small K: most rows miss and are finished exactly
        sampler.candidates = [candidates]
        sampler.negative_candidates = None if neg is None else [candidates]
    return sampler


def _assert_same_law(z, fast, slow, what):
    zs = two_sample_z(spread_stats(z, fast), spread_stats(z, slow))
    assert zs.abs().max() < K_SE, f"{what}: fixed vs adaptive differ, z-scores {zs.numpy().round(2)} (tol {K_SE})"


@pytest.mark.parametrize("candidates", [None, 2], ids=["measured-K", "K=2-misses"])
def test_positives_follow_the_adaptive_sampler_s_law(candidates):
    n = 6000
    sampler = _fixed(LAM, candidates=candidates)
    z, pos, _ = sampler.draw([gen(1)], n)
    z, pos = z[0], pos[0]
    assert torch.allclose(pos.norm(dim=1), torch.ones(n, dtype=F64), atol=1e-12), "positives on the sphere"
    reference = sample_conditional(z, LAM, threshold=0.1, generator=gen(2))
    _assert_same_law(z, pos, reference, f"K={sampler.candidates}")
    if candidates is None:  # K for a miss rate of 1e-6 per row: at most a handful of the 6000 rows miss
        assert sampler.candidates[0] > 20 and sampler.misses <= 5, (sampler.candidates, sampler.misses)
    else:  # acceptance ~9 %, K = 2: about 83 % of the rows miss, each counted and finished exactly
        assert 0.75 * n < sampler.misses < 0.9 * n, sampler.misses


def test_hard_negatives_follow_the_adaptive_sampler_s_law_and_the_miss_path():
    n, m, neg_lam = 2000, 3, [20.0] * 10
    for candidates in (None, 3):
        sampler = _fixed(LAM, neg_lam, batch=n, negatives=m, candidates=candidates)
        z, _, neg = sampler.draw([gen(5)], n, hard_negatives=True)
        assert neg.shape == (1, n, m, 10)
        reference = sample_hard_negatives(z[0], neg_lam, m, generator=gen(6))
        anchors = z[0].repeat_interleave(m, dim=0)
        _assert_same_law(anchors, neg[0].reshape(-1, 10), reference.reshape(-1, 10), f"negatives K={candidates}")
        if candidates is not None:
            assert sampler.misses > 0


def test_a_row_that_misses_is_the_first_accepted_draw_of_its_stream():
    """K = 2 at Λ = 2: most rows miss both candidates. Each value must be what plain rejection sampling gives on
    the same stream: the first of its two candidates that passes, else the adaptive sampler's draw continuing
    the stream (anchors, then every row's candidates, then the finishing round), replayed here by hand."""
    lam, n = torch.full((3,), 2.0, dtype=F64), 500
    sampler = _fixed(lam.tolist(), candidates=2, batch=n)
    z, pos, _ = sampler.draw([gen(9)], n)
    rng = gen(9)
    anchors = sample_uniform(n, 3, generator=rng, dtype=F64)
    x = anchors.unsqueeze(1) + torch.randn((n, 2, 3), generator=rng, dtype=F64) * lam.rsqrt()
    ok = (x.norm(dim=-1) - 1.0).abs() < 0.1
    expected = torch.empty(n, 3, dtype=F64)
    for row in range(n):
        if ok[row].any():
            first = x[row, int(ok[row].to(torch.int8).argmax())]
            expected[row] = first / first.norm()
    missed = (~ok.any(dim=1)).nonzero().squeeze(1)
    expected[missed] = sample_conditional(anchors[missed], lam, threshold=0.1, generator=rng)
    assert sampler.misses == missed.numel() > n // 2
    assert torch.equal(z[0], anchors)
    assert torch.allclose(pos[0], expected, rtol=0, atol=1e-15), (pos[0] - expected).abs().max()


def test_candidate_count_is_deterministic_capped_and_refuses_hopeless_acceptance():
    assert candidate_count(LAM, 0.1, 64) == candidate_count(LAM, 0.1, 64)
    assert candidate_count([1000.0] * 4, 0.1, 64) <= 3  # acceptance ~1: one or two candidates
    assert candidate_count(LAM, None, 64) == 1
    assert candidate_count(LAM, 0.1, 10**6) * 10**6 * 10 <= 1 << 23 or candidate_count(LAM, 0.1, 10**6) == 1
    with pytest.raises(LowAcceptanceError, match="acceptance"):
        candidate_count([0.01] * 40, 0.01, 64)


def _config(**kw) -> RunConfig:
    values = dict(
        latent_dim=6, batch_size=32, generator_seed=0, device="cpu", sampler="fixed", max_steps=40,
        encoder_widths=[10, 10, 10], eval_samples=256, generator_cond_samples=1000,
    )  # fmt: skip
    return RunConfig(**{**values, **kw})


def test_the_sampler_is_a_science_field_that_earlier_runs_do_not_carry():
    assert "sampler" not in RunConfig().science(), "an adaptive run's key must be the key it had before the field"
    assert RunConfig(sampler="fixed").science()["sampler"] == "fixed"
    with pytest.raises(ConfigError, match="grid.yaml: .*sampler.*normal conditional only"):
        RunConfig.build({"sampler": "fixed", "conditional": "vmf"}, "grid.yaml")


@pytest.mark.parametrize("hard", [False, True], ids=["positives", "hard-negatives"])
def test_a_pack_member_equals_its_solo_run_bit_for_bit(hard):
    extra = dict(negative_concentration=8.0, n_hard_negatives=2, loss="aninfonce") if hard else {}
    # Λ from 3 to 40: each member has its own K, so the pack pads the narrower ones
    configs = [_config(seed=i, concentration=[3.0, 40.0][i % 2] + i, **extra) for i in range(3)]
    pack = PackedExperiment(configs)
    assert len(set(pack._sampler.candidates)) > 1
    for solo_kernels in (True, False):
        pack = PackedExperiment(configs)
        pack.solo_kernels, pack.prefetch = solo_kernels, False
        pack.train(12)
        for i, cfg in enumerate(configs):
            solo = Experiment(cfg)
            solo.prefetch = False
            solo.train(12)
            state = pack.member_state_dict(i)
            assert torch.equal(state["data_rng"], solo.data_rng.get_state()), f"member {i}: data stream"
            if solo_kernels:
                for key, value in solo.encoder.state_dict().items():
                    assert torch.equal(state["encoder"][key], value), f"member {i}: {key}"


def test_resume_equals_never_stopping_and_a_solo_step_reads_nothing():
    cfg = _config(concentration="5/25", latent_dim=10)
    whole = Experiment(cfg)
    whole.prefetch = False
    whole.train(6)
    syncs = HostSyncs()
    with syncs:
        whole.train(4)
    # no row missed in these batches (deterministic), so a train call reads the miss flags of its batches once
    # (drawn ahead), and its losses' finiteness and mean once; a step reads nothing (Adam's counts are Python
    # integers), and none of the adaptive sampler's per-round reads (counts, nonzero, boolean indexing) happen
    assert whole.fixed_samplers[0].misses == 0
    assert dict(syncs.calls) == {"tolist": 1, "__bool__": 1, "__float__": 1}, syncs.calls
    first = Experiment(cfg)
    first.train(5)
    state = first.state_dict()
    second = Experiment(cfg)
    second.load_state_dict(state)
    second.train(5)
    for key, value in whole.encoder.state_dict().items():
        assert torch.equal(second.encoder.state_dict()[key], value), key
    # and the evaluation draws from its own stream: the same numbers twice
    assert second.evaluate()["r2"] == whole.evaluate()["r2"]


def test_uniform_anchors_are_the_papers_marginal():
    sampler = _fixed([50.0] * 3, batch=4000)
    z, _, _ = sampler.draw([gen(3)], 4000)
    direct = sample_uniform(4000, 3, generator=gen(3), dtype=F64)
    assert torch.equal(z[0], direct), "anchors are sample_uniform's draws, the first of the stream"


@pytest.mark.parametrize("chunk", [1, 4, 32])
def test_batches_drawn_ahead_equal_batches_drawn_one_by_one_misses_included(chunk):
    """draw_ahead reads the miss flags once per chunk of batches instead of once per batch; a batch that missed is
    finished from its generators' state right after it and the batches after it are drawn again, so every batch
    and every generator state after it equal the per-batch draws', bit for bit. K = 40 at acceptance ~9 % makes
    about two thirds of these 50-row batches miss somewhere; hard negatives join from step 3."""
    from ablate.core.fixed_sampler import draw_ahead

    lam = torch.tensor([LAM, [25.0] * 10], dtype=F64)
    neg = torch.tensor([[20.0] * 10, [30.0] * 10], dtype=F64)
    steps, n = list(range(10)), 50

    def sampler():
        s = FixedShapeSampler(lam, neg, batch_size=n, n_negatives=2)
        s.candidates, s.negative_candidates = [40, 60], [40, 40]
        return s

    def hard(step):
        return step >= 3

    one, rngs = sampler(), [gen(1), gen(2)]
    expected = []
    for step in steps:
        drawn = one.draw(rngs, n, hard_negatives=hard(step))
        expected.append((drawn, [g.get_state() for g in rngs]))
    assert 0 < one.misses

    ahead, rngs = sampler(), [gen(1), gen(2)]
    got = list(draw_ahead(ahead, rngs, n, steps, hard=hard, chunk=chunk))
    assert ahead.misses == one.misses and len(got) == len(steps)
    for step, ((drawn, states), (want, want_states)) in enumerate(zip(got, expected)):
        for a, b in zip(drawn, want):
            assert (a is None and b is None) or torch.equal(a, b), step
        assert all(torch.equal(s, t) for s, t in zip(states, want_states)), step

    # with the measured K no row misses here: the only host reads are the flags, one read per chunk
    measured, rngs = FixedShapeSampler(lam, neg, batch_size=n, n_negatives=2), [gen(1), gen(2)]
    list(draw_ahead(measured, rngs, n, [0, 5], hard=hard))  # the per-member index tensors, built once per sampler
    with HostSyncs() as syncs:
        list(draw_ahead(measured, rngs, n, steps, hard=hard, chunk=chunk))
    assert measured.misses == 0 and dict(syncs.calls) == {"tolist": -(-len(steps) // chunk)}, syncs.calls


def test_a_solo_run_drawn_ahead_equals_one_drawn_batch_by_batch_misses_included():
    """Without the prefetch thread a solo run with ``sampler: fixed`` draws its batches ahead (one host read per
    chunk); with it, one by one through :meth:`Experiment.sample_latents`. With K forced small (most batches miss
    somewhere, hard negatives from step 4) both give the same weights, Adam state and data stream, bit for bit,
    across train calls that end mid-chunk."""
    cfg = _config(
        concentration="5/25", latent_dim=6, negative_concentration=3.0, n_hard_negatives=2, hard_negatives_from_step=4
    )
    states, misses = [], []
    for prefetch in (True, False):
        exp = Experiment(cfg)
        exp.prefetch = prefetch
        sampler = exp.fixed_samplers[0]
        sampler.candidates, sampler.negative_candidates = [3], [3]
        reports = [exp.train(n) for n in (3, 7, 1)]
        states.append((reports, exp.state_dict()))
        misses.append(sampler.misses)
    assert misses[0] == misses[1] > 0
    (want_reports, want), (got_reports, got) = states
    assert got_reports == want_reports and got["step"] == want["step"] == 11
    assert torch.equal(got["data_rng"], want["data_rng"])
    for part in ("encoder", "loss"):
        for key, value in want[part].items():
            assert torch.equal(got[part][key], value), (part, key)
    for i, moments in want["optimizer"]["state"].items():
        for key, value in moments.items():
            assert torch.equal(got["optimizer"]["state"][i][key], value), (i, key)


def test_draw_ahead_sizes_its_chunks_by_the_misses_it_has_seen():
    """Batches drawn after a miss in their chunk are drawn again, so draw_ahead sizes its chunks from the share of
    batches that missed: where most batches miss (K forced to 40 at acceptance ~9 %), about one batch per read and
    few drawn in vain; where none miss (the measured K), chunks grow to MAX_AHEAD and the reads fall to about one per
    32 batches. The batches are the one-by-one batches either way (the test above)."""
    from ablate.core.fixed_sampler import AHEAD_WASTE, MAX_AHEAD, draw_ahead

    lam, n = torch.tensor([LAM], dtype=F64), 50

    def run(candidates, steps):
        sampler = FixedShapeSampler(lam, None, batch_size=n)
        if candidates is not None:
            sampler.candidates = [candidates]
        drawn, pending = [0], sampler.draw_pending

        def counted(*args, **kwargs):
            drawn[0] += 1
            return pending(*args, **kwargs)

        sampler.draw_pending = counted
        with HostSyncs() as syncs:
            got = list(draw_ahead(sampler, [gen(5)], n, range(steps)))
        assert len(got) == steps
        return sampler, drawn[0] - steps, syncs.calls["tolist"]

    often, in_vain, reads = run(40, 200)
    assert often.batches_missed / often.batches_read > 0.5, (often.batches_missed, often.batches_read)
    assert in_vain <= 2 * AHEAD_WASTE * 200 and reads >= 150, (in_vain, reads)
    never, in_vain, reads = run(None, 320)
    assert never.misses == 0 and in_vain == 0
    assert reads <= 320 // MAX_AHEAD + 6, reads
