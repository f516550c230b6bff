"""A grid run while its trial processes and a worker node die (issue 46): what spot and preemptible machines do.

`python -m benchmarks --only chaos --trials N --kill-every S` starts a two-node Ray cluster on this machine (the head
on 127.0.0.1 and a worker node on 127.0.0.2, one CPU each, from `ray start`), runs a grid of N short smoke trials
with `ablate run --address` into a local folder undisturbed, then again while a killer SIGKILLs a random trial
process every S seconds and, at its third kill, the whole worker node (started again after a few seconds). It
prints the walls, the kills, the trials ablate and Ray retried, the reports trained twice, and whether every report
landed once with the undisturbed run's numbers. ``tests/service/execution/test_chaos.py`` runs the same killer in
the suite, on the S3 server.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from benchmarks.ray_nodes import RayNode, free_port, node_processes, start_ray_node, wait_for_port

__all__ = [
    "WORKER_IP",
    "Killer",
    "TwoNodeCluster",
    "bench_chaos",
    "chaos_grid",
    "export_rows",
    "run_ablate",
    "worker_reported",
]

WORKER_IP = "127.0.0.2"
#: The science columns of an export row: what an undisturbed run must give again.
SCIENCE = ("trial_id", "status", "training_iteration", "step", "r2", "loss", "mcc")


def chaos_grid(path: Path, trials: int, steps: int = 40, report_every: int = 5) -> Path:
    """A grid file of ``trials`` short smoke trials (batch 16/32 × d 3/4 × ``trials / 4`` seeds, ``steps`` steps,
    a report every ``report_every``) at ``path``."""
    if trials < 4 or trials % 4:
        raise ValueError(f"--trials {trials}: a multiple of 4 (2 batch sizes × 2 dims × seeds)")
    grid = {
        "name": "chaos",
        "description": "short smoke trials for the chaos benchmark and test (benchmarks/chaos.py)",
        "figure": "none (a benchmark)",
        "base": {
            "loss": "aninfonce",
            "concentration": 75,
            "generator_seed": 0,
            "encoder_widths": [2, 2],
            "eval_samples": 256,
            "report_every": report_every,
            "generator_cond_samples": 200,
        },
        "axes": {"batch_size": [16, 32], "latent_dim": [3, 4]},
        "seeds": list(range(trials // 4)),
        "stop": {"max_steps": steps},
        "scales": {"smoke": {}, "laptop": {}, "paper": {}},
    }
    path.write_text(json.dumps(grid, indent=1))  # JSON is YAML
    return path


def _ray_env() -> dict[str, str]:
    """The nodes' environment: token authentication, as the head has it."""
    return {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "token")}


class TwoNodeCluster:
    """A head (127.0.0.1) and a worker node (:data:`WORKER_IP`), ``cpus`` CPUs each, from `ray start` on this
    machine; the worker can be killed whole (:meth:`kill_worker`) and started again (:meth:`start_worker`)."""

    def __init__(self, cpus: int = 1):
        self.env = _ray_env()
        self.common = ["--num-cpus", str(cpus), "--object-store-memory", str(200 * 2**20)]
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.head: RayNode | None = None
        self.worker: RayNode | None = None

    def __enter__(self) -> TwoNodeCluster:
        try:
            head = [
                "--head",
                "--node-ip-address",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--include-dashboard",
                "false",
            ]
            self.head = start_ray_node(*head, *self.common, env=self.env, wait=False)
            wait_for_port(self.port)  # the worker node starts while the head starts its raylet and agents
            self.worker = self._worker_node(wait=False)
            self.head.wait_started()
            self.worker.wait_started()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _worker_node(self, wait: bool) -> RayNode:
        args = ["--address", self.address, "--node-ip-address", WORKER_IP, *self.common]
        return start_ray_node(*args, env=self.env, wait=wait)

    def kill_worker(self) -> None:
        """The worker node killed whole: raylet, agents and its trial processes, as when its machine is lost."""
        if self.worker is not None:
            self.worker.kill()
            self.worker = None

    def start_worker(self) -> None:
        """A worker node on :data:`WORKER_IP` again (a new node to Ray), once it says it started."""
        self.worker = self._worker_node(wait=True)

    def __exit__(self, *exc) -> None:
        for node in (self.worker, self.head):
            if node is not None:
                node.kill()
        self.worker = self.head = None

    def trial_processes(self) -> list[psutil.Process]:
        """The cluster's trial processes (the actors of ablate's Trainables, ``ray::…Trainable…``), on both nodes:
        those of the nodes' sessions only, never another Ray's on this machine."""
        out = []
        for node in (self.head, self.worker):
            for pid in node_processes(node.proc.pid) if node is not None else []:
                try:
                    proc = psutil.Process(pid)
                    cmd = proc.cmdline()
                except psutil.Error:
                    continue
                if cmd and cmd[0].startswith("ray::") and "Trainable" in cmd[0]:
                    out.append(proc)
        return out


