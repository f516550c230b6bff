"""`python -m benchmarks.gpu_service OUT_DIR [--only PARTS] [--budget S]`: the GPU check's parts that run the service.

Each part is a real `ablate run` (Ray Tune, trial folders, checkpoints) in a subprocess, time-boxed: after the first
report it trains for ``--budget`` seconds, then gets Ctrl-C (the run stops gracefully, nothing is lost). Tables go to
OUT_DIR/gpu_service.md and .json, the runs to OUT_DIR/runs/.

- ``ray_smoke``: `ablate run batch_vs_dim --scale smoke --no-dashboard` (the pruned Ray carried to a machine with
  no network, ``benchmarks/gpu_check.sh``): does Ray Tune run here at all? It runs on a CPU machine too.
- ``pack``: 8 points of the bimodal reference setting (benchmarks/grids/gpu_pack8.yaml) packed (``--pack 8``), as 8
  trials sharing the GPU (``--gpus-per-trial 0.125``) and one trial at a time (``--gpus-per-trial 1``); then 32
  points with ``--pack auto`` (gpu_pack32.yaml). Aggregate member steps/s (each trial's steps over its training
  time, summed over the trials that trained at once), the GPU's mean utilisation, and whether every trial's
  reports run 1..N (nothing lost).
- ``claim9``: Zimmermann et al. Table 1 row 1 at the reference batch 6144, its 5 seeds in one pack: R² against
  steps and seconds.
- ``claim1``: claim 1's hardest point, Λ = 5/200 at batch 8192 (docs/probes/claim1_lambda200.yaml, b8192_8k).

Without CUDA the GPU parts print "no CUDA device: skipping …".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRIDS = ROOT / "benchmarks" / "grids"

#: name → (grid, extra `ablate run` arguments): the runs of the ``pack`` part, in order.
PACK_RUNS = {
    "pack8": (GRIDS / "gpu_pack8.yaml", ["--pack", "8", "--gpus-per-trial", "1"]),
    "fraction_0.125": (GRIDS / "gpu_pack8.yaml", ["--gpus-per-trial", "0.125"]),
    "one_trial_per_gpu": (GRIDS / "gpu_pack8.yaml", ["--gpus-per-trial", "1"]),
    "pack_auto_32": (GRIDS / "gpu_pack32.yaml", ["--pack", "auto", "--gpus-per-trial", "1"]),
}
SCIENCE_RUNS = {
    "claim9": ("zimmermann_sphere", ["--scale", "paper", "--variants", "vmf_kappa1", "--pack", "8",
                                     "--gpus-per-trial", "1", "--set", "report_every=250"]),
    "claim1": (str(ROOT / "docs" / "probes" / "claim1_lambda200.yaml"),
               ["--scale", "laptop", "--variants", "b8192_8k", "--gpus-per-trial", "1", "--set", "report_every=250"]),
}  # fmt: skip


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


class GpuSampler:
    """Samples the GPU's utilisation (%) and memory (MiB) every 0.5 s with nvidia-smi while a run trains."""

    def __init__(self):
        self.samples: list[tuple[float, float]] = []
        self._proc = None

    def __enter__(self):
        if shutil.which("nvidia-smi"):
            cmd = [
                "nvidia-smi",
                "--query-gpu=utilization.gpu,memory.used",
                "--format=csv,noheader,nounits",
                "-lms",
                "500",
            ]
            self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                util, mem = (float(x) for x in line.split(",")[:2])
            except ValueError:
                continue
            self.samples.append((util, mem))

    def __exit__(self, *exc):
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)

    def summary(self) -> dict[str, float]:
        if not self.samples:
            return {}
        utils = [u for u, _ in self.samples]
        return {"gpu_util_mean_pct": sum(utils) / len(utils), "gpu_mem_max_mib": max(m for _, m in self.samples)}


def _member_rows(run_dir: Path) -> dict[str, list[dict]]:
    """trial folder → its reports (pack folders left out: their members have folders of their own)."""
    out = {}
    for d in sorted(run_dir.glob("trial_*")):
        if (d / "pack.json").exists() or not (d / "result.json").exists():
            continue
        rows = []
        for line in (d / "result.json").read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        out[d.name] = rows
    return out


