"""Ray's cost at the scale of a grid: the overhead of finished runs, and bookkeeping for many short trials.

``python -m benchmarks --only overhead --run-dirs DIR[,DIR...]`` splits each finished run's wall time into
    the trials' own compute (Σ ``time_total_s`` / slots), the packing loss that no schedule of those trials
    avoids (a longest-first schedule of the measured trial times onto the slots, a near-lower bound), and the
    rest (Ray's start, scheduling, reports, checkpoints, shutdown, and the schedule Ray actually chose).
``python -m benchmarks --only bookkeeping --trials 1000`` runs a smoke grid of N near-instant trials on the
    machine's CPUs, modelled on Ray Tune's release test (10k one-second trials under 800 s on 16 CPUs), and
    reports the wall time, the per-trial overhead, the files per trial and whether any trial or row is lost.
    ``--record local,s3`` runs the same grid once with its record in a local folder and once on moto's S3 server
    on 127.0.0.1 (:mod:`benchmarks.s3_server`), each in a fresh process with its own Ray, and adds the ratio of
    their wall times and the requests the S3 run made.
``python -m benchmarks --only shared_ray --grids tricl,batch_vs_dim`` times `ablate run A` then `ablate run B`
    (one embedded Ray each) against `ablate run A B` (one Ray for both), alternating, in fresh subprocesses.
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

#: Where the bookkeeping benchmark puts the run's record: a temporary folder, or moto's S3 server on 127.0.0.1.
RECORDS = ("local", "s3")
#: The start of the line :func:`bench_bookkeeping` prints for each trial that did not finish.
FAILED = "bookkeeping: not finished"


def list_makespan(durations: list[float], slots: int) -> float:
    """Makespan of list scheduling: each trial, in the given order, starts on the first slot to come free."""
    loads = [0.0] * max(1, slots)
    for d in durations:
        heapq.heapreplace(loads, loads[0] + d)
    return max(loads)


def longest_first_makespan(durations: list[float], slots: int) -> float:
    """Makespan of the longest-processing-time-first schedule of ``durations`` on ``slots`` equal slots."""
    return list_makespan(sorted(durations, reverse=True), slots)


def run_overhead(run_dir: str | os.PathLike, slots: int | None = None) -> dict:
    """Overhead of a finished run from its own records: wall = its marker's creation to its last report."""
    from ablate.analysis.claims.evaluate import run_wall_s
    from ablate.service.records.reader import RunReader
    from ablate.service.specs.costs import trial_cost
    from ablate.service.specs.params import config_from_params

    reader = RunReader(run_dir)
    compute, cost = [], []
    for name in sorted(reader.trial_dirs()):  # trial_<id>_00000, 00001, ...: the order Ray started them in
        rows = reader.results(name)
        if rows:
            compute.append(float(rows[-1]["time_total_s"]))
            cost.append(trial_cost(config_from_params(reader.params(name) or {})))
    wall = run_wall_s(run_dir)
    if not compute or wall is None:
        raise ValueError(f"{run_dir}: no finished trials or no run marker; nothing to measure")
    slots = slots or min(os.cpu_count() or 1, len(compute))
    ideal = sum(compute) / slots
    packed = longest_first_makespan(compute, slots)
    in_order = list_makespan(compute, slots)
    by_cost = list_makespan([c for _, c in sorted(zip(cost, compute), key=lambda p: -p[0])], slots)
    return {
        "run": Path(run_dir).name,
        "trials": len(compute),
        "trial_s_min": min(compute),
        "trial_s_max": max(compute),
        "wall_s": wall,
        "compute_over_slots_s": ideal,
        "longest_first_s": packed,
        "grid_order_s": in_order,
        "cost_order_s": by_cost,
        "overhead_pct": 100 * (wall - ideal) / wall,
        "packing_pct": 100 * (packed - ideal) / wall,
        "rest_pct": 100 * (wall - packed) / wall,
    }


