"""`python -m benchmarks [--quick] [--only step,sampler,memory,ray,syncs,profile,compile,time_to_r2,reference_curve,generator,overhead,threads,bookkeeping,shared_ray,ray_cpu,pair_loss,prefetch,object_store,chaos]`.

Prints ablate's performance tables.

- step: ms per training step, achieved GFLOP/s (matmul FLOPs of forward + backward through the encoder on
  both views, plus the logits) and the ratio to this machine's fp32 matmul rate measured in the same run.
- sampler: conditional samples per second and the rejection rate at Λ = 5, 25, 75 and d = 10, 20.
- memory: peak resident memory of a process training one trial at batch 1000 and 8192.
- ray: a grid's wall time against the sum of its trials' compute time divided by the concurrency.
- opt-in: profile (torch.profiler of the reference step); compile (the step eager and under torch.compile); time_to_r2 (seconds to R² 0.9/0.95/0.99 on the
  bimodal setting with --preset, per --seeds); reference_curve (the RunConfig defaults for --steps steps, R²,
  loss and Λ̂ every 1000 steps, per --seeds); generator (seconds to build the papers' g per d); object_store
  (requests, bytes and seconds per report, checkpoint, lease and status read on moto's S3 server against a local
  folder: benchmarks/object_store.py, needs moto[server]); chaos (a grid of --trials smoke trials on a two-node
  cluster, undisturbed and while a trial process is killed every --kill-every s and the worker node once:
  benchmarks/chaos.py).
The GPU check is `python -m benchmarks.gpu_check OUT_DIR` (benchmarks/gpu_check.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch


def matmul_rate(n: int = 2048, repeats: int = 10, dtype=torch.float32) -> float:
    """This machine's fp32 matmul rate in GFLOP/s (best of ``repeats`` n×n×n products)."""
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def step_flops(exp) -> float:
    """Matmul FLOPs of one training step: encoder fwd (1x) + bwd (2x) on both views, plus the logits."""
    cfg = exp.config
    rows = 2 * cfg.batch_size * len(exp.config.lambda_ensemble)
    enc = exp.encoder.matmul_flops(rows)
    gen = sum(2 * rows * layer.in_features * layer.out_features for layer in exp.generator.layers)
    logits = 2 * rows * rows * cfg.latent_dim
    return 3 * enc + gen + 3 * logits


def bench_step(batch: int, d: int, steps: int, widths=None) -> dict:
    from ablate.config import RunConfig
    from ablate.core.experiment import Experiment

    kw = {} if widths is None else {"encoder_widths": widths}
    exp = Experiment(RunConfig(latent_dim=d, batch_size=batch, concentration=75, generator_seed=0, **kw))
    exp.train(2)
    t = time.perf_counter()
    exp.train(steps)
    dt = (time.perf_counter() - t) / steps
    return {"batch": batch, "d": d, "ms_per_step": dt * 1e3, "gflops": step_flops(exp) / dt / 1e9}