def timed_run(name: str, grid: str, extra: list[str], out: Path, budget_s: float, first_report_s: float = 240) -> dict:
    """One `ablate run` time-boxed to ``budget_s`` seconds after its first report, then Ctrl-C; its numbers."""
    runs = out / "runs"
    cmd = [sys.executable, "-m", "ablate.cli", "run", grid, "--storage", str(runs), "--name", name, "--no-dashboard",
           "--no-report", *extra]  # fmt: skip
    if "--scale" not in extra:
        cmd += ["--scale", "paper"]
    log = out / f"{name}.log"
    started = time.time()
    with log.open("w") as f, GpuSampler() as gpu:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + first_report_s
        while proc.poll() is None and time.time() < deadline and not any(_member_rows(runs / name).values()):
            time.sleep(0.5)
        trained_from = time.time()
        while proc.poll() is None and time.time() < trained_from + budget_s:
            time.sleep(0.5)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
    rows = _member_rows(runs / name)
    steps = {t: r[-1]["step"] for t, r in rows.items() if r}
    rates = [r[-1]["step"] / r[-1]["time_total_s"] for r in rows.values() if r and r[-1].get("time_total_s")]
    intact = all([x.get("training_iteration") for x in r] == list(range(1, len(r) + 1)) for r in rows.values())
    result = {
        "run": name,
        "exit": code,
        "wall_s": round(time.time() - started, 1),
        "trials_reporting": len(steps),
        "member_steps": sum(steps.values()),
        "agg_steps_per_s": round(sum(rates), 2) if rates else None,
        "reports_intact": intact,
        **{k: round(v, 1) for k, v in gpu.summary().items()},
    }
    if code not in (0, 130):
        result["error"] = log.read_text()[-400:].replace("\n", " | ")
    return result


def science_curve(name: str, out: Path) -> list[dict]:
    """Every report of every trial of a science run: R² against step and seconds of training."""
    rows = []
    for trial, reports in _member_rows(out / "runs" / name).items():
        for r in reports:
            rows.append({"trial": trial.removeprefix("trial_"), "step": r.get("step"), "time_s": round(r.get("time_total_s", 0), 1),
                         "r2": r.get("r2"), **{k: v for k, v in r.items() if k.startswith("r2_lambda_")}})  # fmt: skip
    return rows


def _table(title: str, rows: list[dict]) -> str:
    if not rows:
        return f"\n### {title}\n(skipped)\n"
    cols = list(dict.fromkeys(k for r in rows for k in r))
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = [f"\n### {title}", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return "\n".join(lines + ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_service")
    p.add_argument("out")
    p.add_argument("--only", default="ray_smoke,pack,claim9,claim1")
    p.add_argument("--budget", type=float, default=45.0, help="seconds of training per time-boxed run")
    p.add_argument("--science-budget", type=float, default=60.0, help="seconds of training for claim9 and claim1")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = args.only.split(",")
    cuda = _cuda()
    device = "no CUDA device"
    if cuda:
        import torch

        device = torch.cuda.get_device_name(0)
    results: dict[str, list[dict]] = {}
    header = f"# ablate GPU check, service parts: {device}, {time.strftime('%Y-%m-%d %H:%M')}\n"

    def write() -> None:
        text = header + "".join(_table(k, v) for k, v in results.items())
        (out / "gpu_service.md").write_text(text)
        (out / "gpu_service.json").write_text(json.dumps({"device": device, **results}, indent=1, default=str))

    ray_ok = True
    if "ray_smoke" in parts:
        row = timed_run("ray_smoke", "batch_vs_dim", ["--scale", "smoke"], out, budget_s=60, first_report_s=90)
        ray_ok = row["exit"] == 0
        results["ray_smoke"] = [row]
        print(("Ray Tune runs here" if ray_ok else f"Ray could not run here: {row.get('error')}"), flush=True)
        write()
    for part in ("pack", "claim9", "claim1"):
        if part not in parts:
            continue
        if not cuda:
            print(f"no CUDA device: skipping the service's {part} part", flush=True)
            continue
        if not ray_ok:
            print(f"Ray did not run in ray_smoke: skipping the service's {part} part", flush=True)
            continue
        if part == "pack":
            results["pack"] = []
            for name, (grid, extra) in PACK_RUNS.items():
                results["pack"].append(timed_run(name, str(grid), extra, out, args.budget))
                print(json.dumps(results["pack"][-1]), flush=True)
                write()
        else:
            grid, extra = SCIENCE_RUNS[part]
            results[f"{part}_run"] = [timed_run(part, grid, extra, out, args.science_budget)]
            results[f"{part}_curve"] = science_curve(part, out)
            print(json.dumps(results[f"{part}_run"]), flush=True)
            write()
    write()
    print((out / "gpu_service.md").read_text(), flush=True)
    return 0 if ray_ok else 1


if __name__ == "__main__":
    sys.exit(main())
