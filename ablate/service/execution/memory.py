"""Refuse, before Ray starts, a grid whose trials cannot fit this machine's memory.

Without this, a trial too large for the machine (``--set batch_size=1e9``) starts Ray, allocates until Ray's
memory monitor or the kernel's OOM killer stops it, and takes other processes' work down with it. The estimate
of a trial's peak (:func:`ablate.service.specs.costs.peak_memory`) is compared with what this machine has now:
the RAM available now (``psutil.virtual_memory().available``: Linux's MemAvailable), less what the local Ray's own
processes take, and for a GPU trial the card's memory (``nvidia-smi``, not torch: the driver must not start CUDA,
whose context takes memory on the card and cannot be forked). A trial joining a Ray cluster (``address``) is not checked here: its
machines are not known before Ray connects.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ablate.service.records.provenance import query_gpus
from ablate.service.records.rundir import RunError
from ablate.service.specs.costs import MemoryEstimate, peak_memory
from ablate.service.specs.grids import Grid

__all__ = ["MemoryRefused", "Machine", "check_memory", "local_machine"]

#: RAM the embedded Ray's own processes take (raylet, GCS, dashboard, idle workers): measured ~2 GiB.
RAY_RESERVE = 2 << 30


class MemoryRefused(RunError):
    """A grid's trials do not fit this machine's memory; the message names the trial, the setting, the estimate
    and the memory available."""


@dataclass(frozen=True)
class Machine:
    """What a trial may use here: RAM available (bytes) and its source; each GPU's memory (bytes); CPU count."""

    ram: int | None
    ram_source: str
    gpus: tuple[int, ...] = ()
    cpus: int = 1


def _ram_available() -> int | None:
    """Bytes of RAM available now (psutil), or None where psutil cannot tell."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - psutil missing or refused by the platform: memory unknown, not checked
        return None


def _gpu_memory() -> tuple[int, ...]:
    """Each GPU's total memory in bytes (:func:`ablate.service.records.provenance.query_gpus`), or () when unknown."""
    return tuple(g["memory_mib"] << 20 for g in query_gpus())


def local_machine(num_cpus: int | None = None) -> Machine:
    """This machine as an embedded Ray will see it: RAM available now less :data:`RAY_RESERVE`, its GPUs."""
    ram = _ram_available()
    usable = None if ram is None else max(ram - RAY_RESERVE, 0)
    source = "MemAvailable (psutil), less 2 GiB for Ray's own processes"
    return Machine(usable, source, _gpu_memory(), num_cpus or os.cpu_count() or 1)


def gib(n: float) -> str:
    """Bytes as GiB text (``3.4 GiB``; ``1.2e+06 GiB`` for absurd sizes)."""
    value = n / 2**30
    return f"{value:.1f} GiB" if value < 1e5 else f"{value:.1e} GiB"


def _on_gpu(device: str, gpus_per_trial: float) -> bool:
    return gpus_per_trial > 0 and device != "cpu"


def _refusal(grid: Grid, trial, need: int, what: str, est: MemoryEstimate, have: int, source: str) -> MemoryRefused:
    shown = ", ".join(f"{k}={getattr(trial.config, k)}" for k in est.settings)
    first = est.settings[0]
    return MemoryRefused(
        f"{grid.path}: trial {trial.label}: needs about {gib(need)} of {what} at its peak ({est.peak_phase}; "
        f"{shown}), more than the {gib(have)} available ({source}); lower {first} (--set {first}=...), or run it "
        "on a machine with more memory"
    )


def check_memory(
    grid: Grid,
    cpus_per_trial: float = 1,
    gpus_per_trial: float = 0,
    max_concurrent: int | None = None,
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    pack: int = 1,
    machine: Machine | None = None,
) -> None:
    """Raise :class:`MemoryRefused` when one trial of ``grid``, or the trials that would run at once, cannot fit
    this machine (see the module doc): before Ray starts, naming the trial, the setting that drives its peak,
    the estimate and the memory available. ``machine`` defaults to :func:`local_machine` (``num_cpus`` as the
    embedded Ray gets them); with ``address`` (a cluster) nothing is checked. A pack (``pack`` > 1) trains that
    many grid points in one process: it is counted as their sum."""
    if address is not None or not grid.trials:
        return
    machine = machine or local_machine(num_cpus)
    estimates = [(t, peak_memory(t.config, gpu=_on_gpu(t.config.device, gpus_per_trial))) for t in grid.trials]
    if machine.ram is not None:
        trial, est = max(estimates, key=lambda te: te[1].host)
        if est.host > machine.ram:
            raise _refusal(grid, trial, est.host, "memory", est, machine.ram, machine.ram_source)
    on_gpu = [(t, e) for t, e in estimates if e.device]
    if machine.gpus and on_gpu:
        trial, est = max(on_gpu, key=lambda te: te[1].device)
        if est.device > max(machine.gpus):
            raise _refusal(grid, trial, est.device, "GPU memory", est, max(machine.gpus), "the largest GPU, nvidia-smi")
    slots = max(1, int(machine.cpus // max(cpus_per_trial, 1e-9)))
    if machine.gpus and gpus_per_trial > 0:
        slots = min(slots, max(1, int(len(machine.gpus) / gpus_per_trial)))
        per_card = min(max(1, int(1 / gpus_per_trial)), max_concurrent or slots) * max(pack, 1)
        shared = sorted((e.device for _, e in on_gpu), reverse=True)[:per_card]
        if len(shared) > 1 and sum(shared) > max(machine.gpus):
            raise MemoryRefused(
                f"{grid.path}: {len(shared)} trials sharing one GPU (--gpus-per-trial {gpus_per_trial:g}) would need "
                f"about {gib(sum(shared))} of its {gib(max(machine.gpus))}; give each trial a larger share"
            )
    if machine.ram is None:
        return
    hosts = sorted((e.host for _, e in estimates), reverse=True)[: min(slots, max_concurrent or slots) * max(pack, 1)]
    if len(hosts) > 1 and sum(hosts) > machine.ram:
        fits = max(1, sum(1 for i in range(len(hosts)) if sum(hosts[: i + 1]) <= machine.ram) // max(pack, 1))
        raise MemoryRefused(
            f"{grid.path}: {len(hosts)} trials at once would need about {gib(sum(hosts))} of memory, more than the "
            f"{gib(machine.ram)} available ({machine.ram_source}); run fewer at once: --max-concurrent {fits}"
        )
