"""`python -m benchmarks.gpu_check OUT_DIR [--quick]`: the prepared GPU check (issue: the cluster path, measured).

One script, no Ray, Optuna or Plotly (a GPU machine may lack them; pydantic and PyYAML are needed). It writes
markdown tables and raw JSON to OUT_DIR and prints them:

- ``limit``: nvidia-smi, then this GPU's fp32 and tf32 matmul rates at 4096³ and 8192³;
- ``step``: ms per training step at the reference setting (d = 10, B = 1000) and at B = 8192, fp32 and tf32,
  with the ratio of achieved matmul FLOP/s to the measured limit;
- ``packing``: aggregate training steps/s of k = 1, 2, 4, 8 processes sharing the GPU (what
  ``--gpus-per-trial 1/k`` does), and the alternatives on the same card: the step captured as a CUDA graph,
  and k grid points trained as one batched model (one process, batched matmuls);
- ``science``: the reference curve (R², loss, Λ̂ every 1000 steps for 10 000 steps, 3 seeds, fp32 and one
  tf32 seed) and seconds to R² 0.9 / 0.95 / 0.99 on the bimodal setting.
- ``claim9`` (opt-in, ``--only claim9 --claim9-budget S``): Zimmermann et al. 2021 Table 1 row 1 (InfoNCE,
  reference layout, vMF κ = 1, τ = 1, d = 10) at the reference batch 6144, trained until R² ≥ 0.99 or S seconds
  per setting: the reference optimiser (reference encoder, lr 1e-4) and the laptop's (slim encoder, constant
  lr 1.3e-3); steps and seconds to R² 0.9 / 0.95 / 0.99, the smallest budget that reaches the claim.

Without CUDA every part prints "no CUDA device: skipping …" and the script still writes its summary, so it can be
tested on a CPU machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.batched import BatchedAnInfoNCEModels

#: The bimodal reference setting (Rusak et al. 2024 Sec. 4.1, reference code's optimiser settings).
REFERENCE = {"latent_dim": 10, "concentration": "5/25", "loss": "aninfonce", "batch_size": 1000}
#: The hand probe of the generator issue (constant lr 5e-4, lr_lambda 5e-3): R² 0.983 at 5000 steps on 2 cores.
PROBE = {**REFERENCE, "lr": 5e-4, "lr_lambda": 5e-3}


def _cuda() -> bool:
    return torch.cuda.is_available()


def _skip(part: str) -> list[dict]:
    print(f"no CUDA device: skipping {part}", flush=True)
    return []


def _table(title: str, rows: list[dict]) -> str:
    if not rows:
        return f"\n### {title}\n(skipped: no CUDA device)\n"
    cols = list(rows[0])
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = [f"\n### {title}", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ limit
def matmul_tflops(n: int, tf32: bool, repeats: int = 20) -> float:
    """Best-of-``repeats`` fp32 (or tf32) n×n×n matmul rate in TFLOP/s, timed with CUDA events."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    torch.backends.cuda.matmul.allow_tf32 = False
    return 2 * n**3 / best / 1e12


def part_limit(out: Path) -> list[dict]:
    if not _cuda():
        return _skip("the GPU's matmul limit")
    smi = shutil.which("nvidia-smi")
    text = subprocess.run([smi], capture_output=True, text=True).stdout if smi else "nvidia-smi not found"
    (out / "nvidia_smi.txt").write_text(text)
    print(text, flush=True)
    return [
        {"n": n, "precision": "tf32" if tf32 else "fp32", "tflops": matmul_tflops(n, tf32)}
        for n in (4096, 8192)
        for tf32 in (False, True)
    ]


# ------------------------------------------------------------------- step
def _experiment(settings: dict, seed: int = 0):
    from ablate.config import RunConfig
    from ablate.core.experiment import Experiment

    return Experiment(RunConfig.build({**settings, "seed": seed, "device": "cuda"}, "gpu_check"))


def _step_flops(exp) -> float:
    cfg = exp.config
    rows = 2 * cfg.batch_size
    gen = sum(2 * rows * layer.in_features * layer.out_features for layer in exp.generator.layers)
    return 3 * exp.encoder.matmul_flops(rows) + gen + 3 * 2 * rows * rows * cfg.latent_dim


def ms_per_step(exp, steps: int) -> float:
    exp.train(10)
    torch.cuda.synchronize()
    t = time.perf_counter()
    exp.train(steps)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / steps * 1e3