def bench_pair_loss(n: int, d: int, weight: float, clamp: bool, repeats: int = 10) -> dict:
    """ms per call of the fused pair loss (forward with its gradient) on normalised encodings with Λ̂ = weight·I;
    ``clamp=False`` disables the CPU exp clamp (``exp_floor``) to show what it saves on sharp logits."""
    from ablate.core.losses import pair

    g = torch.Generator().manual_seed(0)
    h = torch.nn.functional.normalize(torch.randn(n, d, generator=g), dim=1)
    h[n // 2 :] = torch.nn.functional.normalize(h[: n // 2] + 0.05 * torch.randn(n // 2, d, generator=g), dim=1)
    w = torch.full((d,), weight)
    original = pair.exp_floor
    pair.exp_floor = original if clamp else (lambda dtype: float("-inf"))
    try:
        logits = (h * w) @ h.T
        below = float(((logits - logits.amax(1, keepdim=True)) < original(torch.float32)).float().mean())
        pair.pair_cross_entropy(h, w, 0.5)
        t = time.perf_counter()
        for _ in range(repeats):
            pair.pair_cross_entropy(h, w, 0.5)
        ms = (time.perf_counter() - t) / repeats * 1e3
    finally:
        pair.exp_floor = original
    return {"n": n, "d": d, "lambda_hat": weight, "share_below_floor": below, "clamp": clamp, "ms": ms}


def bench_sampler(d: int, lam: float, n: int = 20000) -> dict:
    from ablate import dgp

    gen = torch.Generator().manual_seed(0)
    z = dgp.sample_uniform(n, d, generator=gen)
    # acceptance measured directly on raw draws
    eps = torch.randn(n, d, generator=gen) / lam**0.5
    accept = float(((z + eps).norm(dim=1) - 1).abs().lt(0.1).double().mean())
    try:
        t = time.perf_counter()
        dgp.sample_conditional(z, lam, generator=gen)
        rate = n / (time.perf_counter() - t)
    except dgp.LowAcceptanceError:
        rate = float("nan")
    # sampler: fixed, at the fast preset's batch of 512 (its K, and so its memory cap, depends on the batch)
    from ablate.core.fixed_sampler import FixedShapeSampler

    try:
        fixed = FixedShapeSampler(torch.full((1, d), float(lam)), None, batch_size=512)
        t, drawn = time.perf_counter(), 0
        while drawn < n:
            fixed.draw([gen], 512)
            drawn += 512
        fixed_rate, candidates = drawn / (time.perf_counter() - t), fixed.candidates[0]
    except dgp.LowAcceptanceError:
        fixed_rate, candidates = float("nan"), 0
    return {
        "d": d, "lambda": lam, "samples_per_s": rate, "acceptance": accept,
        "fixed_samples_per_s": fixed_rate, "fixed_K": candidates,
    }  # fmt: skip


def _peak_rss_child(batch: int) -> None:
    from ablate.config import RunConfig
    from ablate.core.experiment import Experiment

    exp = Experiment(RunConfig(batch_size=batch, concentration=75, generator_seed=0))
    exp.train(3)
    exp.evaluate()
    # VmHWM, not ru_maxrss: the latter survives execve and would report the parent's peak
    hwm_kib = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
    print(json.dumps({"batch": batch, "peak_rss_mib": hwm_kib / 1024}))


def bench_memory(batch: int) -> dict:
    code = f"import benchmarks.__main__ as b; b._peak_rss_child({batch})"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_ray(grid_name: str, scale: str) -> dict:
    import tempfile

    from ablate.analysis.results import load_results
    from ablate.service.execution.runner import run_grid
    from ablate.service.specs.grids import load_grid

    grid = load_grid(grid_name, scale)
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        outcome = run_grid(grid, storage=tmp, verbose=0, num_cpus=os.cpu_count())
        wall = time.perf_counter() - t
        df = load_results(outcome.run_dir)
    compute = float(df.groupby("trial_id")["time_total_s"].max().sum())
    conc = min(os.cpu_count() or 1, grid.n_trials)
    ideal = compute / conc
    return {
        "grid": f"{grid_name}@{scale}",
        "trials": grid.n_trials,
        "wall_s": wall,
        "compute_s": compute,
        "concurrency": conc,
        "overhead_pct": 100 * (wall - ideal) / wall,
    }


def bench_profile(batch: int = 1000, d: int = 10, steps: int = 20, top: int = 12) -> list[dict]:
    """torch.profiler over ``steps`` reference steps: the ops taking the most time (the profiler itself
    slows the step, mostly the small ops, so read shares rather than milliseconds)."""
    from torch.profiler import ProfilerActivity, profile

    from ablate.config import RunConfig
    from ablate.core.experiment import Experiment

    exp = Experiment(RunConfig(latent_dim=d, batch_size=batch, concentration=75, generator_seed=0))
    exp.train(3)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        exp.train(steps)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    rows = [
        {
            "op": e.key,
            "ms_per_step": e.self_cpu_time_total / 1e3 / steps,
            "share_pct": 100 * e.self_cpu_time_total / total,
        }
        for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]
    ]
    matmul = sum(e.self_cpu_time_total for e in events if e.key in ("aten::mm", "aten::addmm", "aten::bmm"))
    rows.append(
        {"op": "all matmuls (mm, addmm, bmm)", "ms_per_step": matmul / 1e3 / steps, "share_pct": 100 * matmul / total}
    )
    return rows


#: The bimodal setting of Rusak et al. 2024, Sec. 4.1 (the science: a preset never changes these).
BIMODAL = {"latent_dim": 10, "concentration": "5/25", "loss": "aninfonce", "generator_seed": 0}


