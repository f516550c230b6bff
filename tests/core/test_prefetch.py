"""The batch prefetcher: order, errors, early exit, and training numbers identical with and without it."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from ablate import Experiment, RunConfig
from ablate.core.prefetch import Prefetcher


def test_items_come_in_order_from_another_thread():
    makers = []

    def make(k: int) -> int:
        makers.append(threading.get_ident())
        return k * k

    with Prefetcher(make, range(3, 40)) as items:
        got = list(items)
    assert got == [k * k for k in range(3, 40)]
    assert set(makers) == {makers[0]} and makers[0] != threading.get_ident()


def test_disabled_makes_the_same_items_in_the_callers_thread():
    makers = []

    def make(k: int) -> int:
        makers.append(threading.get_ident())
        return -k

    with Prefetcher(make, range(10), enabled=False) as items:
        assert list(items) == [-k for k in range(10)]
    assert set(makers) == {threading.get_ident()}


def test_an_error_in_make_is_raised_at_its_item():
    def make(k: int) -> int:
        if k == 3:
            raise ValueError("bad batch 3")
        return k

    got = []
    with pytest.raises(ValueError, match="bad batch 3"), Prefetcher(make, range(10)) as items:
        for item in items:
            got.append(item)
    assert got == [0, 1, 2]


def test_leaving_early_stops_the_thread_and_nothing_is_made_afterwards():
    made = []

    def make(k: int) -> int:
        made.append(k)
        return k

    with Prefetcher(make, range(1000), depth=2) as items:
        for item in items:
            if item == 4:
                break
    count = len(made)
    assert 5 <= count <= 5 + 2 + 1  # the items used, the queue's depth, and the one being made
    assert not any(t.name == "ablate-prefetch" for t in threading.enumerate())
    time.sleep(0.2)
    assert len(made) == count


def test_the_thread_uses_the_callers_intra_op_thread_count():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with Prefetcher(lambda k: torch.get_num_threads(), range(4)) as items:
            assert list(items) == [1, 1, 1, 1]
    finally:
        torch.set_num_threads(before)


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth"):
        Prefetcher(lambda k: k, range(3), depth=0)


@pytest.mark.parametrize(
    "settings",
    [
        # the rejection sampler at d = 16 (many candidates per row), the costliest sampler of the laptop grids
        {"latent_dim": 16, "concentration": "5/25", "batch_size": 128, "encoder_widths": [4, 4]},
        # hard negatives switched on mid-run
        {
            "latent_dim": 6,
            "concentration": "5/25",
            "negative_concentration": 2.0,
            "n_hard_negatives": 4,
            "hard_negatives_from_step": 7,
            "batch_size": 32,
            "encoder_widths": [4, 4],
        },
        # an ensemble: one pair of views per Λⁱ
        {
            "latent_dim": 4,
            "loss": "ensemble_aninfonce",
            "ensemble": ["2/8", "8/2"],
            "batch_size": 32,
            "encoder_widths": [4, 4],
        },
        # InfoNCE on the vMF conditional
        {"latent_dim": 6, "loss": "infonce", "conditional": "vmf", "kappa": 1.0, "batch_size": 32},
    ],
)
def test_training_is_bit_identical_with_and_without_prefetch(settings):
    states, reports = [], []
    for prefetch in (False, True):
        exp = Experiment(RunConfig(max_steps=30, prefetch=prefetch, **settings))
        reports.append([exp.train(11), exp.train(1), exp.train(8)])
        states.append(exp.state_dict())
    plain, fetched = states
    assert reports[0] == reports[1]
    assert plain["step"] == fetched["step"] == 20
    assert torch.equal(plain["data_rng"], fetched["data_rng"])
    for name, tensor in plain["encoder"].items():
        assert torch.equal(tensor, fetched["encoder"][name]), name
    for name, tensor in plain["loss"].items():
        assert torch.equal(tensor, fetched["loss"][name]), name


def test_prefetch_switch_respects_the_config():
    exp = Experiment(RunConfig(latent_dim=4, batch_size=8, max_steps=5, prefetch=False))
    exp.prefetch = True
    assert exp.prefetch is False
    exp = Experiment(RunConfig(latent_dim=4, batch_size=8, max_steps=5, device="cpu"))
    assert exp.prefetch is True
    exp.prefetch = False
    assert exp.prefetch is False


# ------------------------------------------------------------------ the spare-core meter (psutil's CPU times)

from ablate.service.execution.spare_cores import SpareCoreMeter, read_cpu_times  # noqa: E402


def test_read_cpu_times_counts_busy_total_and_cores():
    import psutil

    busy, total, cores = read_cpu_times()
    assert 0 < busy < total and cores == psutil.cpu_count()
    time.sleep(0.2)
    busy2, total2, _ = read_cpu_times()
    # a KVM guest's /proc/stat may step a busy counter back by a clock tick per core (seen here under load);
    # the meter clamps that, and the reading must not fall further
    assert busy2 >= busy - 0.01 * cores and total2 > total


class _Readings:
    """A stand-in for the machine's CPU times: the meter reads the next one each time."""

    def __init__(self, *readings):
        self.readings = list(readings)

    def __call__(self):
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]


def test_meter_subtracts_this_process_and_its_main_thread():
    # over the interval the machine's 4 cores were busy 25 % of the time: one core's worth, all by others
    meter = SpareCoreMeter(_Readings((0.0, 0.0, 4), (100.0, 400.0, 4)))
    time.sleep(1.1)  # this process sleeps: its own CPU time is ~0
    spare = meter.spare()
    assert spare == pytest.approx(4 - 1 - 1, abs=0.05)
    assert meter.spare() is None  # too soon after the previous reading


def test_meter_without_cpu_times_says_unknown():
    meter = SpareCoreMeter(lambda: None)
    time.sleep(1.1)
    assert meter.spare() is None


def test_trainable_switches_prefetch_by_the_spare_cores(monkeypatch):
    from ablate import load_grid
    from ablate.service.execution.trainable import AblateTrainable

    grid = load_grid("batch_vs_dim", "smoke")
    params = {"grid": "batch_vs_dim", **grid.base, "max_steps": 30, "batch_size": 16, "latent_dim": 3, "seed": 0}
    trial = AblateTrainable(config=params)
    try:
        for spare, expected in ((1.0, True), (0.1, False), (None, False), (0.6, True)):
            monkeypatch.setattr(trial._spare_cores, "spare", lambda spare=spare: spare)
            result = trial.train()
            assert result["prefetch"] is expected and trial.experiment.prefetch is expected
    finally:
        trial.stop()