def part_step(limits: list[dict], quick: bool) -> list[dict]:
    if not _cuda():
        return _skip("the training step")
    peak = {r["precision"]: r["tflops"] for r in limits if r["n"] == 8192}
    rows = []
    cases = [(b, tf32, "adaptive") for b in (1000, 8192) for tf32 in (False, True)] + [(1000, False, "fixed")]
    for batch, tf32, sampler in cases:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        exp = _experiment({**REFERENCE, "batch_size": batch, "sampler": sampler})
        ms = ms_per_step(exp, 50 if quick else 200)
        tflops = _step_flops(exp) / (ms / 1e3) / 1e12
        prec = "tf32" if tf32 else "fp32"
        rows.append(
            {
                "batch": batch,
                "sampler": sampler,
                "precision": prec,
                "ms_per_step": ms,
                "tflops": tflops,
                "ratio_to_limit": tflops / peak[prec],
            }
        )
    torch.backends.cuda.matmul.allow_tf32 = False
    return rows


# ---------------------------------------------------------------- packing
def _packing_child(seconds: float, start_at: float) -> None:
    """One trial-like process: train the reference setting from ``start_at`` for ``seconds``; print steps."""
    torch.set_num_threads(1)
    exp = _experiment(REFERENCE)
    exp.train(20)
    torch.cuda.synchronize()
    while time.time() < start_at:
        time.sleep(0.01)
    t0 = time.perf_counter()
    steps = 0
    while time.perf_counter() - t0 < seconds:
        exp.train(25)
        steps += 25
    torch.cuda.synchronize()
    print(json.dumps({"steps": steps, "seconds": time.perf_counter() - t0}), flush=True)


def packed_processes(k: int, seconds: float) -> dict:
    start_at = time.time() + 12.0 + 1.5 * k  # every child has built its experiment and warmed up by then
    code = f"from benchmarks.gpu_check import _packing_child; _packing_child({seconds}, {start_at})"
    root = Path(__file__).resolve().parents[1]
    procs = [
        subprocess.Popen([sys.executable, "-c", code], cwd=root, stdout=subprocess.PIPE, text=True) for _ in range(k)
    ]
    results = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    late = max(0.0, time.time() - start_at - seconds - 5)
    total = sum(r["steps"] / r["seconds"] for r in results)
    return {
        "how": "processes",
        "k": k,
        "steps_per_s_total": total,
        "steps_per_s_each": total / k,
        "note": f"children started {late:.0f} s late" if late > 0 else "",
    }


def cuda_graph_step(seconds: float) -> dict:
    """The reference step's f∘g forward, loss, backward and Adam captured as one CUDA graph (the latents are
    sampled outside the graph into static buffers each step)."""
    exp = _experiment(REFERENCE)
    for group in exp.optimizer.param_groups:
        group["capturable"] = True
    b = exp.config.batch_size
    lat = exp.sample_latents(b, exp.data_rng, hard_negatives=False)
    static = [t.clone() for t in lat["pairs"][0]]

    def step():
        exp.optimizer.zero_grad(set_to_none=False)
        loss = exp.compute_loss({"pairs": [tuple(static)], "negatives": None})
        loss.backward()
        exp.optimizer.step()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(5):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    exp.optimizer.zero_grad(set_to_none=False)
    with torch.cuda.graph(graph):
        step()
    torch.cuda.synchronize()
    t0, steps = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        for _ in range(25):
            z, z_pos = exp.sample_latents(b, exp.data_rng, hard_negatives=False)["pairs"][0]
            static[0].copy_(z)
            static[1].copy_(z_pos)
            graph.replay()
        steps += 25
    torch.cuda.synchronize()
    rate = steps / (time.perf_counter() - t0)
    return {"how": "CUDA graph (1 process)", "k": 1, "steps_per_s_total": rate, "steps_per_s_each": rate, "note": ""}


def batched_models(k: int, seconds: float) -> dict:
    """k grid points (seeds) of the reference setting trained as one batched model in one process."""
    torch.manual_seed(0)
    models = BatchedAnInfoNCEModels(k, d=10, batch=1000, concentration=[5.0] * 5 + [25.0] * 5, device="cuda")
    models.train(20)
    torch.cuda.synchronize()
    t0, steps = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        models.train(25)
        steps += 25
    torch.cuda.synchronize()
    rate = steps / (time.perf_counter() - t0)
    return {"how": "one batched model", "k": k, "steps_per_s_total": rate * k, "steps_per_s_each": rate, "note": ""}


