"""The GPU check's service runs (``benchmarks/gpu_lease.py``): one real ``ablate run`` (Ray Tune, trial folders,
checkpoints) in a subprocess, measured over a wall-clock window.

:func:`timed_run` starts the run, waits for its trials' first reports, then measures for ``window_s`` seconds and
stops it with Ctrl-C (the run stops gracefully; nothing is lost), killing it ``stop_s`` later if it is still up.
The window opens when ``expected`` trials have reported (the trials that train at once: 8 for a pack of 8, 1 for
one trial at a time). A run whose trials send no report within ``first_report_s`` is stopped at once: a GPU trial
that Ray cannot place stays PENDING, and Tune only warns.

Rates, in member steps per second summed over the run's trials:

- ``wall``: Δ(Σ member steps) / Δt between the window's two ends, each sum read from the trials' result logs
  (their newest report). Everything a run spends is in it: checkpoint saves, evaluation, Ray's bookkeeping.
- ``compute``: Σ Δsteps / (Σ Δtime_total_s / expected), the time inside the Trainable's ``step()`` only.

The GPU's utilisation is sampled only inside the window.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ablate.service.records.trial_log import read_rows

ROOT = Path(__file__).resolve().parents[1]
GRIDS = ROOT / "benchmarks" / "grids"


@dataclass(frozen=True)
class RunSpec:
    """One measured ``ablate run``: its name, grid, extra arguments and how many trials train at once."""

    name: str
    grid: str
    args: list[str] = field(default_factory=list)
    expected: int = 1


#: Part 1: the same 8 points (the bimodal reference setting, 8 seeds) one trial per GPU, as 8 trials sharing it,
#: and packed as one trial.
PACK_RUNS = [
    RunSpec("one_trial_per_gpu", str(GRIDS / "gpu_pack8.yaml"), ["--gpus-per-trial", "1"], expected=1),
    RunSpec("fraction_0.125", str(GRIDS / "gpu_pack8.yaml"), ["--gpus-per-trial", "0.125"], expected=8),
    RunSpec("pack8", str(GRIDS / "gpu_pack8.yaml"), ["--pack", "8", "--gpus-per-trial", "1"], expected=8),
    # the pack step of 2026-11-28 with its fixed-shape sampler: one host read per step (docs/performance.md)
    RunSpec(
        "pack8_fixed_sampler", str(GRIDS / "gpu_pack8.yaml"),
        ["--pack", "8", "--gpus-per-trial", "1", "--set", "sampler=fixed"], expected=8,
    ),
]  # fmt: skip
#: Part 2: 32 points with ``--pack auto``.
PACK_AUTO = RunSpec("pack_auto_32", str(GRIDS / "gpu_pack32.yaml"), ["--pack", "auto", "--gpus-per-trial", "1"], 32)
#: Part 2: claim 9 (Zimmermann et al. 2021 Table 1 row 1 at the reference batch 6144, its seeds in one pack) and
#: claim 1's hardest point (Λ = 5/200 at batch 8192).
SCIENCE_RUNS = [
    RunSpec("claim9", "zimmermann_sphere", ["--variants", "vmf_kappa1", "--pack", "8", "--gpus-per-trial", "1",
                                            "--set", "report_every=250"], expected=5),
    RunSpec("claim1", str(ROOT / "docs" / "probes" / "claim1_lambda200.yaml"),
            ["--scale", "laptop", "--variants", "b8192_8k", "--gpus-per-trial", "1", "--set", "report_every=250"], 1),
]  # fmt: skip


class GpuSampler:
    """Samples the GPU's utilisation (%) and memory (MiB) every 0.5 s with nvidia-smi, each with its time."""

    def __init__(self):
        self.samples: list[tuple[float, float, float]] = []
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
            self.samples.append((time.time(), util, mem))

    def __exit__(self, *exc):
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)

    def between(self, start: float, end: float) -> dict[str, float]:
        """Mean utilisation and most memory of the samples taken from ``start`` to ``end``."""
        inside = [(u, m) for t, u, m in self.samples if start <= t <= end]
        if not inside:
            return {}
        return {"gpu_util_pct": sum(u for u, _ in inside) / len(inside), "gpu_mem_mib": max(m for _, m in inside)}


def member_logs(run_dir: Path) -> dict[str, list[dict]]:
    """trial folder → its result log's rows (a pack's folder is left out: its members have folders of their own)."""
    return {
        d.name: read_rows(d / "result.json")
        for d in sorted(run_dir.glob("trial_*"))
        if not (d / "pack.json").exists() and (d / "result.json").exists()
    }


def _snapshot(run_dir: Path) -> dict[str, tuple[int, float]]:
    """trial → (step, time_total_s) of its newest report, for the trials that have reported."""
    out = {}
    for name, rows in member_logs(run_dir).items():
        if rows:
            out[name] = (int(rows[-1].get("step", 0)), float(rows[-1].get("time_total_s") or 0.0))
    return out