class Killer(threading.Thread):
    """Every ``every`` seconds SIGKILL one random trial process; at the kills numbered in ``node_kills`` (1-based)
    kill the cluster's worker node instead and start it again ``down_s`` seconds later. The clock starts once
    ``ready()`` says so (e.g. :func:`worker_reported`: a trial runs on the worker node, so that its loss is felt);
    ``max_events`` (None: no limit) ends the killing after that many kills (a test's bound: a lone last trial killed
    more often than its process starts never finishes)."""

    def __init__(
        self,
        cluster: TwoNodeCluster,
        every: float,
        node_kills=(3,),
        down_s: float = 3.0,
        seed: int = 0,
        ready=None,
        max_events: int | None = None,
    ):
        super().__init__(daemon=True)
        self.max_events = max_events
        self.cluster, self.every, self.node_kills, self.down_s = cluster, every, set(node_kills), down_s
        self.ready = ready or (lambda: True)
        self.rng = random.Random(seed)
        self.stopped = threading.Event()
        self.kills = 0  # trial processes killed
        self.node_deaths = 0  # worker nodes killed
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.ready():
                if self.stopped.wait(0.5):
                    return
            events = 0
            while not self.stopped.wait(self.every):
                if self.max_events is not None and events >= self.max_events:
                    return
                events += 1
                if events in self.node_kills:
                    self.cluster.kill_worker()
                    self.node_deaths += 1
                    if self.stopped.wait(self.down_s):
                        return
                    self.cluster.start_worker()
                    continue
                procs = self.cluster.trial_processes()
                if procs:
                    try:
                        self.rng.choice(procs).send_signal(signal.SIGKILL)
                        self.kills += 1
                    except psutil.Error:
                        pass  # it ended by itself
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def stop(self) -> None:
        """Stop killing (the worker node stays as it is); re-raise what failed the killer."""
        self.stopped.set()
        self.join(timeout=120)
        if self.error is not None:
            raise RuntimeError(f"the chaos killer failed: {self.error!r}") from self.error


#: A job that reserves the head's CPU (a placement group, so no worker process) until its stdin closes.
_HOLD_HEAD = """
import sys, ray
from ray.util.placement_group import placement_group, remove_placement_group
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
pg = placement_group([{"CPU": 1, "node:__internal_head__": 0.001}])
ray.get(pg.ready(), timeout=120)
print("held", flush=True)
sys.stdin.read()
remove_placement_group(pg)
"""