def _bookkeeping_grid(n_trials: int, folder: Path) -> Path:
    """A grid file of ``n_trials`` smoke trials (seeds 0..n-1, d = 2, a few steps each)."""
    spec = {
        "name": "bookkeeping",
        "description": f"{n_trials} near-instant trials: Ray Tune's bookkeeping cost per trial",
        "figure": "none (a benchmark)",
        "base": {
            "latent_dim": 2,
            "encoder_widths": [2, 2],
            "batch_size": 16,
            "eval_samples": 256,
            "generator_cond_samples": 200,
            "report_every": 5,
            "concentration": 5,
            "loss": "aninfonce",
        },
        "seeds": list(range(n_trials)),
        "stop": {"max_steps": 10},
        "scales": {"smoke": {}, "laptop": {}, "paper": {}},
    }
    path = folder / "bookkeeping.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def record_files(run_dir: str | os.PathLike) -> dict[str, int]:
    """Every file of the run directory ``run_dir`` (a path or an ``s3://`` URI), key → bytes, walked and read
    through its store (:func:`~ablate.service.records.store.open_store`), so a local record and one on object
    storage are counted alike."""
    from ablate.service.records.store import open_store

    store, files, folders = open_store(run_dir), {}, [""]
    while folders:
        folder = folders.pop()
        folders += [f"{folder}/{name}".lstrip("/") for name in store.list(folder, dirs=True)]
        for key in (f"{folder}/{name}".lstrip("/") for name in store.list(folder, dirs=False)):
            data = store.read_bytes(key)
            files[key] = 0 if data is None else len(data)
    return files


@contextlib.contextmanager
def _record_storage(record: str, tmp: Path) -> Iterator[tuple[str, Callable[[], collections.Counter[str]] | None]]:
    """The ``--storage`` of a bookkeeping run whose record is ``record`` (one of :data:`RECORDS`), and for ``s3``
    the request counter of the moto server started for it (None for a local record)."""
    if record == "local":
        yield str(tmp), None
    elif record == "s3":
        from benchmarks.s3_server import request_counts, s3_server

        with s3_server(tmp) as query:
            yield f"s3://runs/bookkeeping?{query}", lambda: request_counts(tmp)
    else:
        raise ValueError(f"bookkeeping: no record {record!r}; one of {', '.join(RECORDS)}")


def bench_bookkeeping(n_trials: int, record: str = "local") -> dict[str, Any]:
    """Run ``n_trials`` smoke trials through ``run_grid`` with the record ``record`` (``local``: a temporary
    folder; ``s3``: moto's S3 server on 127.0.0.1, started here) and count time, files and anything lost; for
    ``s3`` also the requests the run made, from the server's log, per HTTP method. The S3 server is started
    before Ray, whose workers must find its credentials in their environment: run ``s3`` in a process where Ray
    is not up yet (:func:`bench_bookkeeping_records` gives each record a fresh process)."""
    from ablate.analysis.results import load_results
    from ablate.service.execution.runner import run_grid
    from ablate.service.specs.grids import load_grid

    with tempfile.TemporaryDirectory() as tmp, _record_storage(record, Path(tmp)) as (storage, requests):
        grid = load_grid(str(_bookkeeping_grid(n_trials, Path(tmp))), "laptop")
        before = requests() if requests else None
        t = time.perf_counter()
        outcome = run_grid(grid, storage=storage, verbose=0, num_cpus=os.cpu_count(), keep_checkpoints=1)
        wall = time.perf_counter() - t
        made = None if requests is None or before is None else requests() - before  # not the reads below
        for trial in outcome.failed:  # what lost a trial, as Ray told it (its error file is in a folder Ray deletes)
            error = (trial.error or "no error recorded").strip().split("\n", 1)[0][:300]
            print(f"{FAILED} ({record}): {trial.trial_id} {trial.status}: {error}", flush=True)
        df = load_results(outcome.run_dir)
        files = record_files(outcome.run_dir)
    per_trial = df.groupby("trial_id")
    compute = float(per_trial["time_total_s"].max().sum())
    slots = min(os.cpu_count() or 1, n_trials)
    expected_rows = n_trials * 2  # reports at steps 5 and 10
    row: dict[str, Any] = {
        "trials": n_trials,
        "wall_s": wall,
        "trials_per_s": n_trials / wall,
        "compute_s": compute,
        "overhead_s_per_trial": (wall - compute / slots) * slots / n_trials,
        "finished": len(outcome.trials) - len(outcome.failed),
        "rows": len(df),
        "rows_expected": expected_rows,
        "duplicated_rows": int(df.duplicated(["trial_id", "training_iteration"]).sum()),
        "files_per_trial": len(files) / n_trials,
        "kib_per_trial": sum(files.values()) / 1024 / n_trials,
    }
    if made is not None:
        row["requests"] = sum(made.values())
        row["requests_by_method"] = dict(sorted(made.items()))
    return row


