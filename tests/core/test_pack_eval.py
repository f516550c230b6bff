"""One evaluation of every member per report on the batched path (ablate/core/pack_eval.py): the numbers of each
member's own evaluation (which tests/core/test_pack.py ties to its solo run), one transfer to the host, and
histograms equal to torch.histogram's."""

from __future__ import annotations

import math

import pytest
import torch

from ablate.config import RunConfig
from ablate.core.pack import PackedExperiment
from ablate.core.pack_eval import histograms
from benchmarks.step_ops import HostSyncs

#: float64 runs: the batched path reassociates sums, so values agree to about 1e-12 relative; a quantity that is
#: itself a small difference (Λ̂'s relative error at ~1e-7) loses digits, hence an absolute floor.
REL, ABS = 1e-7, 1e-10


def test_histograms_count_as_torch_histogram_does_edges_included():
    edges = torch.linspace(-1.0, 1.0, 41, dtype=torch.float64)
    rng = torch.Generator().manual_seed(0)
    values = torch.rand(3, 5000, generator=rng, dtype=torch.float64) * 2.2 - 1.1  # some outside [-1, 1]
    values[0, :41] = edges  # every edge exactly, the last one too (torch.histogram's closed last bin)
    values[1, :3] = torch.tensor([-1.0, 1.0, math.nextafter(1.0, 2.0)], dtype=torch.float64)
    got = histograms(values, edges)
    for row, counts in zip(values, got):
        assert torch.equal(counts, torch.histogram(row, bins=edges).hist)


def _configs(**extra) -> list[RunConfig]:
    base = dict(
        latent_dim=5, batch_size=32, generator_seed=0, device="cpu", dtype="float64", max_steps=40,
        encoder_widths=[10, 10, 10], eval_samples=256, generator_cond_samples=1000,
    )  # fmt: skip
    return [RunConfig(**{**base, "seed": i, "concentration": 5.0 + 3 * i, **extra}) for i in range(3)]


def _assert_close(expected: dict, got: dict) -> None:
    assert list(expected) == list(got), "the same keys in the same order"
    for key, want in expected.items():
        have = got[key]
        if isinstance(want, list):
            assert have == pytest.approx(want, rel=REL, abs=ABS), key
        elif isinstance(want, float) and math.isnan(want):
            assert math.isnan(have), key
        else:
            assert have == pytest.approx(want, rel=REL, abs=ABS), key


@pytest.mark.parametrize(
    "extra",
    [{}, {"negative_concentration": 9.0, "n_hard_negatives": 2}, {"loss": "infonce"}, {"sampler": "fixed"}],
    ids=["aninfonce", "hard-negatives", "infonce", "fixed-sampler"],
)
def test_one_batched_evaluation_gives_each_member_s_own_numbers(extra):
    pack = PackedExperiment(_configs(**extra))
    pack.prefetch = False
    pack.train(4)
    pack.freeze(1)
    pack.train(2)  # members 0 and 2 at step 6, member 1 at step 4: two evaluations, one per step
    one_by_one = pack.evaluate()
    pack.solo_kernels = False
    for want, got in zip(one_by_one, pack.evaluate()):
        _assert_close(want, got)
    subset = pack.evaluate([2, 0])
    _assert_close(one_by_one[2], subset[0])
    _assert_close(one_by_one[0], subset[1])


def test_a_batched_evaluation_reads_the_device_once():
    pack = PackedExperiment(_configs(sampler="fixed"))
    pack.solo_kernels, pack.prefetch = False, False
    pack.train(3)
    pack.evaluate()  # the first report also builds each member's loss-floor Λ, once
    with HostSyncs() as syncs:
        pack.evaluate()
    # one transfer of every member's numbers, one flag of the fixed sampler's batch, the members' index; the rest
    # are host-side lists made tensors by the Λ̂ metrics (no device involved)
    device_reads = {name: n for name, n in syncs.calls.items() if name != "as_tensor"}
    assert device_reads == {"tolist": 1, "__bool__": 1, "tensor": 1}, syncs.calls