class HeadHold:
    """The head's CPU held by a placement group until :meth:`release`: the grid's first trial runs on the worker
    node (otherwise Tune, which reuses a finished trial's actor, can run the whole grid on the head while the worker
    node starts its first actor)."""

    def __init__(self, cluster: TwoNodeCluster, log_path: Path, timeout: float = 150):
        self.log_path = log_path
        with log_path.open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _HOLD_HEAD, cluster.address], stdin=subprocess.PIPE, stdout=log,
                stderr=subprocess.STDOUT, env=cluster.env, start_new_session=True,
            )  # fmt: skip
        deadline = time.time() + timeout
        while "held" not in log_path.read_text():
            if self.proc.poll() is not None or time.time() > deadline:
                self.close()
                raise RuntimeError(f"the head could not be held:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)

    def release(self) -> None:
        """Free the head's CPU for trials."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()

    def close(self) -> None:
        self.release()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def worker_reported(run_dir: str, then=None):
    """A ``ready()`` for :class:`Killer`: whether a report in ``run_dir`` (local or a bucket) came from the worker
    node (Tune's ``node_ip``); ``then()`` is called once it has (e.g. :meth:`HeadHold.release`)."""
    from ablate.service.records.rundir import RESULT_FILE
    from ablate.service.records.store import as_store

    def ready() -> bool:
        store = as_store(run_dir)
        if not store.exists("ablate_run.json"):
            return False
        for name in store.list(dirs=True):
            data = store.read_log(f"{name}/{RESULT_FILE}") or b""
            if f'"node_ip": "{WORKER_IP}"'.encode() in data:
                if then is not None:
                    then()
                return True
        return False

    return ready


def run_ablate(args: list[str], log_path: Path, timeout: float, killer: Killer | None = None) -> tuple[int, str, float]:
    """`ablate run ARGS` in a subprocess (output in ``log_path``), with ``killer`` started once it runs and stopped
    when it exits; (exit code, output, wall seconds)."""
    cmd = [sys.executable, "-m", "ablate.cli", "run", *args]
    started = time.perf_counter()
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        if killer is not None:
            killer.start()
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
    finally:
        if killer is not None:
            killer.stop()
    return code, log_path.read_text(), time.perf_counter() - started


def export_rows(run_dir: str) -> list[tuple]:
    """The run's export (`ablate export`'s table), its :data:`SCIENCE` columns, row by row in trial and report
    order."""
    from ablate.analysis.results import load_results

    df = load_results(run_dir)
    df = df.sort_values(["trial_id", "training_iteration"], kind="stable")
    return [tuple(row) for row in df[list(SCIENCE)].itertuples(index=False)]


def _retry_numbers(output: str) -> tuple[int, int, int]:
    """(trials retried, retries, reports trained again) from the run's last line (0s when nothing was retried)."""
    for line in reversed(output.splitlines()):
        if line.startswith("retried "):
            words = line.split()
            redone = line.split("; ")[-1].split()[0]
            return int(words[1]), int(words[3]), int(redone)
    return 0, 0, 0


def bench_chaos(trials: int = 16, kill_every: float = 5.0, steps: int = 800, max_failures: int = 20) -> list[dict]:
    """The chaos benchmark's rows: an undisturbed run and one under the killer, of the same grid on one cluster."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="ablate-chaos-") as tmp, TwoNodeCluster() as cluster:
        root = Path(tmp)
        grid = chaos_grid(root / "chaos.yaml", trials, steps, report_every=steps // 8)
        common = [str(grid), "--scale", "smoke", "--storage", str(root / "runs"), "--address", cluster.address]
        common += ["--cpus-per-trial", "1", "--max-failures", str(max_failures), "--no-report", "--results-every", "0"]
        exports = {}
        chaos = Killer(cluster, kill_every, ready=worker_reported(str(root / "runs" / "chaos")))
        for name, killer in (("undisturbed", None), ("chaos", chaos)):
            code, out, wall = run_ablate([*common, "--name", name], root / f"{name}.log", 1800, killer)
            exports[name] = export_rows(str(root / "runs" / name)) if code == 0 else []
            retried, retries, redone = _retry_numbers(out)
            rows.append(
                {
                    "run": name,
                    "exit": code,
                    "wall_s": round(wall, 1),
                    "wall_ratio": round(wall / rows[0]["wall_s"], 2) if rows else 1.0,
                    "processes_killed": killer.kills if killer else 0,
                    "nodes_killed": killer.node_deaths if killer else 0,
                    "trials_retried": retried,
                    "retries": retries,
                    "reports_trained_again": redone,
                    "reports_logged": len(exports[name]),
                    "equal_to_undisturbed": exports[name] == exports["undisturbed"] if code == 0 else False,
                }
            )
    return rows