def _guarded(how: str, k: int, fn, *args) -> dict:
    """Run one alternative; a failure becomes a row that says why instead of ending the check."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - report, do not stop the other measurements
        return {
            "how": how,
            "k": k,
            "steps_per_s_total": float("nan"),
            "steps_per_s_each": float("nan"),
            "note": f"failed: {type(exc).__name__}: {str(exc)[:200]}",
        }


def part_packing(quick: bool) -> list[dict]:
    if not _cuda():
        return _skip("packing trials on one GPU")
    seconds = 5.0 if quick else 15.0
    rows = [packed_processes(k, seconds) for k in ((1, 2) if quick else (1, 2, 4, 8))]
    rows.append(_guarded("CUDA graph (1 process)", 1, cuda_graph_step, seconds))
    rows += [_guarded("one batched model", k, batched_models, k, seconds) for k in ((1, 8) if quick else (1, 8, 32))]
    single = rows[0]["steps_per_s_total"]
    for r in rows:
        r["x_single_trial"] = r["steps_per_s_total"] / single
    return rows


# ---------------------------------------------------------------- science
def _curve_child(seed: int, steps: int, every: int, tf32: bool) -> None:
    torch.set_num_threads(2)
    torch.backends.cuda.matmul.allow_tf32 = tf32
    exp = _experiment({**REFERENCE, "generator_seed": seed}, seed)
    t0 = time.perf_counter()
    rows = []
    while exp.step < steps:
        m = exp.train(every)
        ev = exp.evaluate()
        lam = sorted(exp.lambda_hat().tolist())
        rows.append(
            {
                "seed": seed,
                "precision": "tf32" if tf32 else "fp32",
                "step": exp.step,
                "seconds": round(time.perf_counter() - t0, 1),
                "loss": m["loss"],
                "r2": ev["r2"],
                "lambda_hat_low": sum(lam[:5]) / 5,
                "lambda_hat_high": sum(lam[5:]) / 5,
                "g_linear_r2": ev["g_linear_r2"],
            }
        )
    print(json.dumps(rows), flush=True)


def reference_curves(seeds: list[int], steps: int, every: int, tf32_seed: int | None) -> list[dict]:
    """The reference setting (defaults: lr 1e-4, lr_lambda 1e-3, reference encoder, B = 1000), one process per
    seed in parallel (R² per step does not depend on timing); a new g per seed, as the reference code draws."""
    root = Path(__file__).resolve().parents[1]
    jobs = [(s, False) for s in seeds] + ([(tf32_seed, True)] if tf32_seed is not None else [])
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"from benchmarks.gpu_check import _curve_child; _curve_child({s}, {steps}, {every}, {tf32})",
            ],
            cwd=root,
            stdout=subprocess.PIPE,
            text=True,
        )
        for s, tf32 in jobs
    ]
    rows = []
    for p in procs:
        rows += json.loads(p.communicate()[0].strip().splitlines()[-1])
    return rows


def time_to_r2(
    settings: dict, seed: int, budget_s: float, targets=(0.9, 0.95, 0.99), every: int = 250, max_steps: int = 100_000
) -> dict:
    """Train until every target R² is reached or ``budget_s`` passes; seconds and steps to each target."""
    exp = _experiment({**settings, "generator_seed": 0, "max_steps": max_steps}, seed)
    reached: dict[float, tuple[float, int]] = {}
    best, t0 = 0.0, time.perf_counter()
    while time.perf_counter() - t0 < budget_s and len(reached) < len(targets) and exp.step < max_steps:
        exp.train(every)
        r2 = exp.evaluate()["r2"]
        best = max(best, r2)
        for t in targets:
            if r2 >= t and t not in reached:
                reached[t] = (time.perf_counter() - t0, exp.step)
    row = {"seed": seed, "steps": exp.step, "wall_s": time.perf_counter() - t0, "best_r2": best}
    nan = (float("nan"), float("nan"))
    row.update({f"s_to_{t:g}": reached.get(t, nan)[0] for t in targets})
    row.update({f"steps_to_{t:g}": reached.get(t, nan)[1] for t in targets})
    return row


#: Zimmermann et al. 2021 Table 1 row 1 as ablate's zimmermann_sphere grid runs it (matched vMF κ = 1).
CLAIM9 = {
    "latent_dim": 10,
    "loss": "infonce",
    "tau": 1.0,
    "infonce_layout": "reference",
    "conditional": "vmf",
    "kappa": 1.0,
    "concentration": 400,
    "batch_size": 6144,
}
#: The two optimisers tried: the reference code's (RunConfig defaults) and the laptop probe's best
#: (docs/probes/claim9_probe.yaml: slim encoder, constant lr 1.3e-3 after 250 warm-up steps).
CLAIM9_OPTIMISERS = {
    "reference": {},
    "slim_lr1.3e-3": {"encoder_widths": [10, 10, 10], "lr": 1.3e-3, "lr_schedule": "constant", "warmup_steps": 250},
}


def part_claim9(budget_s: float, every: int) -> list[dict]:
    """Claim 9 at the reference batch on the GPU: seconds and steps to R² 0.9 / 0.95 / 0.99 per optimiser."""
    if not _cuda():
        return _skip("claim 9 at the reference batch")
    rows = []
    for name, optimiser in CLAIM9_OPTIMISERS.items():
        row = time_to_r2({**CLAIM9, **optimiser}, 0, budget_s, every=every, max_steps=300_000)
        rows.append({"optimiser": name, **row})
    return rows


def part_science(quick: bool, settings: dict) -> tuple[list[dict], list[dict]]:
    if not _cuda():
        return _skip("the science at GPU speed"), []
    curves = reference_curves(
        [0] if quick else [0, 1, 2], 500 if quick else 10_000, 250 if quick else 1000, None if quick else 0
    )
    timed = [time_to_r2(settings, seed, 20 if quick else 45) for seed in ((0,) if quick else (0, 1, 2))]
    return curves, timed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check")
    p.add_argument("out", help="folder for the tables (markdown) and raw results (JSON)")
    p.add_argument("--quick", action="store_true", help="short versions of every part (a smoke test)")
    p.add_argument("--only", default="limit,step,packing,science")
    p.add_argument("--set", nargs="*", default=[], help="time_to_r2 settings (key=value), on top of the probe's")
    p.add_argument("--claim9-budget", type=float, default=150.0, help="claim9: seconds per optimiser")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = set(args.only.split(","))
    started = time.time()
    device = torch.cuda.get_device_name(0) if _cuda() else "no CUDA device"
    header = (
        f"# ablate GPU check: {device}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
        f"{time.strftime('%Y-%m-%d %H:%M')}\n"
    )
    print(header, flush=True)
    results: dict[str, list[dict]] = {}
    titles = {
        "limit": "matmul limit (TFLOP/s)",
        "step": "training step (reference encoder, AnInfoNCE)",
        "packing": "aggregate steps/s with k trials on one GPU",
        "reference_curve": "reference curve (defaults, 10k steps; one process per seed)",
        "time_to_r2": "seconds to R² on the bimodal setting (probe settings unless --set)",
        "time_to_r2_settings": "settings of the time-to-R² runs",
        "claim9": "claim 9 (Zimmermann Table 1 row 1) at batch 6144: steps and seconds to R²",
    }

    def write() -> str:  # after every part, so a check cut short still returns what it measured
        text = header + "".join(_table(titles[k], v) for k, v in results.items())
        text += f"\ntotal wall time: {time.time() - started:.0f} s\n"
        (out / "gpu_check.md").write_text(text)
        (out / "gpu_check.json").write_text(json.dumps({"device": device, **results}, indent=1, default=str))
        return text

    if "limit" in parts or "step" in parts:
        results["limit"] = part_limit(out)
        write()
    if "step" in parts:
        results["step"] = part_step(results["limit"], args.quick)
        write()
    if "packing" in parts:
        results["packing"] = part_packing(args.quick)
        write()
    if "science" in parts:
        from ablate.config import parse_assignments

        settings = {**PROBE, **parse_assignments(args.set)}
        results["time_to_r2_settings"] = [settings]
        results["reference_curve"], results["time_to_r2"] = part_science(args.quick, settings)
        write()
    if "claim9" in parts:
        results["claim9"] = part_claim9(5 if args.quick else args.claim9_budget, 50 if args.quick else 1000)
    print(write(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
