"""`python -m benchmarks.determinism [--steps 10000] [--preset fast] [--set KEY=VALUE ...]`: does a long run repeat itself?

Trains one run three times on this machine and prints whether the three agree to the last bit (final weights,
Λ̂, Adam's moments, the data generator, and every report's R² and loss):

1. the batch prefetch thread on, the machine idle;
2. the prefetch thread off;
3. the prefetch thread on while another process keeps one core busy (a loaded machine).

A run that repeats itself on one machine is the premise of resume ("resume gives the same numbers as never
stopping") and of every comparison of two commits; on another CPU the last digits may differ
(docs/performance.md). Speed is not measured here.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time

import torch


def _burn(stop_at: float) -> None:
    x = 0
    while time.time() < stop_at:
        x += 1


def _train(config, steps: int, prefetch: bool) -> tuple[list[tuple[int, float, float]], dict]:
    from ablate.core.experiment import Experiment

    exp = Experiment(config)
    exp.prefetch = prefetch
    reports = []
    while exp.step < steps:
        row = exp.train(min(config.report_every, steps - exp.step))
        row.update(exp.evaluate())
        reports.append((row["step"], row["r2"], row["loss"]))
    return reports, exp.state_dict()


def _same_state(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(_same_state(x, y) for x, y in zip(a, b))
    return a == b


def main(argv: list[str] | None = None) -> int:
    from ablate.config import RunConfig, parse_assignments
    from ablate.service.specs.presets import load_preset

    p = argparse.ArgumentParser(prog="python -m benchmarks.determinism")
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--preset", default="fast")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    settings = dict(load_preset(args.preset).settings) if args.preset else {}
    settings.update({"latent_dim": 10, "concentration": "5/25", "report_every": 500})
    settings.update(parse_assignments(args.set))
    config = RunConfig.build(settings)
    torch.set_num_threads(1)
    print(
        f"# determinism: {args.steps} steps, d={config.latent_dim}, batch {config.batch_size}, torch {torch.__version__}"
    )
    runs = {}
    for name, prefetch, load in (("prefetch on", True, False), ("prefetch off", False, False), ("loaded", True, True)):
        burner = None
        if load:
            burner = multiprocessing.Process(target=_burn, args=(time.time() + 24 * 3600,), daemon=True)
            burner.start()
        started = time.time()
        try:
            runs[name] = _train(config, args.steps, prefetch)
        finally:
            if burner is not None:
                burner.terminate()
        reports = runs[name][0]
        print(f"{name}: final R² {reports[-1][1]:.6f}, loss {reports[-1][2]:.6f} ({time.time() - started:.0f} s)")
    first_reports, first_state = runs["prefetch on"]
    agree = True
    for name in ("prefetch off", "loaded"):
        reports, state = runs[name]
        same = reports == first_reports and _same_state(state, first_state)
        agree &= same
        print(f"{name} vs prefetch on: {'agree to the last bit' if same else 'DIFFER'}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