def bench_time_to_r2(
    preset: str, budget_s: float, seed: int = 0, targets=(0.9, 0.95, 0.99), curve: str | None = None
) -> dict:
    """Wall-clock seconds (training and evaluation, this process's threads) until R² first reaches each target
    on the bimodal setting, training with ``preset``; stops at the last target or after ``budget_s``.
    ``curve``: a CSV file that receives ``seconds,step,r2`` after every report."""
    from ablate.config import RunConfig
    from ablate.core.experiment import Experiment
    from ablate.service.specs.presets import load_preset

    preset_settings = {} if preset == "reference" else load_preset(preset).settings
    settings = {**preset_settings, **BIMODAL, "seed": seed}
    exp = Experiment(RunConfig.build(settings, f"preset {preset}"))
    cfg = exp.config
    reached: dict[float, float] = {}
    best, started = 0.0, time.perf_counter()
    while exp.step < cfg.max_steps and time.perf_counter() - started < budget_s and len(reached) < len(targets):
        exp.train(min(cfg.report_every, cfg.max_steps - exp.step))
        r2 = exp.evaluate()["r2"]
        best = max(best, r2)
        if curve:
            with open(curve, "a") as f:
                f.write(f"{time.perf_counter() - started:.1f},{exp.step},{r2:.4f}\n")
        for t in targets:
            if r2 >= t and t not in reached:
                reached[t] = time.perf_counter() - started
    row = {"preset": preset, "seed": seed, "steps": exp.step, "wall_s": time.perf_counter() - started, "best_r2": best}
    row.update({f"s_to_{t:g}": reached.get(t, float("nan")) for t in targets})
    return row


def bench_reference_curve(seed: int, steps: int = 10_000, every: int = 1000, shared_g: bool = False) -> list[dict]:
    """The reference setting (RunConfig defaults: d = 10, Λ = 5/25, batch 1000, lr 1e-4, lr_lambda 1e-3, the
    10-50-50-50-50-10 encoder, the papers' g) trained ``steps`` steps: R², loss and sorted Λ̂ every ``every``.
    A new g per seed (as the reference code draws one per run) unless ``shared_g``."""
    from ablate.columns import r2_block_column
    from ablate.config import RunConfig
    from ablate.core.experiment import Experiment

    exp = Experiment(RunConfig(seed=seed, generator_seed=0 if shared_g else seed))
    rows, started = [], time.perf_counter()
    while exp.step < steps:
        m = exp.train(min(every, steps - exp.step))
        ev = exp.evaluate()
        lam = sorted(exp.lambda_hat().tolist())
        rows.append(
            {
                "seed": seed,
                "step": exp.step,
                "seconds": time.perf_counter() - started,
                "loss": m["loss"],
                "r2": ev["r2"],
                **{c: ev[c] for c in (r2_block_column(5), r2_block_column(25))},
                "lambda_hat_low": sum(lam[:5]) / 5,
                "lambda_hat_high": sum(lam[5:]) / 5,
                "lambda_hat": " ".join(f"{v:.2f}" for v in lam),
            }
        )
        print(
            f"  seed {seed} step {exp.step}: r2 {ev['r2']:.4f} loss {m['loss']:.4f} Λ̂ [{rows[-1]['lambda_hat']}]",
            flush=True,
        )
    return rows


def bench_generator_build(dims=(2, 5, 10, 20, 40, 60), seeds=(0, 1, 2)) -> list[dict]:
    """Seconds to build the papers' g (threshold = minimum of 25 000 draws, 3 layers) per d, uncached."""
    from ablate.core import generator

    rows = []
    for d in dims:
        for seed in seeds:
            generator._generator_weights.cache_clear()
            t = time.perf_counter()
            g = generator.build_generator(d, seed=seed)
            rows.append(
                {
                    "d": d,
                    "seed": seed,
                    "build_s": time.perf_counter() - t,
                    "threshold": g.info.threshold,
                    "max_layer_cond": max(g.info.layer_conditions),
                    "draws": g.info.draws,
                    "pools": g.info.pools,
                }
            )
    return rows


