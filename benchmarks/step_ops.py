"""`python -m benchmarks.step_ops [--batch B] [--dim D] [--packs 0,1,8,32] [--samplers adaptive,fixed]`: what one
training step asks of the host (also `python -m benchmarks --only syncs`).

For a GPU the question is not the CPU time but how often a step makes the host wait for the device and how many
operations it launches. Both are counted here on the CPU, from Python, so that they can be measured on any machine:

- **host syncs**: calls that would make the host wait for a GPU: reading a value (``item``, ``tolist``,
  ``bool``/``int``/``float`` of a tensor), data-dependent shapes (``nonzero``, boolean indexing, ``masked_select``,
  ``unique``), and tensors built from Python data (``torch.tensor(list)``, or a list used as an index: a
  host-to-device copy on a GPU);
- **aten ops**: every ATen operation the step dispatches (each a kernel launch on a GPU).

Both are counted per step of a solo run (``Experiment``, "pack of 0" on the command line) and of a pack of k members
on the batched path a GPU takes (``solo_kernels`` off), against a pack of 1, for each sampler (``RunConfig.sampler``); the syncs of a ``train`` call (once per report) apart. The
CPU time per step at tiny shapes (batch 16, d = 3) is the host's own work per step; the prototype of 2026-11-26
(benchmarks/batched.py) kept the op count flat in k.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

#: Tensor methods and torch functions whose result the host must wait for on a GPU.
SYNC_METHODS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "nonzero"})
SYNC_FUNCTIONS = frozenset({"nonzero", "masked_select", "unique", "argwhere", "tensor", "as_tensor"})


def _name(func) -> str:
    return getattr(func, "__name__", str(func))


def _bool_index(args) -> bool:
    index = args[1] if len(args) > 1 else None
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


def _list_index(args) -> bool:
    """An index given as a Python list: torch builds a tensor of it and copies it to the device (a copy from
    pageable host memory, which waits for the device's queue)."""
    index = args[1] if len(args) > 1 else None
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, list) for p in parts)


class HostSyncs(TorchFunctionMode):
    """Counts, by name, the calls of a block that would make the host wait for a GPU (module doc)."""

    def __init__(self):
        super().__init__()
        self.calls: Counter = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = _name(func)
        kwargs = kwargs or {}
        if name in ("__getitem__", "__setitem__") and _bool_index(args):
            self.calls[f"{name}[bool]"] += 1
        elif name in ("__getitem__", "__setitem__") and _list_index(args):
            self.calls[f"{name}[list]"] += 1
        elif name in ("tensor", "as_tensor"):
            data = args[0] if args else kwargs.get("data")
            if not isinstance(data, torch.Tensor):  # built from Python data: a host-to-device copy on a GPU
                self.calls[name] += 1
        elif name in SYNC_METHODS or name in SYNC_FUNCTIONS:
            self.calls[name] += 1
        return func(*args, **kwargs)


class AtenOps(TorchDispatchMode):
    """Counts the ATen operations a block dispatches."""

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.total += 1
        return func(*args, **(kwargs or {}))


def _pack(k: int, batch: int, dim: int, sampler: str):
    """A pack of ``k`` on the batched path, prefetch off, warmed up; ``k = 0``: a solo ``Experiment`` (prefetch off)."""
    from ablate.config import RunConfig
    from ablate.core.experiment import Experiment
    from ablate.core.pack import PackedExperiment

    configs = [
        RunConfig(
            latent_dim=dim,
            batch_size=batch,
            seed=i,
            concentration=5.0 + i,
            generator_seed=0,
            device="cpu",
            sampler=sampler,
        )
        for i in range(max(k, 1))
    ]
    if k == 0:
        run = Experiment(configs[0])
    else:
        run = PackedExperiment(configs)
        run.solo_kernels = False
    run.prefetch = False
    run.train(1)  # warm-up: lazily built state
    return run


