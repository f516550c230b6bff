"""`python -m benchmarks.gpu_lease OUT --part 1|2`: the GPU check in two parts that each fit one call to a lent GPU
machine (`bash benchmarks/gpu_check.sh OUT --part N` unpacks the offline bundle first, then runs this).

- part 1: Ray sees the GPU; the card's matmul limit and the single-trial training step; then the same 8 points
  one trial per GPU, as 8 trials sharing it (``--gpus-per-trial 0.125``) and as one pack of 8, each measured over
  a wall-clock window (``benchmarks/gpu_service.py``);
- part 2: 32 points with ``--pack auto``; claim 9 at batch 6144 and claim 1 at Λ₂ = 200 at batch 8192, R² against
  steps and seconds.

What a call returns is small (8 files, the output's last 12 000 characters), so the runs and their logs go to
``GPU_CHECK_WORK`` (default /tmp/ablate-gpu-check) and OUT gets at most five files, no folders: ``summary.md``
(at most 4 000 characters, printed last, the pack table at its end), ``logs_tail.txt``, ``results.json``,
``nvidia_smi.txt`` (part 1) and ``curves.md`` (part 2).

Every box has a budget in seconds that an environment variable shortens (defaults in :data:`BUDGETS`); a box that
would not fit in what is left of ``GPU_CHECK_PART_S`` is skipped with a line that says so. Without CUDA, or when
Ray sees no GPU, each GPU box says what it skips, so both parts dry-run on a CPU machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.gpu_service import PACK_AUTO, PACK_RUNS, ROOT, SCIENCE_RUNS, science_curve, time_to, timed_run

#: Seconds per box (env GPU_CHECK_<NAME> overrides): the whole part, a pack run's measured window, the wait for
#: a run's first report, the wait for a stopped run to exit, a science run's training time, the Ray probe, and
#: the training steps timed per row of the single-trial step.
BUDGETS = {"PART_S": 260, "WINDOW_S": 25, "FIRST_REPORT_S": 90, "STOP_S": 30, "SCIENCE_S": 70, "PROBE_S": 60,
           "STEPS": 200}  # fmt: skip
#: What one pack run is expected to take beyond its window (Ray's start, the first report, the stop).
RUN_OVERHEAD_S = 35
SUMMARY_CHARS = 4000


def budget(name: str) -> float:
    return float(os.environ.get(f"GPU_CHECK_{name}", BUDGETS[name]))


class Lease:
    """One part's clock, its lines (what ran, what was skipped and why) and its tables."""

    def __init__(self, out: Path, part: int):
        self.out, self.part, self.started = out, part, time.time()
        self.lines: list[str] = []
        self.tables: dict[str, list[dict]] = {}

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.lines.append(line)

    def left(self) -> float:
        return budget("PART_S") - (time.time() - self.started)

    def fits(self, box: str, seconds: float) -> bool:
        if seconds <= self.left():
            return True
        self.say(f"skipped {box}: it needs about {seconds:.0f} s and {max(self.left(), 0):.0f} s of the part are left")
        return False


def _device() -> tuple[bool, str]:
    import torch

    if not torch.cuda.is_available():
        return False, f"no CUDA device (torch {torch.__version__})"
    free, total = torch.cuda.mem_get_info()
    return True, f"{torch.cuda.get_device_name(0)} ({total / 2**30:.0f} GiB), torch {torch.__version__}"


def ray_gpus(lease: Lease) -> float:
    """Start Ray as `ablate run` does (headless) and count the GPUs it sees; 0 with the reason on failure."""
    code = (
        "import json, ray; from ablate.service.execution.cluster import init_ray; init_ray(None, dashboard=False); "
        "print(json.dumps({'ray': ray.__version__, **ray.cluster_resources()})); ray.shutdown()"
    )
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                              timeout=budget("PROBE_S"))  # fmt: skip
    except subprocess.TimeoutExpired:
        lease.say(f"ray: did not start within {budget('PROBE_S'):.0f} s")
        return 0
    if done.returncode != 0:
        lease.say("ray: could not start: " + " | ".join(done.stderr.strip().splitlines()[-6:]))
        return 0
    found = json.loads(done.stdout.strip().splitlines()[-1])
    lease.say(f"ray {found['ray']}: sees {found.get('GPU', 0):g} GPU(s), {found.get('CPU', 0):g} CPUs")
    return float(found.get("GPU", 0))


def _pack_table(rows: list[dict], baseline: str = "one_trial_per_gpu") -> list[dict]:
    base = next((r.get("steps_per_s_wall") for r in rows if r["run"] == baseline), None)
    for r in rows:
        if base and r.get("steps_per_s_wall"):
            r["x_one_trial"] = round(r["steps_per_s_wall"] / base, 2)
    return rows