def _checkpoint_mib(run_dir: Path) -> float:
    """The largest checkpoint folder in the run, in MiB (a pack's holds every member's weights)."""
    sizes = [sum(f.stat().st_size for f in c.rglob("*") if f.is_file()) for c in run_dir.glob("trial_*/checkpoint_*")]
    return max(sizes, default=0) / 2**20


def rates(start: dict[str, tuple[int, float]], end: dict[str, tuple[int, float]], seconds: float, expected: int):
    """(wall, compute) member steps/s between two snapshots ``seconds`` apart (see the module docstring)."""
    steps = sum(s for s, _ in end.values()) - sum(s for s, _ in start.values())
    busy = sum(t - start.get(name, (0, 0.0))[1] for name, (_, t) in end.items())
    wall = steps / seconds if seconds > 0 else float("nan")
    compute = steps / (busy / expected) if busy > 0 else float("nan")
    return wall, compute


def _stop(proc: subprocess.Popen, stop_s: float) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=stop_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def timed_run(spec: RunSpec, work: Path, window_s: float, first_report_s: float = 90, stop_s: float = 45) -> dict:
    """Run ``spec`` under ``work`` (runs/ and logs/), measure it over a ``window_s`` window, stop it; its row."""
    runs, log = work / "runs", work / "logs" / f"{spec.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    run_dir = runs / spec.name
    cmd = [sys.executable, "-m", "ablate.cli", "run", spec.grid, "--storage", str(runs), "--name", spec.name,
           "--no-dashboard", "--no-report", "--yes", *spec.args]  # fmt: skip
    if "--scale" not in spec.args:
        cmd += ["--scale", "paper"]
    note, started = "", time.time()
    opened = closed = None
    with log.open("w") as f, GpuSampler() as gpu:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        while proc.poll() is None:
            now, snap = time.time(), _snapshot(run_dir)
            if opened is None:
                late = now - started > first_report_s
                if len(snap) >= spec.expected or (late and snap):
                    opened = (now, snap)
                    if len(snap) < spec.expected:
                        note = f"{len(snap)} of {spec.expected} trials reported within {first_report_s:.0f} s"
                elif late:
                    note = f"no report within {first_report_s:.0f} s: stopped"
                    break
            elif now - opened[0] >= window_s:
                closed = (now, snap)
                break
            time.sleep(0.25)
        if opened is not None and closed is None:  # the run ended (or failed) inside the window
            closed = (time.time(), _snapshot(run_dir))
            note = note or f"the run ended {closed[0] - opened[0]:.0f} s into the window"
        code = _stop(proc, stop_s)
        util = gpu.between(opened[0], closed[0]) if opened else {}
    logs = member_logs(run_dir) if run_dir.exists() else {}
    intact = all([r.get("training_iteration") for r in rows] == list(range(1, len(rows) + 1)) for rows in logs.values())
    row = {"run": spec.name, "exit": code, "trials": f"{len(closed[1]) if closed else 0}/{spec.expected}"}
    if opened and closed:
        seconds = closed[0] - opened[0]
        wall, compute = rates(opened[1], closed[1], seconds, spec.expected)
        row.update({"window_s": round(seconds, 1), "steps_per_s_wall": wall, "steps_per_s_compute": compute})
    row.update({k: round(v, 1) for k, v in util.items()})
    row.update({"ckpt_mib": round(_checkpoint_mib(run_dir), 1) if run_dir.exists() else 0, "intact": intact})
    row["wall_s"] = round(time.time() - started, 1)
    if code not in (0, 130) and not note:
        note = "exit " + str(code) + ": " + " | ".join(log.read_text().splitlines()[-3:])[-300:]
    row["note"] = note
    return row


def science_curve(run_dir: Path) -> list[dict]:
    """Every report of every trial of a science run: R² (and each Λ block's R²) against step and seconds of
    training; a trial is named by its axes and seed."""
    rows = []
    for trial, reports in member_logs(run_dir).items():
        for r in reports:
            rows.append({"trial": trial.removeprefix("trial_").rsplit("-", 1)[0], "step": r.get("step"),
                         "time_s": round(float(r.get("time_total_s") or 0), 1), "r2": r.get("r2"),
                         **{k: v for k, v in r.items() if k.startswith("r2_lambda_")}})  # fmt: skip
    return rows


def time_to(curve: list[dict], targets=(0.9, 0.95, 0.99)) -> list[dict]:
    """Per trial of a science run: its last step, best R², and the step and seconds at which R² first reached
    each target (blank where it did not)."""
    out = []
    for trial in dict.fromkeys(r["trial"] for r in curve):
        rows = [r for r in curve if r["trial"] == trial and isinstance(r.get("r2"), float)]
        if not rows:
            continue
        row = {
            "trial": trial,
            "steps": rows[-1]["step"],
            "time_s": rows[-1]["time_s"],
            "best_r2": max(r["r2"] for r in rows),
        }
        for t in targets:
            hit = next((r for r in rows if r["r2"] >= t), None)
            row[f"to_{t:g}"] = f"{hit['step']} st / {hit['time_s']} s" if hit else ""
        out.append(row)
    return out
