"""`python -m benchmarks.pack [--quick]`: what packs (ablate.core.pack) buy on this machine, on 1 torch thread.

1. How to batch k encoders (reference widths, forward + backward on 2B rows): stacked weights with one ``baddbmm``
   per layer (``ablate.core.batched.linear_nt``, the GPU's path) and with each member's own ``addmm`` calls
   (``solo_kernels``, the CPU's path), against ``torch.func.stack_module_state`` + ``vmap``, and against k separate
   encoders one after the other.
2. Training steps per second of a pack of k (1, 3, 8; AnInfoNCE, members with their own seeds, g, Λ and lrs), with
   solo kernels (the CPU's default) and batched ones, against the same k configs trained as k solo
   ``Experiment``s one after the other (prefetch off: one core).
Times are this thread's CPU time (best of repeats), so that other processes on a shared machine do not count.
   ``member steps/s`` counts every member's step, so the pack's speed-up is its ratio to the solo row.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import torch

from ablate.config import RunConfig
from ablate.core.batched import linear_nt
from ablate.core.encoder import Encoder
from ablate.core.experiment import Experiment
from ablate.core.pack import PackedExperiment

#: (d, batch) of the two sizes measured.
SIZES = [(4, 64), (10, 256)]
PACK_SIZES = [1, 3, 8]


def _best_ms(fn, repeats: int) -> float:
    """The least CPU time of this thread over ``repeats`` calls of ``fn`` (after one warm-up call), in ms.

    CPU time of the calling thread, not wall time: on a shared machine other processes take turns on the cores,
    and with one torch thread (and prefetch off) every operation runs in this thread."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t)
    return best * 1e3


def bench_encoders(d: int, batch: int, k: int, repeats: int) -> dict:
    """ms of one forward + backward of k reference encoders on (k, 2B, d) inputs, three ways."""
    from torch.func import functional_call, stack_module_state, vmap

    encoders = [Encoder(d, d, normalize=True) for _ in range(k)]
    x = torch.randn(k, 2 * batch, d)
    linears = [i for i, m in enumerate(encoders[0].net) if isinstance(m, torch.nn.Linear)]
    weights = [torch.stack([enc.net[i].weight.detach() for enc in encoders]).requires_grad_() for i in linears]
    biases = [torch.stack([enc.net[i].bias.detach() for enc in encoders]).requires_grad_() for i in linears]

    def batched(solo_kernels: bool = False):
        h = x
        for i, (w, b) in enumerate(zip(weights, biases)):
            h = linear_nt(h, w, b, solo_kernels=solo_kernels)
            if i < len(weights) - 1:
                h = torch.nn.functional.leaky_relu(h, 0.01)
        torch.nn.functional.normalize(h, dim=-1).sum().backward()

    params, buffers = stack_module_state(encoders)
    base = copy.deepcopy(encoders[0]).to("meta")

    def vmapped():
        out = vmap(lambda p, b, xi: functional_call(base, (p, b), (xi,)))(params, buffers, x)
        out.sum().backward()

    def separate():
        for i, enc in enumerate(encoders):
            enc(x[i]).sum().backward()

    return {
        "d": d,
        "B": batch,
        "k": k,
        "baddbmm_ms": _best_ms(batched, repeats),
        "solo_kernels_ms": _best_ms(lambda: batched(True), repeats),
        "vmap_ms": _best_ms(vmapped, repeats),
        "k_separate_ms": _best_ms(separate, repeats),
    }


def _configs(d: int, batch: int, k: int) -> list[RunConfig]:
    lams = ["5/25", 10.0, "25/5", 40.0]
    return [
        RunConfig(
            latent_dim=d,
            batch_size=batch,
            seed=i,
            concentration=lams[i % len(lams)],
            lr=1e-4 * (1 + i % 3),
            lr_lambda=1e-3,
            device="cpu",
            prefetch=False,
            max_steps=100_000,
        )
        for i in range(k)
    ]


def bench_steps(d: int, batch: int, k: int, steps: int, repeats: int) -> list[dict]:
    """Member steps per second: a pack of k against k solo Experiments, each training ``steps`` steps per timed
    call (the best of ``repeats`` calls, CPU time of this thread)."""
    configs = _configs(d, batch, k)
    solos = [Experiment(c) for c in configs]
    solo_s = sum(_best_ms(lambda e=e: e.train(steps), repeats) for e in solos) / 1e3
    rows = []
    for how, solo_kernels in (("pack, solo kernels", True), ("pack, batched", False)):
        pack = PackedExperiment(configs)
        pack.solo_kernels = solo_kernels
        pack_s = _best_ms(lambda p=pack: p.train(steps), repeats) / 1e3
        rows.append(
            {
                "d": d,
                "B": batch,
                "k": k,
                "how": how,
                "ms_per_step": pack_s / steps * 1e3,
                "member_steps_per_s": k * steps / pack_s,
                "speedup": solo_s / pack_s,
            }
        )
    return [
        *rows,
        {
            "d": d,
            "B": batch,
            "k": k,
            "how": f"{k} solo",
            "ms_per_step": solo_s / steps * 1e3,
            "member_steps_per_s": k * steps / solo_s,
            "speedup": 1.0,
        },
    ]


def main(argv: list[str] | None = None) -> int:
    from benchmarks.__main__ import _print

    p = argparse.ArgumentParser(prog="python -m benchmarks.pack")
    p.add_argument("--quick", action="store_true", help="fewer repeats and steps")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(f"# packs: torch {torch.__version__}, 1 thread, {time.strftime('%Y-%m-%d %H:%M')}")
    repeats = 3 if args.quick else 10
    _print(
        "k reference encoders, forward + backward on 2B rows (least CPU ms of repeats)",
        [bench_encoders(d, b, k, repeats) for d, b in SIZES for k in PACK_SIZES],
    )
    rows = []
    for d, b in SIZES:
        steps = (5 if args.quick else 20) if d == 4 else (2 if args.quick else 5)
        for k in PACK_SIZES:
            rows.extend(bench_steps(d, b, k, steps, 3 if args.quick else 5))
    _print("AnInfoNCE training: a pack of k against k solo runs (reference encoder, prefetch off)", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
