"""The state side of a pack (:class:`ablate.core.pack.PackedExperiment`): stacking the members' parameters and
Adam moments from their :class:`~ablate.core.experiment.Experiment` objects and back, and the pack's state dict.

Each member keeps an ``Experiment`` of its own: its g, data stream and initialisation come from there, its
evaluation runs there, and its solo state is written from there, so a member's state is exactly the format a
solo run writes. The pack copies a member's slices into it only when they are asked for.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

from ablate.config import RunConfig
from ablate.core.experiment import Experiment

__all__ = ["PACK_FORMAT", "PackState", "backward_into_flat"]

#: Version of :meth:`PackState.state_dict`'s layout.
PACK_FORMAT = 1

#: What torch says, once, of a ``.grad`` strided like a member's row of a flat buffer (by P, not by its own size):
#: that it "may impair performance". It accumulates into it in place all the same, which is the point.
LAYOUT_NOTE = "grad and param do not obey the gradient layout contract"


def backward_into_flat(loss: Tensor) -> None:
    """``loss.backward()`` into the flat gradient buffer, without torch's note on its layout (:data:`LAYOUT_NOTE`)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=LAYOUT_NOTE)
        loss.backward()


class PackState:
    """Stacked state of k members; the base of :class:`~ablate.core.pack.PackedExperiment`.

    Attributes (set by the subclass): ``configs``, ``k``, ``_members`` (one Experiment per member),
    ``_learn_lambda``, ``_names`` (the stacked tensors' names: the encoder's parameters, then ``theta``),
    ``frozen`` and ``failed``. This class keeps the weights, their gradients and Adam's two moments in four flat
    ``(k, P)`` buffers (``_flat``: one row per member, every tensor of a member side by side), and per buffer a
    list of ``(k, …)`` views in ``_names``' order: ``_params`` (leaves whose ``.grad`` is the matching view of the
    flat gradient, so backward accumulates into it), ``_exp_avg`` and ``_exp_avg_sq``. Adam then updates a
    member's every tensor with one set of element-wise operations on its row.
    """

    configs: list[RunConfig]
    k: int
    frozen: set[int]
    failed: dict[int, int]
    _members: list[Experiment]
    _learn_lambda: bool
    _names: list[str]
    _flat: dict[str, Tensor]
    _spans: list[tuple[int, int, torch.Size]]
    _params: list[Tensor]
    _exp_avg: list[Tensor]
    _exp_avg_sq: list[Tensor]

    @property
    def active(self) -> list[int]:
        """Indices of the members still training (neither frozen nor failed)."""
        return [i for i in range(self.k) if i not in self.frozen and i not in self.failed]

    @property
    def steps(self) -> list[int]:
        """Training steps done by each member."""
        return [m.step for m in self._members]

    def _member_params(self, i: int) -> list[torch.nn.Parameter]:
        m = self._members[i]
        return [*m.encoder.parameters(), *([m.loss.theta] if self._learn_lambda else [])]

    def _views(self, flat: Tensor) -> list[Tensor]:
        """The per-tensor ``(rows, …)`` views of a flat ``(rows, P)`` buffer, in ``_names``' order."""
        return [flat[:, start:stop].view(flat.shape[0], *shape) for start, stop, shape in self._spans]

    def _leaves(self, flat: Tensor, grad: Tensor) -> list[Tensor]:
        """Views of ``flat`` as leaves that require a gradient, each with its view of ``grad`` as ``.grad``."""
        leaves = []
        for view, grad_view in zip(self._views(flat), self._views(grad)):
            view.requires_grad_()
            view.grad = grad_view
            leaves.append(view)
        return leaves

    def _gather(self) -> None:
        """Copy the members' parameters and Adam moments (from their Experiment objects) into the flat buffers."""
        per_member = [self._member_params(i) for i in range(self.k)]
        first = per_member[0]
        sizes = [p.numel() for p in first]
        starts = [sum(sizes[:j]) for j in range(len(sizes))]
        self._spans = [(a, a + n, p.shape) for a, n, p in zip(starts, sizes, first)]
        total = sum(sizes)
        like = first[0]
        self._flat = {
            key: torch.zeros(self.k, total, dtype=like.dtype, device=like.device)
            for key in ("params", "grad", "exp_avg", "exp_avg_sq")
        }
        with torch.no_grad():
            for i, params in enumerate(per_member):
                state = self._members[i].optimizer.state
                for (start, stop, _), p in zip(self._spans, params):
                    self._flat["params"][i, start:stop] = p.reshape(-1)
                    for key in ("exp_avg", "exp_avg_sq"):
                        if key in state.get(p, {}):
                            self._flat[key][i, start:stop] = state[p][key].reshape(-1)
        self._params = self._leaves(self._flat["params"], self._flat["grad"])
        self._exp_avg, self._exp_avg_sq = self._views(self._flat["exp_avg"]), self._views(self._flat["exp_avg_sq"])
        self._check_steps()

    def _check_steps(self) -> None:
        steps = {self._members[i].step for i in self.active}
        if len(steps) > 1:
            raise ValueError(f"the training members of a pack must be at one step, got steps {sorted(steps)}")

    def _scatter(self, i: int, *, optimizer: bool) -> None:
        """Copy member ``i``'s slices into its Experiment (weights; with ``optimizer``, also Adam's state)."""
        m = self._members[i]
        params = self._member_params(i)
        with torch.no_grad():
            for p, stacked in zip(params, self._params):
                p.copy_(stacked[i])
        if not optimizer:
            return
        m.optimizer.state.clear()
        if m.step:
            scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32  # Adam's
            for j, p in enumerate(params):
                m.optimizer.state[p] = {
                    "step": torch.tensor(float(m.step), dtype=scalar),
                    "exp_avg": self._exp_avg[j][i].clone(),
                    "exp_avg_sq": self._exp_avg_sq[j][i].clone(),
                }
        factor = m._lr_factor(m.step - 1) if m.step else 1.0
        for group in m.optimizer.param_groups:
            group["lr"] = group["base_lr"] * factor

    # ----------------------------------------------------------- persistence
    def _stacks(self) -> tuple[tuple[str, list[Tensor]], ...]:
        return (("params", self._params), ("exp_avg", self._exp_avg), ("exp_avg_sq", self._exp_avg_sq))

    def member_state_dict(self, i: int) -> dict[str, Any]:
        """Member ``i``'s state exactly as its solo :meth:`Experiment.state_dict` writes it (copies)."""
        self._scatter(i, optimizer=True)
        return _clone(self._members[i].state_dict())

    def state_dict(self, *, include_members: bool = False) -> dict[str, Any]:
        """The stacked state (weights, Adam moments, per-member step, data generator, frozen and failed members),
        each weight once; with ``include_members``, also each member's solo state (``state["members"][i]`` loads
        into ``Experiment(configs[i])``), which doubles the size: checkpoints leave it out, and
        :func:`ablate.core.pack.member_state` derives a member's solo state from the stacked one when it is needed.
        Loadable with ``torch.load(..., weights_only=True)``."""
        state = {
            "format": PACK_FORMAT,
            "configs": [c.model_dump(mode="json") for c in self.configs],
            "steps": self.steps,
            "data_rng": [m.data_rng.get_state() for m in self._members],
            "frozen": sorted(self.frozen),
            "failed": [[i, s] for i, s in sorted(self.failed.items())],
            "stacked": {key: {n: t.detach().clone() for n, t in zip(self._names, ts)} for key, ts in self._stacks()},
        }
        if include_members:
            state["members"] = [self.member_state_dict(i) for i in range(self.k)]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output, or build the pack from its members' solo states:
        ``{"members": [Experiment.state_dict(), …], "frozen": [indices], "failed": [[index, step], …]}`` (the last
        two optional; the members that train on must be at one step)."""
        n = len(state["configs"] if "stacked" in state else state["members"])
        if n != self.k:
            raise ValueError(f"checkpoint holds {n} pack members, this pack has {self.k}")
        if "stacked" not in state:
            for m, member_state in zip(self._members, state["members"]):
                m.load_state_dict(member_state)
        else:
            for i, saved in enumerate(state["configs"]):
                config = RunConfig.model_validate({k: v for k, v in saved.items() if k in RunConfig.model_fields})
                if config.science() != self.configs[i].science():
                    raise ValueError(f"checkpoint member {i} was written by a run with a different configuration")
            for m, step, rng in zip(self._members, state["steps"], state["data_rng"]):
                m.step = int(step)
                m.data_rng.set_state(rng.cpu())
        self.frozen = {int(i) for i in state.get("frozen", [])}
        self.failed = {int(i): int(s) for i, s in state.get("failed", [])}
        if "stacked" not in state:
            self._gather()
            return
        stacked = state["stacked"]
        with torch.no_grad():
            for key, tensors in self._stacks():
                for name, t in zip(self._names, tensors):
                    t.copy_(stacked[key][name])
        self._check_steps()


def _clone(tree: Any) -> Any:
    """A copy of a nested state (dicts, lists, tensors) that later training cannot change; a module state's
    ``_metadata`` is kept."""
    if isinstance(tree, Tensor):
        return tree.detach().clone()
    if isinstance(tree, dict):
        out = type(tree)((k, _clone(v)) for k, v in tree.items())
        if hasattr(tree, "_metadata"):
            out._metadata = tree._metadata
        return out
    if isinstance(tree, list | tuple):
        return type(tree)(_clone(v) for v in tree)
    return tree
