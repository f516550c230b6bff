"""`ablate slurm`: a grid as one SLURM batch job that starts Ray across its nodes and survives requeues.

:func:`slurm_job` checks everything it can before anything is written (the grid with its preset, ``--set`` and
``--variants``, the run name, the storage, the job's sizes), :func:`render_script` turns the resulting
:class:`SlurmJob` into the batch script (pure: the same job gives the same text), :func:`write_script` puts it at
``<storage>/<run name>.sbatch`` (with a script dir, or on object storage: ``<script dir>/<run name>.sbatch``) and
:func:`submit` hands it to ``sbatch``.

What the script does on each start of the job (the first, and every one after a requeue):

- the Ray head on the job's first node (the batch script's node; on one node bound to 127.0.0.1), with Ray's
  token authentication (``RAY_AUTH_MODE=token``, the token ``ray get-auth-token --generate`` keeps in
  ``~/.ray/auth_token``), and with ``srun`` one worker node on each other node, after the head's token is copied
  there (through ``srun``'s standard input, never the command line or the shared storage);
- ``ablate run … --address <head>`` on the head, with ``--resume`` when the run directory already holds a run
  (:func:`ablate.service.execution.runner.has_run_state`); while an earlier driver still holds the run's lock (a requeued job
  can start before the old one finished stopping) it waits and tries again;
- SLURM's SIGTERM (a requeue, a preemption, ``scancel``) reaches every process of the job: the driver stops as on
  Ctrl-C (exit 143, resumable) and the job starts again later with ``--resume``. Near the time limit
  (``--signal=B:USR1@GRACE``) the script sends the driver SIGTERM itself, waits for it, and requeues the job.

The storage must be a folder every node of the cluster reaches at the same path (a shared file system), or a URI
of object storage (``s3://bucket/prefix?…``, ``gs://…``) that the job's ``ablate run`` gets unchanged, checked
writable as `ablate run` checks it; then the script and SLURM's output file go to a local folder (``script_dir``,
default the current one), which must exist at the same path on the job's first node. The Python environment must
be the same path on every node too (a shared home or software folder): the script names it.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate.config import ConfigError, quote
from ablate.files import atomic_write
from ablate.service.execution.options import RunOptions, build_options, command_options, resume_words
from ablate.service.records.rundir import RunError, check_run_name, check_writable, resolve_run_dir
from ablate.service.records.store import local_folder

__all__ = [
    "SlurmJob",
    "job_output",
    "render_script",
    "script_path",
    "slurm_job",
    "submit",
    "time_seconds",
    "write_script",
]

#: Seconds before the time limit at which SLURM tells the script to stop the run and requeue the job.
GRACE_S = 120
#: How long a start of the job waits for an earlier driver to let go of the run directory.
LOCK_WAIT_S = 600
LOCK_MESSAGE = "is being written by ablate pid"  # ablate.service.records.driver_lock.busy_message
_SAFE = re.compile(r"^[A-Za-z0-9._+@:/=,-]+$")  # what may stand unquoted on an #SBATCH line
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


@dataclass(frozen=True)
class SlurmJob:
    """Everything the batch script needs, checked (:func:`slurm_job` builds it)."""

    grid: str  # a shipped grid's name, or the absolute path of a grid file
    options: RunOptions  # the run's options that `ablate slurm` takes; storage absolute (or a URI), name, GPUs decided
    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_node: int | None = None  # None: what SLURM gives the job (SLURM_CPUS_ON_NODE)
    partition: str | None = None
    time: str | None = None
    python: str = field(default_factory=lambda: sys.executable)
    ray: str = field(default_factory=lambda: _ray_executable(sys.executable))
    script_dir: str | None = None  # the absolute folder of the script and SLURM's output; None: the storage folder

    @property
    def storage(self) -> str:
        """The absolute folder on the shared file system that holds the run, or the URI of its object storage."""
        return self.options.storage

    @property
    def folder(self) -> str:
        """The local folder of the job's script and SLURM's output files."""
        return self.script_dir or self.storage

    @property
    def name(self) -> str:
        """The run's name: the run directory is storage/name."""
        return str(self.options.name)

    @property
    def run_dir(self) -> str:
        """The run directory: ``<storage>/<name>`` (on object storage, the URI's query stays at its end)."""
        return resolve_run_dir(self.storage, self.name)