def part_one(lease: Lease, cuda: bool, gpus: float) -> None:
    from benchmarks.gpu_check import part_limit, part_step

    if cuda and lease.fits("the matmul limit and the single-trial step", 40):
        limits = part_limit(lease.out)
        lease.tables["matmul limit (TFLOP/s)"] = limits
        lease.tables["single-trial step (reference encoder, AnInfoNCE)"] = part_step(limits, budget("STEPS") < 200)
    elif not cuda:
        lease.say("no CUDA device: skipping the matmul limit and the single-trial step")
    lease.tables["packs: 8 points, wall-clock window"] = _service_runs(lease, PACK_RUNS, gpus, budget("WINDOW_S"))
    _pack_table(lease.tables["packs: 8 points, wall-clock window"])


def part_two(lease: Lease, gpus: float) -> None:
    curves: list[dict] = []
    science = _service_runs(lease, SCIENCE_RUNS, gpus, budget("SCIENCE_S"), curves)
    lease.tables["claims 9 and 1: R² reached (per trial)"] = [r for c in curves for r in time_to(c["curve"])]
    lease.tables["claim runs"] = science
    text = "".join(_markdown(f"{c['run']}: R² against steps and seconds", c["curve"]) for c in curves)
    (lease.out / "curves.md").write_text(f"# GPU check part 2: curves\n{text or '(no curve: nothing ran)'}\n")
    lease.tables["packs: 32 points, --pack auto"] = _service_runs(lease, [PACK_AUTO], gpus, budget("WINDOW_S"))


def _service_runs(lease: Lease, specs, gpus: float, window_s: float, curves: list | None = None) -> list[dict]:
    work = Path(os.environ.get("GPU_CHECK_WORK", "/tmp/ablate-gpu-check"))
    rows = []
    only = [name for name in os.environ.get("GPU_CHECK_ONLY", "").split(",") if name]
    for spec in specs:
        if only and spec.name not in only:
            lease.say(f"GPU_CHECK_ONLY: skipping {spec.name}")
            continue
        if gpus < 1:
            lease.say(f"Ray sees no GPU: skipping {spec.name}")
            continue
        if not lease.fits(spec.name, window_s + RUN_OVERHEAD_S):
            continue
        row = timed_run(spec, work, window_s, budget("FIRST_REPORT_S"), budget("STOP_S"))
        print(json.dumps(row), flush=True)
        rows.append(row)
        if curves is not None:
            curves.append({"run": spec.name, "curve": science_curve(work / "runs" / spec.name)})
    return rows


def _markdown(title: str, rows: list[dict]) -> str:
    if not rows:
        return f"\n### {title}\n(none)\n"
    cols = list(dict.fromkeys(k for r in rows for k in r))
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = [f"\n### {title}", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return "\n".join(lines + ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]) + "\n"


def summary(lease: Lease, header: str) -> str:
    """The part's summary, at most :data:`SUMMARY_CHARS` characters, the pack table last; lines are dropped from
    the top of the list of what ran (never the tables) when it would be longer."""
    names = sorted(lease.tables, key=lambda t: t.startswith("packs"))
    tables = "".join(_markdown(t, lease.tables[t]) for t in names)
    tail = f"\npart {lease.part}: {time.time() - lease.started:.0f} s\n"
    lines = list(lease.lines)
    while lines and len(header) + sum(len(x) + 1 for x in lines) + len(tables) + len(tail) > SUMMARY_CHARS:
        lines.pop(0)
    return (header + "\n".join(lines) + "\n" + tables + tail)[-SUMMARY_CHARS:]


def logs_tail(lines: int = 25) -> str:
    work = Path(os.environ.get("GPU_CHECK_WORK", "/tmp/ablate-gpu-check"))
    parts = []
    for log in sorted((work / "logs").glob("*.log")):
        parts.append(f"==> {log.name} <==\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:]))
    return "\n\n".join(parts) or "(no run logs)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_lease")
    p.add_argument("out", help="folder for summary.md and at most four other files")
    p.add_argument("--part", type=int, choices=(1, 2), required=True)
    args = p.parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lease = Lease(out, args.part)
    cuda, device = _device()
    header = (
        f"# ablate GPU check, part {args.part}: {device}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}\n"
    )
    print(header, flush=True)
    if os.environ.get("GPU_CHECK_CARRY"):
        lease.say(os.environ["GPU_CHECK_CARRY"])
    gpus = ray_gpus(lease)
    try:
        part_one(lease, cuda, gpus) if args.part == 1 else part_two(lease, gpus)
    finally:
        (out / "results.json").write_text(json.dumps({"device": device, "lines": lease.lines, **lease.tables},
                                                     indent=1, default=str))  # fmt: skip
        (out / "logs_tail.txt").write_text(logs_tail())
        text = summary(lease, header)
        (out / "summary.md").write_text(text)
        print("\n" + text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
