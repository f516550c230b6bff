"""`ablate.core.adam.HostCountedAdam`: torch.optim.Adam's numbers to the last bit, with no value read per step."""

from __future__ import annotations

import copy

import pytest
import torch

from ablate.core.adam import HostCountedAdam
from benchmarks.step_ops import HostSyncs


def _params(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(12, 7, generator=g), torch.randn(12, generator=g), torch.randn(4, generator=g)]


def _pair(cls_a=torch.optim.Adam, cls_b=HostCountedAdam):
    """Two optimisers of the same kind of model (two groups with their own learning rates), on equal parameters."""
    made = []
    for cls in (cls_a, cls_b):
        ps = [p.requires_grad_() for p in _params()]
        made.append((ps, cls([{"params": ps[:2], "lr": 1e-3}, {"params": ps[2:], "lr": 3e-2}], betas=(0.9, 0.99))))
    return made


def _step(pairs, g: torch.Generator, *, skip: int | None = None) -> None:
    grads = [torch.randn(p.shape, generator=g) * 10 ** torch.randint(-3, 3, (), generator=g) for p in pairs[0][0]]
    for ps, opt in pairs:
        for j, (p, grad) in enumerate(zip(ps, grads)):
            p.grad = None if j == skip else grad.clone()
        opt.step()


def _assert_equal(pairs) -> None:
    (pa, oa), (pb, ob) = pairs
    assert all(torch.equal(a, b) for a, b in zip(pa, pb))
    sa, sb = oa.state_dict(), ob.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    for i, state in sa["state"].items():
        for key, value in state.items():
            assert torch.equal(value, sb["state"][i][key]) and value.dtype == sb["state"][i][key].dtype, (i, key)


def test_equals_torch_adam_bit_for_bit_through_schedules_skips_and_reloads():
    """300 steps with gradients over six orders of magnitude, a learning-rate change (a schedule sets group['lr']),
    steps where one parameter has no gradient (its count stays behind, as in torch), a reload from a state dict
    and a state written in directly (as a pack writes a member's): every parameter, moment and count equal."""
    pairs, g = _pair(), torch.Generator().manual_seed(1)
    for step in range(300):
        if step == 120:
            for _, opt in pairs:
                for group in opt.param_groups:
                    group["lr"] *= 0.25
        if step == 200:  # both reload the reference's state: new step tensors, counts read once
            saved = pairs[0][1].state_dict()
            for _, opt in pairs:  # a copy each: loading may keep the very tensors it is given
                opt.load_state_dict(copy.deepcopy(saved))
        if step == 250:  # a state written in place of the old, with another count
            for ps, opt in pairs:
                opt.state[ps[2]] = {
                    "step": torch.tensor(7.0),
                    "exp_avg": torch.full_like(ps[2], 0.01),
                    "exp_avg_sq": torch.full_like(ps[2], 1e-4),
                }
        _step(pairs, g, skip=2 if 50 <= step < 60 else None)
        if step % 50 == 49:
            _assert_equal(pairs)
    _assert_equal(pairs)
    assert float(pairs[1][1].state[pairs[1][0][0]]["step"]) == 300
    assert float(pairs[1][1].state[pairs[1][0][2]]["step"]) == 7 + 50


def test_a_step_reads_no_tensor_value():
    """torch.optim.Adam reads each parameter's count with item() every step; this one reads a count only once per
    new state (its first step, and the first after a reload)."""
    pairs, g = _pair(), torch.Generator().manual_seed(2)
    _step(pairs, g)
    counted = []
    for _, opt in pairs:
        with HostSyncs() as syncs:
            opt.step()
            opt.step()
        counted.append(dict(syncs.calls))
    assert counted[0].get("item", 0) == 2 * 3 and counted[1] == {}, counted
    pairs[1][1].load_state_dict(copy.deepcopy(pairs[0][1].state_dict()))
    with HostSyncs() as syncs:
        pairs[1][1].step()
        pairs[1][1].step()
    assert dict(syncs.calls) == {"__int__": 3}, syncs.calls


@pytest.mark.parametrize(
    "option", [{"weight_decay": 0.1}, {"amsgrad": True}, {"maximize": True}, {"lr": torch.tensor(1e-3)}]
)
def test_refuses_what_it_does_not_implement(option):
    with pytest.raises(ValueError, match="plain Adam"):
        HostCountedAdam(_params(), **option)
