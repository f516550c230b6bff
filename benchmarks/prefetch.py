"""`python -m benchmarks --only prefetch`: ms per training step with and without the batch prefetch thread.

For the laptop grids' settings, on one torch thread (a trial's share of a 2-slot machine):
- the share of a step spent drawing its batch (latents, positives; the rejection sampler at d = 16 is the cost);
- ms per step with ``prefetch`` off and on, with the other core idle ("alone": the last trial of a grid) and with
  the other core busy training another trial ("packed").
The numbers of a run are identical either way (tests/core/test_prefetch.py); only the time differs.
"""

from __future__ import annotations

import subprocess
import sys
import time

import torch

#: The laptop settings whose sampler costs differ most (name, RunConfig fields).
SETTINGS = [
    ("bimodal_dynamics, d=10, B=512", {"latent_dim": 10, "concentration": "5/25", "batch_size": 512}),
    ("batch_vs_dim, d=16, B=1024", {"latent_dim": 16, "concentration": "5/25", "batch_size": 1024}),
    ("batch_vs_dim, d=4, B=1024", {"latent_dim": 4, "concentration": "5/25", "batch_size": 1024}),
    (
        "zimmermann_sphere vMF, d=10, B=2048",
        {
            "latent_dim": 10,
            "loss": "infonce",
            "conditional": "vmf",
            "kappa": 1.0,
            "batch_size": 2048,
            "infonce_layout": "reference",
            "concentration": 400,
        },
    ),
]

_COMPETITOR = """
import torch
from ablate import Experiment, RunConfig
torch.set_num_threads(1)
exp = Experiment(RunConfig(latent_dim=10, concentration="5/25", batch_size=512, encoder_widths=[10, 10, 10],
                           max_steps=10**9, prefetch=False))
while True:
    exp.train(50)
"""


def _experiment(settings: dict, prefetch: bool):
    from ablate import Experiment, RunConfig

    cfg = RunConfig(encoder_widths=[10, 10, 10], max_steps=100_000, prefetch=prefetch, **settings)
    exp = Experiment(cfg)
    exp.train(20)  # warm-up
    return exp


def _ms_per_step(settings: dict, prefetch: bool, steps: int) -> float:
    exp = _experiment(settings, prefetch)
    t = time.perf_counter()
    exp.train(steps)
    return (time.perf_counter() - t) / steps * 1e3


def _draw_ms(settings: dict, steps: int) -> float:
    exp = _experiment(settings, prefetch=False)
    t = time.perf_counter()
    for step in range(exp.step, exp.step + steps):
        exp._training_batch(step)
    return (time.perf_counter() - t) / steps * 1e3


def bench_prefetch(steps: int = 60) -> list[dict]:
    """One row per setting: batch-drawing ms, ms/step off/on alone and packed, and the speed-ups."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    rows = []
    try:
        for name, settings in SETTINGS:
            row: dict = {"setting": name, "draw_ms": _draw_ms(settings, steps)}
            row["alone_off_ms"] = _ms_per_step(settings, False, steps)
            row["alone_on_ms"] = _ms_per_step(settings, True, steps)
            competitor = subprocess.Popen([sys.executable, "-c", _COMPETITOR])
            try:
                time.sleep(3.0)  # let it build g and start training
                row["packed_off_ms"] = _ms_per_step(settings, False, steps)
                row["packed_on_ms"] = _ms_per_step(settings, True, steps)
            finally:
                competitor.kill()
                competitor.wait()
            row["draw_share"] = row["draw_ms"] / row["alone_off_ms"]
            row["alone_speedup"] = row["alone_off_ms"] / row["alone_on_ms"]
            row["packed_speedup"] = row["packed_off_ms"] / row["packed_on_ms"]
            rows.append(row)
    finally:
        torch.set_num_threads(before)
    return rows