def _print(title: str, rows: list[dict]) -> None:
    print(f"\n## {title}")
    if not rows:
        return
    cols = list(rows[0])
    fmt = [f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for r in rows for c in cols]
    cells = [fmt[i * len(cols) : (i + 1) * len(cols)] for i in range(len(rows))]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print(" | ".join(c.rjust(w) for c, w in zip(cols, widths)))
    print(" | ".join("-" * w for w in widths))
    for row in cells:
        print(" | ".join(v.rjust(w) for v, w in zip(row, widths)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks")
    p.add_argument("--quick", action="store_true", help="fewer steps and sizes")
    p.add_argument(
        "--only",
        default="step,sampler,memory,ray",
        help="comma-separated parts; time_to_r2 (opt-in) trains the bimodal setting up to --budget s",
    )
    p.add_argument("--ray-grid", default="batch_vs_dim")
    p.add_argument("--ray-scale", default="smoke")
    p.add_argument("--preset", default="fast", help="time_to_r2: the preset to train with ('reference' = defaults)")
    p.add_argument("--budget", type=float, default=600.0, help="time_to_r2: seconds before giving up")
    p.add_argument("--curve", help="time_to_r2: also write seconds,step,r2 per report to this CSV file")
    p.add_argument("--seeds", default="0", help="time_to_r2 and reference_curve: comma-separated seeds")
    p.add_argument("--steps", type=int, default=10_000, help="reference_curve: training steps")
    p.add_argument("--run-dirs", default="", help="overhead: comma-separated finished run directories")
    p.add_argument("--slots", type=int, help="overhead: trial slots the runs had (default: CPUs)")
    p.add_argument("--trials", type=int, help="bookkeeping (default 1000) and chaos (default 16): smoke trials")
    p.add_argument("--kill-every", type=float, default=5.0, help="chaos: seconds between kills")
    p.add_argument("--reports", type=int, default=100, help="object_store: reports of the measured trial's log")
    p.add_argument("--status-trials", type=int, default=4, help="object_store: trials of the run `ablate status` reads")
    p.add_argument(
        "--record",
        default="local",
        help="bookkeeping: comma-separated records to run the grid with, local and/or s3 (moto's S3 server on "
        "127.0.0.1); with s3, a row per record, each run in a fresh process, with the ratio to local and S3's requests",
    )
    p.add_argument("--grids", default="tricl,batch_vs_dim", help="shared_ray: comma-separated grids")
    p.add_argument("--scale", default="smoke", help="shared_ray: the grids' scale")
    p.add_argument("--pid", type=int, help="ray_cpu: sample this running `ablate run` (its driver) instead")
    p.add_argument("--window", type=float, default=300.0, help="ray_cpu with --pid: seconds to sample")
    args = p.parse_args(argv)
    parts = set(args.only.split(","))
    print(
        f"# ablate benchmarks: torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}"
    )
    if "step" in parts:
        peak = matmul_rate()
        print(f"\nmeasured fp32 matmul rate (2048³): {peak:.1f} GFLOP/s")
        steps = 5 if args.quick else 20
        rows = []
        sizes = [(1000, 10)] if args.quick else [(1000, 10), (4096, 10), (8192, 10), (1000, 20), (1000, 40)]
        for batch, d in sizes:
            r = bench_step(batch, d, steps if batch <= 1000 else max(3, steps // 4))
            r["ratio_to_peak"] = r["gflops"] / peak
            rows.append(r)
        _print("training step, reference encoder, AnInfoNCE", rows)
    if "compile" in parts:  # opt-in: torch.compile of the step on the CPU (benchmarks/compile_step.py)
        from benchmarks.compile_step import compile_rows

        _print(
            "training step, eager and torch.compile", compile_rows(matmul_rate(), 20 if args.quick else 60, step_flops)
        )
    if "pair_loss" in parts:  # opt-in: the CPU exp clamp on moderate and sharp logits
        rows = [bench_pair_loss(2048, d, w, clamp) for d in (4, 10) for w in (5.0, 400.0) for clamp in (False, True)]
        _print("fused pair loss (forward with its gradient), normalised h, Λ̂ = λ·I, this process's torch threads", rows)
    if "prefetch" in parts:  # opt-in: the batch prefetch thread, alone and beside another trial
        from benchmarks.prefetch import bench_prefetch

        _print(
            "ms per step with and without drawing the next batch in a second thread (1 torch thread)",
            bench_prefetch(20 if args.quick else 60),
        )
    if "syncs" in parts:  # opt-in: host syncs and aten ops per solo and pack step (benchmarks/step_ops.py)
        from benchmarks.step_ops import rows as sync_rows

        _print(
            "host syncs and aten ops per step, solo and packs on the batched path, B = 64, d = 10",
            sync_rows([0, 1, 8, 32], 64, 10, ["adaptive", "fixed"]),
        )
    if "sampler" in parts:
        rows = [bench_sampler(d, lam) for d in (10, 20) for lam in (5.0, 25.0, 75.0)]
        _print("conditional sampler (threshold 0.1)", rows)
    if "memory" in parts:
        _print("peak memory of one trial (process RSS)", [bench_memory(b) for b in (1000, 8192)])
    if "ray" in parts:
        _print("Ray overhead", [bench_ray(args.ray_grid, args.ray_scale)])
    if "overhead" in parts:  # opt-in: reads finished runs
        from benchmarks.ray_scale import run_overhead

        _print("Ray overhead of finished runs", [run_overhead(d, args.slots) for d in args.run_dirs.split(",") if d])
    if "threads" in parts:  # opt-in: does a trial's result depend on its torch thread count?
        from benchmarks.ray_scale import bench_thread_determinism

        _print("the same seeded trial trained twice with 1 and twice with 2 torch threads", bench_thread_determinism())
    if "chaos" in parts:  # opt-in: a grid on a two-node cluster while trial processes and a node die
        from benchmarks.chaos import bench_chaos

        n = args.trials or 16
        _print(
            f"chaos: {n} smoke trials on a two-node cluster (1 CPU each), a trial process killed every "
            f"{args.kill_every:g} s, the worker node at the third kill",
            bench_chaos(n, args.kill_every),
        )
    if "bookkeeping" in parts:  # opt-in: N smoke trials through Ray Tune
        from benchmarks.ray_scale import bench_bookkeeping, bench_bookkeeping_records

        args.trials = args.trials or 1000

        records = tuple(args.record.split(","))
        title = f"bookkeeping: {args.trials} smoke trials on {os.cpu_count()} CPUs"
        if records == ("local",):
            _print(title, [bench_bookkeeping(args.trials)])
        else:
            from benchmarks.object_store import versions

            rows = bench_bookkeeping_records(args.trials, records)
            by_method = {r["record"]: r.pop("requests_by_method") for r in rows}
            _print(f"{title}, record: {', '.join(records)}", rows)
            for record, counts in by_method.items():
                if counts:
                    each = ", ".join(f"{m} {n} ({n / args.trials:.3g}/trial)" for m, n in counts.items())
                    print(f"{record} requests by method: {each}")
            print(versions())
    if "shared_ray" in parts:  # opt-in: one Ray per grid against one Ray for several grids
        from benchmarks.ray_scale import bench_shared_ray

        grids = args.grids.split(",")
        _print(
            f"{len(grids)} grids ({args.scale}): one `ablate run` each against one `ablate run` of all",
            bench_shared_ray(grids, args.scale),
        )
    if "ray_cpu" in parts:  # opt-in: CPU seconds per process role of an `ablate run` (Linux /proc)
        from benchmarks.ray_cpu import bench_ray_cpu, bench_running

        rows = bench_running(args.pid, args.window) if args.pid else bench_ray_cpu(args.ray_grid, args.ray_scale)
        _print("where the cores go during `ablate run` (CPU seconds per process role)", rows)
    if "object_store" in parts:  # opt-in: a run's writes and reads on moto's S3 server (benchmarks/object_store.py)
        from benchmarks.object_store import bench_driver_capacity, bench_object_store, versions

        _print(
            "object storage: requests (moto's log), bytes (what the code writes and reads) and ms, S3 against local",
            bench_object_store(
                reports=20 if args.quick else args.reports,
                checkpoints=5 if args.quick else 10,
                trials=args.status_trials,
            ),
        )
        _print("the driver's reports through a proxy adding 30 ms to every request", [bench_driver_capacity()])
        print(versions())
    if "profile" in parts:  # opt-in
        _print("profile of the reference step (B = 1000, d = 10)", bench_profile())
    seeds = [int(s) for s in args.seeds.split(",")]
    if "generator" in parts:  # opt-in: builds g from scratch for d up to 60
        _print("building the papers' g (25 000-draw pool, its minimum as threshold, 3 layers)", bench_generator_build())
    if "time_to_r2" in parts:  # opt-in: it runs up to --budget seconds per seed
        _print(
            f"time to R² on the bimodal setting (Λ = 5/25, d = 10), preset {args.preset}",
            [bench_time_to_r2(args.preset, args.budget, seed=s, curve=args.curve) for s in seeds],
        )
    if "reference_curve" in parts:  # opt-in: 10k reference steps per seed (~20 min each on 2 cores)
        rows = [r for s in seeds for r in bench_reference_curve(s, args.steps)]
        _print(
            "reference curve: RunConfig defaults (the reference code's settings) on the papers' g, a g per seed",
            [{k: v for k, v in r.items() if k != "lambda_hat"} for r in rows],
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
