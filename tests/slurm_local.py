"""A one-node SLURM on this machine for tests of `ablate slurm`: munged, slurmctld and slurmd on localhost.

:func:`local_slurm` writes a minimal ``slurm.conf`` for this host into a temporary folder (its state, spool,
pid and log files there too; free ports, no cgroups, no accounting database), starts the daemons as root (through
``sudo -n`` when this user is not root) and stops them, by pid, at the end. A SLURM that already answers here
(``sinfo`` with the machine's own configuration) is used as it is and left running. Every command the tests run
(``sbatch``, ``squeue``, ``scontrol``) finds the temporary configuration through ``SLURM_CONF``, which
:func:`local_slurm` sets for this process and its children.

Debian: ``apt-get install slurm-wlm munge`` (the daemons need no further setup).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

INSTALL_HINT = "install SLURM with `apt-get install slurm-wlm munge` (Debian/Ubuntu)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(*cmd: str, env: dict | None = None, timeout: float = 15) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=timeout, env=env).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _munge_works() -> bool:
    try:
        token = subprocess.run(["munge", "-n"], capture_output=True, timeout=10, check=True).stdout
        return subprocess.run(["unmunge"], input=token, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def slurm_conf(folder: Path, host: str, ctld_port: int, slurmd_port: int, cpus: int = 2) -> str:
    """A minimal slurm.conf: one node ``host`` (``cpus`` CPUs) in partition ``debug``, state under ``folder``."""
    mem_mb = max(int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20) - 1024, 1024)
    user = "root"
    return f"""\
ClusterName=ablatetest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
KillWait=10
MinJobAge=600
StateSaveLocation={folder}/ctld
SlurmdSpoolDir={folder}/slurmd
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
PlugStackConfig={folder}/plugstack.conf
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class LocalSlurm:
    """A SLURM the tests can submit to; ``logs()`` is what its daemons wrote (for a failing test's message)."""

    folder: Path | None
    env: dict[str, str]
    procs: list[subprocess.Popen] = field(default_factory=list)

    def logs(self, tail: int = 4000) -> str:
        if self.folder is None:
            return "(a SLURM already running on this machine: see its own logs)"
        out = []
        for name in ("slurmctld.log", "slurmd.log"):
            path = self.folder / name
            text = path.read_text(errors="replace") if path.exists() else "(none)"
            out.append(f"--- {name} (last {tail} characters) ---\n{text[-tail:]}")
        return "\n".join(out)


def _sudo() -> list[str] | None:
    """The prefix that runs a command as root: nothing for root, ``sudo -n`` where it works, else None."""
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo") and _answers("sudo", "-n", "true"):
        return ["sudo", "-n"]
    return None


def _stop(proc: subprocess.Popen, sudo: list[str]) -> None:
    if proc.poll() is None:
        subprocess.run([*sudo, "kill", "-TERM", str(proc.pid)], capture_output=True)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            subprocess.run([*sudo, "kill", "-KILL", str(proc.pid)], capture_output=True)
            proc.wait()


@contextlib.contextmanager
def local_slurm(timeout: float = 90) -> Iterator[LocalSlurm]:
    """Yield a SLURM with an idle node: the one already running here, or munged/slurmctld/slurmd started now.

    Raises RuntimeError (with the reason) when none runs and none can be started (no root, no munge key)."""
    if _answers("sinfo", "-h"):
        yield LocalSlurm(None, dict(os.environ))
        return
    sudo = _sudo()
    if sudo is None:
        raise RuntimeError("no SLURM runs here and starting one needs root (or passwordless sudo)")
    folder = Path(tempfile.mkdtemp(prefix="ablate-slurm-"))
    os.chmod(folder, 0o755)  # the daemons (root) and the jobs (this user) read it
    host = socket.gethostname().split(".")[0]
    conf = folder / "slurm.conf"
    conf.write_text(slurm_conf(folder, host, _free_port(), _free_port()))
    (folder / "plugstack.conf").write_text("")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    slurm = LocalSlurm(folder, env)
    started: list[tuple[subprocess.Popen, list[str]]] = []
    before = os.environ.get("SLURM_CONF")
    try:
        if not _munge_works():
            for d in ("/run/munge", "/var/log/munge", "/var/lib/munge"):
                subprocess.run([*sudo, "mkdir", "-p", d], check=True)
                subprocess.run([*sudo, "chown", "munge:munge", d], capture_output=True)
            log = open(folder / "munged.out", "w")  # noqa: SIM115 - closed with the process
            munged = subprocess.Popen([*sudo, "munged", "--foreground", "--force"], stdout=log, stderr=log)
            started.append((munged, sudo))
            deadline = time.time() + 20
            while not _munge_works():
                if munged.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"munged did not start: {(folder / 'munged.out').read_text()[-2000:]}")
                time.sleep(0.2)
        for daemon in ("slurmctld", "slurmd"):
            out = open(folder / f"{daemon}.out", "w")  # noqa: SIM115 - closed with the process
            proc = subprocess.Popen([*sudo, daemon, "-D", "-f", str(conf)], stdout=out, stderr=out, env=env)
            started.append((proc, sudo))
            slurm.procs.append(proc)
        os.environ["SLURM_CONF"] = str(conf)
        deadline = time.time() + timeout
        while True:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=env).stdout
            if state.strip() == "idle":
                break
            dead = [p.args[-4] for p in slurm.procs if p.poll() is not None]
            if dead or time.time() > deadline:
                raise RuntimeError(
                    f"SLURM did not come up ({', '.join(dead) or 'node ' + state.strip()}):\n{slurm.logs()}"
                )
            time.sleep(0.5)
        yield slurm
    finally:
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
        if slurm.procs and all(p.poll() is None for p in slurm.procs):
            _cancel_all(env)  # a job left running would outlive slurmd, Ray and all
        for proc, prefix in reversed(started):
            _stop(proc, prefix)
        if all(p.poll() is not None for p, _ in started):
            shutil.rmtree(folder, ignore_errors=True)


def _cancel_all(env: dict[str, str], timeout: float = 60) -> None:
    """Cancel every job of the cluster this module started, and wait until none is left."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        jobs = subprocess.run(["squeue", "-h", "-o", "%A"], capture_output=True, text=True, env=env).stdout.split()
        if not jobs:
            return
        subprocess.run(["scancel", *jobs], capture_output=True, env=env)
        time.sleep(1)
