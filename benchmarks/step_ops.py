"""`python -m benchmarks.step_ops [--batch B] [--dim D] [--packs 1,8,32]`: what one pack step asks of the host.

For a GPU the question is not the CPU time but how often a step makes the host wait for the device and how many
operations it launches. Both are counted here on the CPU, from Python, so that they can be measured on any machine:

- **host syncs**: calls that would make the host wait for a GPU: reading a value (``item``, ``tolist``,
  ``bool``/``int``/``float`` of a tensor), data-dependent shapes (``nonzero``, boolean indexing, ``masked_select``,
  ``unique``), and tensors built from Python data (``torch.tensor(list)``: a host-to-device copy on a GPU);
- **aten ops**: every ATen operation the step dispatches (each a kernel launch on a GPU).

Both are counted per step of a pack of k members on the batched path a GPU takes (``solo_kernels`` off), against
a pack of 1; the prototype of 2026-11-26 (benchmarks/batched.py) kept the op count flat in k.
"""

from __future__ import annotations

import argparse
import sys
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


def count_pack_step(k: int, batch: int, dim: int, steps: int = 3) -> dict:
    """Host syncs and aten ops per step of a pack of ``k`` AnInfoNCE members on the batched path, prefetch off."""
    from ablate.config import RunConfig
    from ablate.core.pack import PackedExperiment

    configs = [
        RunConfig(latent_dim=dim, batch_size=batch, seed=i, concentration=5.0 + i, generator_seed=0, device="cpu")
        for i in range(k)
    ]
    pack = PackedExperiment(configs)
    pack.solo_kernels = False
    pack.prefetch = False
    pack.train(1)  # warm-up: lazily built state
    syncs, ops = HostSyncs(), AtenOps()
    with syncs, ops:
        pack.train(steps)
    return {
        "k": k,
        "B": batch,
        "d": dim,
        "host_syncs_per_step": sum(syncs.calls.values()) / steps,
        "aten_ops_per_step": ops.total / steps,
        "syncs_by_kind": dict(sorted((n, c / steps) for n, c in syncs.calls.items())),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.step_ops")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--dim", type=int, default=10)
    p.add_argument("--packs", default="1,8,32")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = [count_pack_step(int(k), args.batch, args.dim) for k in args.packs.split(",")]
    base = rows[0]["aten_ops_per_step"]
    print(f"# one pack step, batched path (torch {torch.__version__}, B = {args.batch}, d = {args.dim})")
    print("k | host syncs | aten ops | ops / pack of 1 | syncs by kind")
    for r in rows:
        kinds = ", ".join(f"{n} {c:g}" for n, c in r["syncs_by_kind"].items())
        print(
            f"{r['k']} | {r['host_syncs_per_step']:g} | {r['aten_ops_per_step']:g} | "
            f"{r['aten_ops_per_step'] / base:.2f} | {kinds}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