def _ray_executable(python: str) -> str:
    beside = Path(python).with_name("ray")
    return str(beside) if beside.exists() else (shutil.which("ray") or "ray")


def time_seconds(value: str) -> int | None:
    """SLURM's ``--time`` in seconds (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS); None: no limit."""
    if value.upper() in ("UNLIMITED", "INFINITE"):
        return None
    m = _TIME.match(value)
    if not m:
        raise ConfigError(
            f"--time {value!r}: expected minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (SLURM's formats)"
        )
    days, a, b, c = (int(x) if x is not None else None for x in m.groups())
    if days is None:
        parts = [x for x in (a, b, c) if x is not None]
        h, mi, s = [0] * (3 - len(parts)) + parts if len(parts) > 1 else (0, a, 0)
        return h * 3600 + mi * 60 + s
    return days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)


def _check_word(value: str, flag: str) -> str:
    if not _SAFE.match(value):
        raise ConfigError(f"{flag} {value!r}: only letters, digits and ._+@:/=,- may appear in a SLURM job's option")
    return value


def slurm_job(
    grid: str,
    options: RunOptions | None = None,
    *,
    nodes: int = 1,
    gpus_per_node: int = 0,
    cpus_per_node: int | None = None,
    partition: str | None = None,
    time: str | None = None,
    script_dir: str | None = None,
    **fields: Any,
) -> SlurmJob:
    """Check the job (the grid resolves with its preset, settings and variants as `ablate run` resolves it,
    :func:`ablate.service.specs.resolve.resolve_grid`; a URI as storage is written as `ablate run` checks it,
    :func:`ablate.service.records.rundir.check_writable`; sizes and names are valid) and return it; the first problem
    is a one-line :class:`ConfigError` or :class:`RunError`. Nothing is written but the URI's probe object.

    ``script_dir``: the folder of the script and SLURM's output files; default the storage folder, or the current
    folder when the storage is a URI.

    ``options`` (with ``fields`` over them) are the run's options, as `ablate run` takes them
    (:class:`ablate.service.execution.options.RunOptions`); the job keeps those `ablate slurm` takes. ``gpus_per_trial``
    None: one GPU per trial when the nodes have GPUs, else none."""
    from ablate.service.execution.probes import probe_plugins
    from ablate.service.execution.runner import default_run_name
    from ablate.service.specs.grids import resolve_grid_path
    from ablate.service.specs.resolve import resolve_grid

    opts = command_options(build_options(options, **fields), "slurm")
    loaded = resolve_grid(grid, opts)
    probe_plugins(loaded)  # a plugin that is not installed here, or refuses its options: one line, no script
    if opts.pack is not None and opts.pack != "auto":
        from ablate.service.execution.packs import resolve_pack

        resolve_pack(opts.pack, loaded, 0)  # a pack of an Optuna search is refused here; auto is decided on the node
    storage, name, cpus_per_trial = opts.storage, opts.name, opts.cpus_per_trial
    given = Path(grid)  # a grid file is named by its absolute path: the job may start in another folder
    grid_ref = str(resolve_grid_path(grid).resolve()) if given.suffix in (".yaml", ".yml") or given.exists() else grid
    remote = (here := local_folder(storage)) is None  # the storage's folder on this machine; None for a bucket
    if remote:  # the job's `ablate run` gets the URI as it is, quoted; a control character would end a script line
        if any(ord(c) < 32 or ord(c) == 127 for c in storage):
            raise ConfigError(
                f"--storage {quote(storage)}: expected a URI without control characters (such as a newline)"
            )
        folder = storage
    else:
        folder = _check_word(str(here.resolve()), "--storage")
    if script_dir is not None or remote:
        script_dir = _check_word(str(Path(script_dir or ".").expanduser().resolve()), "--script-dir")
    run = check_run_name(name or default_run_name(loaded))
    _check_word(run, "--name")
    for flag, value, low in (("--nodes", nodes, 1), ("--gpus-per-node", gpus_per_node, 0)):
        if value < low:
            raise ConfigError(f"{flag} {value}: expected a whole number ≥ {low}")
    if cpus_per_node is not None and cpus_per_node < 1:
        raise ConfigError(f"--cpus-per-node {cpus_per_node}: expected a whole number ≥ 1")
    gpus = (1.0 if gpus_per_node else 0.0) if opts.gpus_per_trial is None else float(opts.gpus_per_trial)
    if gpus > gpus_per_node:
        raise ConfigError(f"--gpus-per-trial {gpus:g}: more than the {gpus_per_node} GPU(s) per node (--gpus-per-node)")
    if cpus_per_node is not None and cpus_per_trial > cpus_per_node:
        raise ConfigError(f"--cpus-per-trial {cpus_per_trial:g}: more than --cpus-per-node {cpus_per_node}")
    if partition is not None:
        _check_word(partition, "--partition")
    if time is not None:
        seconds = time_seconds(_check_word(time, "--time"))
        if seconds is not None and seconds <= 2 * GRACE_S:
            raise ConfigError(
                f"--time {time}: too short; the job stops the run {GRACE_S} s before its limit to requeue itself, "
                f"so ask for more than {2 * GRACE_S // 60} minutes"
            )
    if remote:
        check_writable(storage)  # as `ablate run` checks it: a missing bucket, no credentials, a bad query (one line)
    return SlurmJob(
        grid=grid_ref, options=build_options(opts, storage=folder, name=run, gpus_per_trial=gpus), nodes=nodes,
        gpus_per_node=gpus_per_node, cpus_per_node=cpus_per_node, partition=partition, time=time,
        script_dir=script_dir,
    )  # fmt: skip


