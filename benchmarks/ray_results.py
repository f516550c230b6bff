"""`python -m benchmarks.ray_results [--seconds 40] [--report-every 1] [--every 0 2]`: what a Ray result costs a trial.

One grid point (AnInfoNCE, d = 3, batch 64, 256 evaluation samples: a short step and a short report, where Ray's
cost per result shows most) is trained:

1. in this process, report after report (train + evaluate, no Ray): the machine's own limit for this trial, in
   steps per second;
2. through `ablate run` (embedded Ray, one trial, one CPU) once per ``--results-every`` value.

A run's rate is read from its result log as the driver writes it: the steps between the first and the last time
the log grew, over the time between them (each growth is one Ray result, so both ends are whole results). Printed:
steps per second, the ratio to the limit, and reports per Ray result. The rows of every run are the same numbers
(tests/service/execution/test_trainable.py); only the time differs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

#: The point: the smoke scale's shapes of batch_vs_dim, one seed.
POINT = {"loss": "aninfonce", "latent_dim": 3, "batch_size": 64, "concentration": 75, "generator_seed": 0,
         "encoder_widths": [2, 2], "eval_samples": 256, "generator_cond_samples": 200}  # fmt: skip

_GRID = """name: ray_results_bench
description: one point, short steps and reports (benchmarks/ray_results.py)
base: {base}
axes: {{seed: [0]}}
stop: {{max_steps: {steps}}}
scales: {{smoke: {{}}, laptop: {{}}, paper: {{}}}}
"""


def limit_rate(report_every: int, seconds: float) -> float:
    """Steps per second of the point trained in this process on one thread, with an evaluation per report."""
    from ablate import Experiment, RunConfig

    torch.set_num_threads(1)
    exp = Experiment(RunConfig(**POINT, report_every=report_every, max_steps=10**9))
    for _ in range(20):  # warm-up
        exp.train(report_every)
        exp.evaluate()
    start, begun = exp.step, time.perf_counter()
    while time.perf_counter() - begun < seconds:
        exp.train(report_every)
        exp.evaluate()
    return (exp.step - start) / (time.perf_counter() - begun)


def _last_step(log: Path) -> int | None:
    """The step of the last whole row of a result log, read from its tail."""
    with open(log, "rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - 16384))
        lines = f.read().decode(errors="replace").splitlines()
    for line in reversed(lines):
        try:
            return json.loads(line)["step"]
        except (ValueError, KeyError):
            continue
    return None


def ray_rate(report_every: int, steps: int, every: float, storage: Path) -> tuple[float, float]:
    """(steps per second, reports per Ray result) of one run through `ablate run`: the rate from the log's growth
    (each growth is one result), the reports per result from the rows' Ray iteration."""
    grid = storage / f"grid-{every:g}.yaml"
    grid.write_text(_GRID.format(base=json.dumps({**POINT, "report_every": report_every}), steps=steps))
    name = f"every-{every:g}"
    cmd = [sys.executable, "-m", "ablate.cli", "run", str(grid), "--storage", str(storage), "--name", name,
           "--no-dashboard", "--verbose", "0", "--results-every", f"{every:g}"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    growth: list[tuple[float, int]] = []  # (time, last step) each time the log grew
    size, log = 0, None
    while proc.poll() is None:
        log = log or next(iter((storage / name).glob("trial_*/result.json")), None)
        if log is not None and log.stat().st_size != size:
            size = log.stat().st_size
            step = _last_step(log)
            if step is not None:
                growth.append((time.perf_counter(), step))
        time.sleep(0.002)
    if proc.returncode != 0 or log is None:
        raise SystemExit(f"ablate run failed (exit {proc.returncode}): {proc.stderr.read()[-2000:]}")
    growth = growth[1:]  # from the first whole result after the trial's set-up
    (t0, s0), (t1, s1) = growth[0], growth[-1]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    results = len({r["iterations_since_restore"] for r in rows})
    return (s1 - s0) / (t1 - t0), len(rows) / results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ray_results")
    p.add_argument("--seconds", type=float, default=40.0, help="training time per run (default 40)")
    p.add_argument("--report-every", type=int, default=1)
    p.add_argument("--every", type=float, nargs="+", default=[0.0, 2.0], help="--results-every values (s)")
    args = p.parse_args(argv)
    limit = limit_rate(args.report_every, min(args.seconds, 15.0))
    steps = int(limit * args.seconds)
    print(f"# ray_results: report_every {args.report_every}, {steps} steps per run, torch {torch.__version__}")
    print(f"limit (in-process, one thread): {limit:.0f} steps/s")
    print("| --results-every | steps/s | of the limit | reports per Ray result |")
    print("|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="ablate-ray-results-") as tmp:
        for every in args.every:
            rate, per_result = ray_rate(args.report_every, steps, every, Path(tmp))
            print(f"| {every:g} s | {rate:.0f} | {rate / limit:.2f} | {per_result:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
