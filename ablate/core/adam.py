"""Adam for a solo run with no value read per step (:class:`HostCountedAdam`). Pure torch: no I/O.

``torch.optim.Adam`` (not capturable, not fused) keeps each parameter's step count in a CPU tensor and reads it
with ``.item()`` every step to form the bias corrections. On a GPU that read does not wait for the card, but it is
still a read of a tensor on every step, and on the CPU (where the suite counts host syncs) it cannot be told apart
from one that would. :class:`HostCountedAdam` is the same optimiser with the counts also kept as Python integers,
so a training step reads nothing: a count is read from its tensor only when the tensor object is new (the first
step after ``load_state_dict``, or after a pack wrote a member's state in: :mod:`ablate.core.pack_state`).

The arithmetic is Adam's, in the order of torch's single-tensor step, through the ``torch._foreach_*`` ops with
one Python scalar per parameter: on the CPU they run the same kernels one tensor at a time, so every parameter and
moment equals ``torch.optim.Adam``'s to the last bit (tests/core/test_adam.py); on a GPU they are a few fused
launches per step instead of several per parameter. The state (``state_dict``) is torch's, unchanged, so
checkpoints written before or by ``torch.optim.Adam`` load and continue alike.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["HostCountedAdam"]


class HostCountedAdam(torch.optim.Adam):
    """``torch.optim.Adam`` without weight decay, amsgrad, ``maximize``, or capturable/fused/differentiable modes,
    whose :meth:`step` reads no tensor value (module docstring). Takes the same arguments; refuses the modes it
    does not implement."""

    def __init__(self, params: Any, **kwargs: Any):
        super().__init__(params, **kwargs)
        for group in self.param_groups:
            unsupported = [k for k in ("amsgrad", "maximize", "capturable", "differentiable", "fused") if group.get(k)]
            if group.get("weight_decay") or unsupported or isinstance(group["lr"], Tensor):
                raise ValueError(
                    "HostCountedAdam implements plain Adam (float lr, no weight decay); "
                    f"got weight_decay={group.get('weight_decay')}, {', '.join(unsupported) or 'a tensor lr'}"
                )
        self._counts: dict[Tensor, tuple[Tensor, int]] = {}  # param → (its step tensor, the count it holds)

    def _count(self, p: Tensor, state: dict[str, Any]) -> int:
        """The step count of ``p`` before this step, read from its tensor only when that tensor is new."""
        step_t = state["step"]
        known = self._counts.get(p)
        if known is not None and known[0] is step_t:
            return known[1]
        return int(step_t)  # once per new state (a load, or a pack's scatter); never in the steady state

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One Adam step of every parameter with a gradient (``closure`` as in torch)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, exp_avgs, exp_avg_sqs, step_ts, counts = [], [], [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:  # lazily, as torch.optim.Adam does (the step on the host, float32 unless default 64)
                    state["step"] = torch.tensor(0.0, dtype=_scalar_dtype())
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                count = self._count(p, state) + 1
                self._counts[p] = (state["step"], count)
                params.append(p), grads.append(p.grad), step_ts.append(state["step"]), counts.append(count)
                exp_avgs.append(state["exp_avg"]), exp_avg_sqs.append(state["exp_avg_sq"])
            if params:
                _adam_(params, grads, exp_avgs, exp_avg_sqs, step_ts, counts, group)
        return loss


def _scalar_dtype() -> torch.dtype:
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def _adam_(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    step_ts: list[Tensor],
    counts: list[int],
    group: dict[str, Any],
) -> None:
    """Adam's update of one parameter group in place; ``counts``: each parameter's step being taken (1-based)."""
    beta1, beta2 = group["betas"]
    lr, eps = group["lr"], group["eps"]
    torch._foreach_add_(step_ts, 1)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
    denoms = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denoms, [(1 - beta2**t) ** 0.5 for t in counts])
    torch._foreach_add_(denoms, eps)
    torch._foreach_addcdiv_(params, exp_avgs, denoms, [-(lr / (1 - beta1**t)) for t in counts])