def script_path(job: SlurmJob) -> Path:
    """Where :func:`write_script` puts the job's script: ``<script dir>/<run name>.sbatch`` (the script dir is the
    storage folder unless the job names another; it always does when the storage is a URI)."""
    return Path(job.folder) / f"{job.name}.sbatch"


def job_output(job: SlurmJob, job_id: str = "%j") -> str:
    """The job's output file (every start of the job appends to it): ``<script dir>/<run name>.slurm-<job id>.out``,
    beside the script."""
    return f"{job.folder}/{job.name}.slurm-{job_id}.out"


def _run_words(job: SlurmJob) -> list[str]:
    """The `ablate run` of the job, its options spelled as :func:`ablate.service.execution.options.resume_words`
    spells them (a requeued start continues the run: the same command). The Ray head, not the driver, starts the
    dashboard (``DASHBOARD``), so the command leaves ``--no-dashboard`` out."""
    return [job.python, "-m", "ablate.cli", "run", job.grid, *resume_words(build_options(job.options, dashboard=True))]


def render_script(job: SlurmJob) -> str:
    """The batch script of ``job`` (pure: no file, no process, no clock)."""
    from ablate import __version__

    q = shlex.quote
    head = [
        "#!/bin/bash",
        f"#SBATCH --job-name=ablate-{job.name}",
        f"#SBATCH --nodes={job.nodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    head += [f"#SBATCH --cpus-per-task={job.cpus_per_node}"] if job.cpus_per_node else []
    head += [f"#SBATCH --gpus-per-node={job.gpus_per_node}"] if job.gpus_per_node else []
    head += [f"#SBATCH --partition={job.partition}"] if job.partition else []
    head += [f"#SBATCH --time={job.time}"] if job.time else []
    head += [
        f"#SBATCH --output={job_output(job)}",
        "#SBATCH --open-mode=append",
        "#SBATCH --requeue",
        f"#SBATCH --signal=B:USR1@{GRACE_S}",
        f"# Written by `ablate slurm` (ablate {__version__}): runs grid {job.grid} ({job.options.scale}) as {job.run_dir}",
        "# on a Ray cluster across this job's nodes; each start after a requeue (preemption, time limit) resumes it.",
        "",
        f"PYTHON={q(job.python)}",
        f"RAY={q(job.ray)}",
        f"STORAGE={q(job.storage)}",
        f"RUN_NAME={q(job.name)}",
        f"RUN_DIR={q(job.run_dir)}",
        f"STATUS={q(shlex.join([job.python, '-m', 'ablate.cli', 'status', job.run_dir]))}",
        f"NODES={job.nodes}",
        f"CPUS={job.cpus_per_node}" if job.cpus_per_node else "CPUS=${SLURM_CPUS_ON_NODE:-1}",
        f"GPUS={job.gpus_per_node}",
        f"DASHBOARD={'true' if job.options.dashboard else 'false'}",
        f"LOCK_WAIT_S={LOCK_WAIT_S}",
        f"LOCK_MESSAGE={q(LOCK_MESSAGE)}",
        f"RUN=({' '.join(q(w) for w in _run_words(job))})",
        f'export PATH={q(str(Path(job.python).parent))}:"$PATH"',
    ]
    return "\n".join(head) + "\n" + _BODY


_BODY = r"""export RAY_AUTH_MODE=token PYTHONUNBUFFERED=1
attempt=${SLURM_RESTART_COUNT:-0}
rm -rf "/tmp/ablate-job$SLURM_JOB_ID-"*  # what an earlier start of this job, killed, left behind
JOBTMP=/tmp/ablate-job$SLURM_JOB_ID-$attempt  # short: Ray's socket paths have a length limit
mkdir -p "$JOBTMP"
say() { echo "ablate slurm [$(date '+%F %T')] $*"; }
say "job $SLURM_JOB_ID, start $((attempt + 1)), nodes $SLURM_JOB_NODELIST"

stop='' requeue='' trapped='' driver=''
on_term() { trapped=1; stop=TERM; say "SIGTERM (requeue, preemption or scancel): the run stops; the job's next start resumes it"; }
on_usr1() {
  trapped=1; stop=USR1; requeue=1
  say "the time limit is near: stopping the run, then requeueing the job"
  [ -n "$driver" ] && kill -TERM "$driver" 2>/dev/null
}
trap on_term TERM
trap on_usr1 USR1
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for _ in $(seq 30); do
    alive=''; for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ -z "$alive" ] && break; sleep 1
  done
  rm -rf "$JOBTMP"
}
trap cleanup EXIT
finish() {  # exit with $1; after the time-limit warning, requeue the job first
  if [ -n "$requeue" ]; then say "requeueing job $SLURM_JOB_ID"; scontrol requeue "$SLURM_JOB_ID"; fi
  exit "$1"
}
pause() { sleep "$1" & wait $!; }  # a signal's trap runs at once

# --- Ray: the head here (the job's first node), a worker node on every other node
mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
port=$((20000 + SLURM_JOB_ID % 20000))
head_ip=127.0.0.1
if [ "$NODES" -gt 1 ]; then
  head_ip=''
  for ip in $(hostname --ip-address) $(hostname -I); do
    case $ip in 127.*|::1) ;; *) head_ip=$ip; break ;; esac
  done
  [ -n "$head_ip" ] || { say "cannot find this node's IP address for the other nodes"; exit 1; }
fi
(umask 077; "$RAY" get-auth-token --generate >/dev/null) || { say "cannot make Ray's auth token"; exit 1; }
token="${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}"
: >"$JOBTMP/head.log"
"$RAY" start --head --node-ip-address "$head_ip" --port "$port" --num-cpus "$CPUS" --num-gpus "$GPUS" \
  --include-dashboard "$DASHBOARD" --dashboard-host 127.0.0.1 --dashboard-port $((port + 1)) \
  --ray-client-server-port $((port + 2)) --temp-dir "$JOBTMP/ray" --disable-usage-stats --block \
  >"$JOBTMP/head.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do
  grep -q "Ray runtime started" "$JOBTMP/head.log" && break
  kill -0 "${pids[0]}" 2>/dev/null || break
  [ -n "$stop" ] && finish 143
  pause 1
done
cat "$JOBTMP/head.log"
grep -q "Ray runtime started" "$JOBTMP/head.log" || { say "the Ray head did not start"; finish 1; }
say "Ray head on ${nodes[0]} ($head_ip:$port), dashboard on its 127.0.0.1:$((port + 1))"
for node in "${nodes[@]:1}"; do  # the head's token, through srun's standard input
  srun --nodes=1 --ntasks=1 --overlap -w "$node" bash -c \
    'rm -rf "/tmp/ablate-job$SLURM_JOB_ID-"*; umask 077; t="${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}"
     mkdir -p "${t%/*}" && cat >"$t.$$" && mv -f "$t.$$" "$t"' \
    <"$token" || say "could not copy Ray's auth token to $node"
  srun --nodes=1 --ntasks=1 --overlap -w "$node" "$RAY" start --address "$head_ip:$port" --num-cpus "$CPUS" \
    --num-gpus "$GPUS" --temp-dir "$JOBTMP/ray" --disable-usage-stats --block &
  pids+=($!)
  say "Ray worker node on $node"
done

# --- the run: a fresh one, or --resume when the run directory holds one; wait while an earlier driver writes it
has_run() {
  "$PYTHON" -c 'import sys; from ablate.service.execution.runner import has_run_state; sys.exit(10 if has_run_state(*sys.argv[1:]) else 11)' \
    "$STORAGE" "$RUN_NAME"
}
waited=0 code=1
while [ -z "$stop" ]; do
  has_run; known=$?
  case $known in
    10) resume=(--resume) ;;
    11) resume=() ;;
    *) say "cannot tell whether $RUN_DIR holds a run (exit $known)"; finish 1 ;;
  esac
  say "${RUN[*]} --address $head_ip:$port ${resume[*]}"
  "${RUN[@]}" --address "$head_ip:$port" "${resume[@]}" 2> >(trap '' TERM; exec tee "$JOBTMP/driver.err" >&2) &
  driver=$!
  code=''
  while :; do  # until the driver ends (a trap interrupts wait)
    trapped=''
    wait "$driver" 2>/dev/null; rc=$?
    [ "$rc" -eq 127 ] && [ -n "$code" ] && break
    code=$rc
    [ -n "$trapped" ] || break
  done
  driver=''
  if [ "$code" -ne 0 ] && grep -q "$LOCK_MESSAGE" "$JOBTMP/driver.err" && [ "$waited" -lt "$LOCK_WAIT_S" ]; then
    say "an earlier driver still writes the run directory; trying again in 10 s"
    pause 10; waited=$((waited + 10))
    continue
  fi
  break
done
say "ablate run ended with exit code $code; status: $STATUS"
finish "$code"
"""


def write_script(job: SlurmJob) -> Path:
    """Write the job's batch script to :func:`script_path` (creating its folder) and return its path."""
    path = script_path(job)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = render_script(job)
    atomic_write(path, lambda tmp: tmp.write_text(text))
    path.chmod(0o755)
    return path


def submit(path: str | Path, sbatch: str = "sbatch") -> str:
    """``sbatch`` the script at ``path``; returns the job id. :class:`RunError` (one line) when ``sbatch`` is
    missing or refuses the job."""
    exe = shutil.which(sbatch)
    if exe is None:
        raise RunError(
            f"{sbatch}: not found; run this on a SLURM login node, or copy {path} there and run `sbatch {path}`"
        )
    done = subprocess.run([exe, "--parsable", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise RunError(f"sbatch {path}: {why[-1] if why else f'exit {done.returncode}'}")
    return done.stdout.strip().split(";")[0]
