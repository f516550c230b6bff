"""`python -m benchmarks --only compile`: the training step eager and under ``torch.compile`` on the CPU.

The compiled step wraps :meth:`Experiment.compute_loss` (f∘g and the loss, forward and, through AOTAutograd, backward)
in ``torch.compile``; sampling and Adam stay eager. Per setting: the first step's seconds (compilation included),
ms per step after a warm-up, the ratio of achieved matmul FLOP/s to the machine's fp32 matmul rate, and the
training loss after the timed steps, same seed and data stream, against the eager run's.
"""

from __future__ import annotations

import time

import torch

#: The laptop grids' step shapes: the reference encoder at batch 256 and 512, and the slim encoder (fast preset).
SETTINGS = [
    {"batch_size": 256, "latent_dim": 10},
    {"batch_size": 512, "latent_dim": 10},
    {"batch_size": 512, "latent_dim": 10, "encoder_widths": [10, 10, 10]},
]


def compile_rows(peak_gflops: float, steps: int = 60, step_flops=None) -> list[dict]:
    """Eager and compiled rows for each of :data:`SETTINGS` (see the module docstring)."""
    from ablate.config import RunConfig
    from ablate.core.experiment import Experiment

    rows = []
    for settings in SETTINGS:
        losses = {}
        for compiled in (False, True):
            torch._dynamo.reset()
            exp = Experiment(RunConfig(concentration=75, generator_seed=0, seed=0, **settings))
            if compiled:
                exp.compute_loss = torch.compile(exp.compute_loss)
            t = time.perf_counter()
            exp.train(1)
            first = time.perf_counter() - t
            exp.train(4)
            t = time.perf_counter()
            losses[compiled] = exp.train(steps)["loss"]
            dt = (time.perf_counter() - t) / steps
            row = {
                "batch": settings["batch_size"],
                "encoder": "slim" if "encoder_widths" in settings else "reference",
                "mode": "compiled" if compiled else "eager",
                "first_step_s": first,
                "ms_per_step": dt * 1e3,
            }
            if step_flops is not None:
                row["ratio_to_peak"] = step_flops(exp) / dt / 1e9 / peak_gflops
            row["loss"] = losses[compiled]
            row["loss_change"] = losses[compiled] - losses[False]
            rows.append(row)
    return rows