def _bookkeeping_in_child(n_trials: int, record: str) -> dict[str, Any]:
    """:func:`bench_bookkeeping` in a fresh Python process (its own Ray, started after the S3 server)."""
    code = (
        "import json; from benchmarks.ray_scale import bench_bookkeeping; "
        f"print('BOOKKEEPING ' + json.dumps(bench_bookkeeping({n_trials}, {record!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1]
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("BOOKKEEPING ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"bookkeeping ({record}) exited {out.returncode}:\n{(out.stdout + out.stderr)[-3000:]}")
    for line in out.stdout.splitlines():
        if line.startswith(FAILED):
            print(line, flush=True)
    return json.loads(lines[-1].removeprefix("BOOKKEEPING "))


def bench_bookkeeping_records(n_trials: int, records: tuple[str, ...] = RECORDS) -> list[dict[str, Any]]:
    """:func:`bench_bookkeeping` once per record kind, each in a fresh process (each pays Ray's start), as one
    table: a row per record with its wall time, the seconds per trial, the ratio of its wall time to the local
    record's, and for ``s3`` the requests the run made (all and per trial; ``-`` for a local record) and the
    same per HTTP method (``requests_by_method``, a dict the caller prints apart)."""
    runs = {record: _bookkeeping_in_child(n_trials, record) for record in records}
    local = runs.get("local")
    rows = []
    for record, run in runs.items():
        requests = run.get("requests")
        rows.append(
            {
                "record": record,
                "trials": run["trials"],
                "wall_s": run["wall_s"],
                "s_per_trial": run["wall_s"] / n_trials,
                "vs_local": run["wall_s"] / local["wall_s"] if local else float("nan"),
                **{k: run[k] for k in ("overhead_s_per_trial", "finished", "rows", "rows_expected")},
                **{k: run[k] for k in ("duplicated_rows", "files_per_trial", "kib_per_trial")},
                "requests": "-" if requests is None else requests,
                "requests_per_trial": "-" if requests is None else requests / n_trials,
                "requests_by_method": run.get("requests_by_method", {}),
            }
        )
    return rows


def bench_thread_determinism(steps: int = 300, threads: tuple[int, ...] = (1, 1, 2, 2)) -> list[dict]:
    """Train the same seeded trial (d = 10, batch 512, the fast preset's optimiser) with each torch thread
    count and compare the final parameters with the first: whether a trial's numbers depend on the CPUs it
    is given (they would, if a trial took free cores while it ran alone)."""
    import torch

    from ablate.config import RunConfig
    from ablate.core.experiment import Experiment

    cfg = RunConfig(
        latent_dim=10, batch_size=512, encoder_widths=[10, 10, 10], lr=1.3e-3, lr_lambda=5.8e-2,
        loss="aninfonce", concentration=[5] * 5 + [25] * 5, generator_cond_samples=200,
    )  # fmt: skip
    before = torch.get_num_threads()
    rows, first = [], None
    try:
        for n in threads:
            torch.set_num_threads(n)
            exp = Experiment(cfg)
            t = time.perf_counter()
            exp.train(steps)
            seconds = time.perf_counter() - t
            flat = torch.cat([p.detach().flatten().double() for p in exp.encoder.parameters()])
            first = flat if first is None else first
            rows.append({"threads": n, "steps": steps, "seconds": seconds,
                         "max_abs_diff_to_first": float((flat - first).abs().max()),
                         "identical": bool(torch.equal(flat, first))})  # fmt: skip
    finally:
        torch.set_num_threads(before)
    return rows


def _timed_cli(args: list[str], log: Path) -> float:
    t = time.perf_counter()
    with open(log, "w") as out:
        code = subprocess.call([sys.executable, "-m", "ablate.cli", *args], stdout=out, stderr=subprocess.STDOUT)
    if code != 0:
        raise RuntimeError(f"`ablate {' '.join(args)}` exited {code}; see {log}")
    return time.perf_counter() - t


def bench_shared_ray(grids: list[str], scale: str = "smoke", rounds: int = 2) -> list[dict]:
    """Wall time of running ``grids`` as one `ablate run` each against one `ablate run` of them all, which
    starts Ray once; alternating, ``rounds`` times each, every run in a fresh storage folder."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            common = ["--scale", scale, "--no-report", "--verbose", "0"]
            storage = Path(tmp) / f"separate{r}"
            walls = [_timed_cli(["run", g, *common, "--storage", str(storage)], storage.with_suffix(f".{g}.log"))
                     for g in grids]  # fmt: skip
            storage = Path(tmp) / f"shared{r}"
            shared = _timed_cli(["run", *grids, *common, "--storage", str(storage)], storage.with_suffix(".log"))
            rows.append({"round": r, "grids": len(grids), "separate_s": sum(walls), "shared_s": shared,
                         "saved_per_extra_grid_s": (sum(walls) - shared) / max(len(grids) - 1, 1)})  # fmt: skip
    return rows