def _counted(pack, steps: int) -> tuple[Counter, int]:
    syncs, ops = HostSyncs(), AtenOps()
    with syncs, ops:
        pack.train(steps)
    return syncs.calls, ops.total


def count_pack_step(k: int, batch: int, dim: int, steps: int = 4, sampler: str = "adaptive") -> dict:
    """Host syncs and aten ops of a pack of ``k`` AnInfoNCE members (0: a solo run) on the batched path, prefetch off, drawing with
    ``sampler`` (RunConfig.sampler): per step (the difference between a call of ``steps + 1`` steps and one of 1,
    divided by ``steps``) and per ``train`` call (the kinds of read that more steps do not add to: once per report)."""
    one_syncs, one_ops = _counted(_pack(k, batch, dim, sampler), 1)
    many_syncs, many_ops = _counted(_pack(k, batch, dim, sampler), steps + 1)
    per_step = {n: (many_syncs[n] - one_syncs[n]) / steps for n in many_syncs if many_syncs[n] != one_syncs[n]}
    per_call = {n: c for n, c in one_syncs.items() if n not in per_step}  # the reads no step adds to
    return {
        "k": k,
        "B": batch,
        "d": dim,
        "sampler": sampler,
        "host_syncs_per_step": sum(per_step.values()),
        "aten_ops_per_step": (many_ops - one_ops) / steps,
        "syncs_by_kind": dict(sorted(per_step.items())),
        "host_syncs_per_call": sum(per_call.values()),
    }


def cpu_ms_per_step(k: int, sampler: str, batch: int = 16, dim: int = 3, steps: int = 200) -> float:
    """CPU ms per step of a pack of ``k`` (0: a solo run) at tiny shapes (the host's own work: Python and op
    dispatch), best of 3."""
    pack = _pack(k, batch, dim, sampler)
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        pack.train(steps)
        best = min(best, time.process_time() - start)
    return best / steps * 1e3


def rows(packs: list[int], batch: int, dim: int, samplers: list[str]) -> list[dict]:
    """The table of :func:`main` (``python -m benchmarks --only syncs`` prints it too)."""
    out = []
    for sampler in samplers:
        counted = [count_pack_step(k, batch, dim, sampler=sampler) for k in packs]
        base = next((r for r in counted if r["k"] == 1), counted[0])["aten_ops_per_step"]
        for r in counted:
            out.append(
                {
                    "sampler": sampler,
                    "pack_of": r["k"] or "solo",
                    "syncs_per_step": r["host_syncs_per_step"],
                    "syncs_per_call": r["host_syncs_per_call"],
                    "aten_ops_per_step": r["aten_ops_per_step"],
                    "ops_vs_pack_of_1": r["aten_ops_per_step"] / base,
                    "cpu_ms_per_step_B16_d3": cpu_ms_per_step(r["k"], sampler),
                    "syncs_by_kind": ", ".join(f"{n} {c:g}" for n, c in r["syncs_by_kind"].items()) or "-",
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.step_ops")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--dim", type=int, default=10)
    p.add_argument("--packs", default="0,1,8,32", help="pack sizes, comma-separated; 0 is a solo Experiment")
    p.add_argument("--samplers", default="adaptive,fixed", help="RunConfig.sampler values, comma-separated")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    table = rows([int(k) for k in args.packs.split(",")], args.batch, args.dim, args.samplers.split(","))
    print(
        f"# one pack step, batched path (torch {torch.__version__}, B = {args.batch}, d = {args.dim}; "
        "CPU time at B = 16, d = 3, 1 thread)"
    )
    print("sampler | k | host syncs / step | / train call | aten ops / step | ops / pack of 1 | CPU ms / step | kinds")
    for r in table:
        print(
            f"{r['sampler']} | {r['pack_of']} | {r['syncs_per_step']:g} | {r['syncs_per_call']:g} | "
            f"{r['aten_ops_per_step']:g} | {r['ops_vs_pack_of_1']:.2f} | {r['cpu_ms_per_step_B16_d3']:.2f} | "
            f"{r['syncs_by_kind']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
