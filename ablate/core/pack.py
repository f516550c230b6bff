"""A pack: k runs whose configs share every shape and code path (:mod:`ablate.core.pack_fields`), trained as one
batched model. Pure torch: no Ray, no files.

Member i of any pack computes what ``Experiment(configs[i])`` computes alone: its own g, its own initialisation
and its own data stream (each member draws its batches from its own generator, so its numbers do not depend on
what else is in the pack), the same loss and the same Adam update with its own learning rates. On the CPU that
holds to the last bit on any x86 processor: each member's matrix products, Λ̂ and loss are its solo run's own
kernel calls on buffers of their own (:attr:`PackedExperiment.solo_kernels`; :mod:`.batched` says what differs
otherwise, tests/core/test_pack.py checks both the bits and the calls). On a GPU, where the pack is batched, only
up to float reassociation.

How the k models are batched (on a GPU, or with ``solo_kernels`` off): stacked weights ``(k, out, in)`` and
one ``baddbmm`` per layer with a backward that mirrors ``F.linear``'s (:func:`~ablate.core.batched.linear_nt`),
rather than ``torch.func.stack_module_state`` + ``vmap``, which was slower at every size (``python -m benchmarks.pack``),
differs from a solo run in the last bits and would need a vmap rule for the fused loss.

Per-member state: the weights, their gradients and Adam's moments live in flat ``(k, P)`` buffers
(:class:`~.pack_state.PackState`), so Adam updates every tensor of every member with one set of element-wise
operations; the learning rates are a float64 device tensor built once, scaled by the schedule on the device, with
torch.optim.Adam's single-tensor arithmetic otherwise (so each member takes Adam's steps exactly); a member
that is frozen (:meth:`PackedExperiment.freeze`) or failed (non-finite loss) keeps its weights, Λ̂, Adam moments,
step and data generator exactly as they were. On the batched path a failure is decided on the device: a member
whose loss is not finite is masked out of Adam's update with ``torch.where`` and its failing step kept in a device
tensor, read once at the end of :meth:`PackedExperiment.train` (the report); it leaves the batched computation from
the next call on, and its data generator is drawn again from the call's start to the batch before the failing one.
With solo kernels (the CPU, where reading a value costs nothing) the losses' finiteness is read every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from ablate.config import RunConfig
from ablate.core.batched import adam_update_, linear_nt, member_losses, pack_loss
from ablate.core.experiment import Experiment, NonFiniteLossError
from ablate.core.fixed_sampler import FixedShapeSampler, draw_ahead, stacked_rows
from ablate.core.generator import GENERATOR_SLOPE
from ablate.core.pack_eval import evaluate_members
from ablate.core.pack_fields import check_packable
from ablate.core.pack_state import PackState, backward_into_flat
from ablate.core.prefetch import Prefetcher

__all__ = ["PackedExperiment", "member_state"]


class PackedExperiment(PackState):
    """k runs (``configs``) trained as one batched model; see the module docstring. Its state (stacking,
    :meth:`state_dict`, :meth:`load_state_dict`, :meth:`member_state_dict`) is :class:`~.pack_state.PackState`'s.

    Attributes:
        configs: the members' configs, in order.
        k: the number of members.
        frozen: indices of members frozen with :meth:`freeze`.
        failed: index → the step at which the member's loss became non-finite (it trains no further).
    """

    def __init__(self, configs: Sequence[RunConfig]):
        configs = list(configs)
        check_packable(configs)
        self.configs, self.k = configs, len(configs)
        self._members = [Experiment(c) for c in configs]  # each member's g, data stream, init, eval and export
        first, cfg = self._members[0], configs[0]
        self.device, self.dtype = first.device, first.dtype
        self._learn_lambda = cfg.loss == "aninfonce" and cfg.fixed_lambda_hat is None
        self._names = [name for name, _ in first.encoder.named_parameters()] + (["theta"] if self._learn_lambda else [])
        self._slope = next(m.negative_slope for m in first.encoder.net if isinstance(m, torch.nn.LeakyReLU))
        self._g = [
            torch.stack([m.generator.layers[i].weight for m in self._members]) for i in range(cfg.generator_layers)
        ]
        self._g_active: dict[tuple[int, ...], list[Tensor]] = {}
        as_tensor = lambda values: torch.tensor(values, device=self.device, dtype=self.dtype)  # noqa: E731
        self._tau, self._inv_tau = as_tensor([c.tau for c in configs]), as_tensor([1.0 / c.tau for c in configs])
        fixed = cfg.loss == "aninfonce" and not self._learn_lambda
        self._fixed_lambda = torch.stack([m.loss.fixed_lambda for m in self._members]) if fixed else None
        defaults = first.optimizer.defaults
        (self._beta1, self._beta2), self._eps = defaults["betas"], defaults["eps"]
        self.frozen: set[int] = set()
        self.failed: dict[int, int] = {}
        self._gather()
        encoder_columns = self._spans[-1][0] if self._learn_lambda else self._spans[-1][1]
        self._groups = [(0, encoder_columns)] + ([(encoder_columns, self._spans[-1][1])] if self._learn_lambda else [])
        self._lrs = torch.tensor(
            [[c.lr, c.lr_lambda][: len(self._groups)] for c in configs], dtype=torch.float64, device=self.device
        )  # each member's learning rate per column group, built once on the device
        self._sampler = self._fixed_sampler()
        self.prefetch = True
        self.solo_kernels = self.device.type == "cpu"

    def _fixed_sampler(self) -> FixedShapeSampler | None:
        """``sampler: fixed``: one sampler for every member's batch, each member with its own Λ, Λ⁻ and K."""
        cfg = self.configs[0]
        if cfg.sampler != "fixed":
            return None
        neg = [m._lambda_neg for m in self._members]
        return FixedShapeSampler(
            torch.stack([m._lambdas[0] for m in self._members]),
            None if neg[0] is None else torch.stack(neg),
            batch_size=cfg.batch_size, n_negatives=cfg.n_hard_negatives, threshold=cfg.threshold,
        )  # fmt: skip

    # ---------------------------------------------------------------- members
    def freeze(self, i: int) -> None:
        """Stop training member ``i`` (it reached its stop): nothing of it changes any more."""
        if not 0 <= i < self.k:
            raise IndexError(f"pack member {i} out of range 0..{self.k - 1}")
        self.frozen.add(i)

    def error(self, i: int) -> NonFiniteLossError:
        """The error a solo run of failed member ``i`` raises (its message names the step)."""
        return NonFiniteLossError(
            f"loss became non-finite at step {self.failed[i]} (seed {self.configs[i].seed}); "
            "lower the learning rates or check Λ"
        )

    @property
    def solo_kernels(self) -> bool:
        """Whether each member's matrix products, Λ̂ and loss run as its solo run's own kernel calls, so that it
        equals that run to the last bit (:mod:`.batched`); on by default on the CPU. Off, the pack takes the batched
        path a GPU takes (one ``bmm`` per layer for all members), equal up to float reassociation."""
        return self._solo_kernels

    @solo_kernels.setter
    def solo_kernels(self, enabled: bool) -> None:
        self._solo_kernels = bool(enabled)

    @property
    def prefetch(self) -> bool:
        """Whether :meth:`train` draws the next batches in a second thread (as :attr:`Experiment.prefetch`)."""
        return self._prefetch

    @prefetch.setter
    def prefetch(self, enabled: bool) -> None:
        self._prefetch = bool(enabled) and all(c.prefetch for c in self.configs) and self.device.type == "cpu"

    def _generator(self, active: list[int]) -> list[Tensor]:
        if len(active) == self.k:
            return self._g
        key = tuple(active)
        if key not in self._g_active:
            idx = torch.tensor(active, device=self.device)
            self._g_active = {key: [w[idx] for w in self._g]}
        return self._g_active[key]

    def _hard_negatives(self, step: int) -> bool:
        cfg = self.configs[0]
        return cfg.negative_concentration is not None and step >= cfg.hard_negatives_from_step

    def _latents(
        self, active: list[int], hard: bool, rngs: list[torch.Generator] | None = None
    ) -> tuple[Tensor | list[Tensor], list[Tensor]]:
        """Every active member's latents of one batch, rows laid out as :meth:`Experiment.compute_loss` lays them
        out, and each member's generator state after drawing them; from each member's data generator, or from
        ``rngs`` (one per member, in order)."""
        rngs = [self._members[i].data_rng for i in active] if rngs is None else rngs
        if self._sampler is not None:  # sampler: fixed, every member's batch in one pass
            drawn = self._sampler.draw(rngs, self.configs[0].batch_size, members=active, hard_negatives=hard)
            return stacked_rows(*drawn), [rng.get_state() for rng in rngs]
        d, xs = self.configs[0].latent_dim, []
        for i, rng in zip(active, rngs):
            latents = self._members[i].sample_latents(self.configs[0].batch_size, rng, hard_negatives=hard)
            chunks = [t for pair in latents["pairs"] for t in pair]
            if latents["negatives"] is not None:
                chunks.append(latents["negatives"].reshape(-1, d))
            xs.append(torch.cat(chunks))
        return xs, [rng.get_state() for rng in rngs]

    def _batches(self, active: list[int], steps: range):
        """The batches of ``steps`` as :meth:`_draw` gives them (a context manager): by the prefetch thread, else with
        ``sampler: fixed`` drawn ahead with one host read per chunk (:func:`.fixed_sampler.draw_ahead`)."""
        if self._sampler is None or self._prefetch:
            return Prefetcher(lambda s: self._draw(active, s), steps, enabled=self._prefetch)
        rngs, n = [self._members[i].data_rng for i in active], self.configs[0].batch_size
        drawn = draw_ahead(self._sampler, rngs, n, steps, members=active, hard=self._hard_negatives)
        return nullcontext((self._apply_g(stacked_rows(*latents), active), states) for latents, states in drawn)

    def _draw(self, active: list[int], step: int) -> tuple[Tensor, list[Tensor]]:
        """x = g(latents) of every active member's batch of ``step`` ``(k_active, N, d)``, and each member's data
        generator state after drawing it."""
        xs, states = self._latents(active, self._hard_negatives(step))
        return self._apply_g(xs, active), states

    @torch.no_grad()
    def _apply_g(self, xs: Tensor | list[Tensor], active: list[int]) -> Tensor:
        """g of each listed member on its rows of ``xs`` (``(k_active, N, d)`` or one ``(N, d)`` per member)."""
        if self._solo_kernels:  # each member's own g on its own batch, as its solo run draws it
            return torch.stack([self._members[i].generator(x) for i, x in zip(active, xs)])
        x = torch.stack(xs) if isinstance(xs, list) else xs
        g = self._generator(active)
        for layer, w in enumerate(g):
            x = torch.bmm(x, w.mT)
            if layer < len(g) - 1:
                x = F.leaky_relu(x, GENERATOR_SLOPE)
        return x

    def _encode(self, x: Tensor, params: list[Tensor]) -> Tensor:
        """f of each member ``params`` hold on its rows of ``x`` ``(k, N, d)``."""
        cfg = self.configs[0]
        n_layers = len(cfg.encoder_widths) + 1
        h = x
        for layer in range(n_layers):
            h = linear_nt(h, params[2 * layer], params[2 * layer + 1], solo_kernels=self._solo_kernels)
            if layer < n_layers - 1:
                h = F.leaky_relu(h, self._slope)
        return F.normalize(h, dim=-1) if cfg.normalize_output else h

    def _losses(
        self, x: Tensor, params: list[Tensor], active: list[int] | None, hard: bool, rows: Tensor | None = None
    ) -> Tensor:
        """Each computed member's training loss ``(k_active,)`` for the inputs ``x = g(z)``; ``active`` lists the
        members ``params`` hold (None: all), ``rows`` the same indices on the device (built when not given)."""
        cfg, solo = self.configs[0], self._solo_kernels
        h = self._encode(x, params)
        members = list(range(self.k)) if active is None else active
        if active is not None and rows is None:
            rows = torch.tensor(active, device=self.device)
        pick = (lambda t: t) if rows is None else (lambda t: t[rows])  # noqa: E731
        lam = self._softplus(params[-1]) if self._learn_lambda else None
        if self._fixed_lambda is not None:
            lam = pick(self._fixed_lambda).to(h.dtype)
        if solo:
            return member_losses(
                cfg.loss, h, cfg.batch_size, lam=lam, taus=[self.configs[i].tau for i in members],
                hard_negatives=hard, layout=cfg.infonce_layout, batch_negatives=cfg.batch_negatives,
            )  # fmt: skip
        b, ka = cfg.batch_size, h.shape[0]
        h_neg = h[:, 2 * b :].reshape(ka, b, cfg.n_hard_negatives, -1) if hard else None
        return pack_loss(
            cfg.loss, h[:, :b], h[:, b : 2 * b], h_neg, lam=lam, tau=pick(self._tau), inv_tau=pick(self._inv_tau),
            layout=cfg.infonce_layout, batch_negatives=cfg.batch_negatives,
        )  # fmt: skip

    def _softplus(self, theta: Tensor) -> Tensor:
        """Λ̂ = softplus(θ) of each member ``(k, d)``: one call per member with solo kernels, as torch's vector and
        scalar softplus kernels differ in the last bit (:mod:`.batched`)."""
        if self._solo_kernels:
            return torch.stack([F.softplus(row) for row in theta])
        return F.softplus(theta)

    def _adam(self, grad: Tensor, rows: Tensor | None, step: int, factor: float, mask: Tensor | None = None) -> None:
        """Adam's step ``step`` (1-based) for the members in rows ``rows`` of the pack (None: all), their gradients
        one row each of ``grad``, each with its own learning rates times the schedule's ``factor``; with a ``mask``
        (one bool per row, on the device) only the marked rows change."""
        flat, betas = self._flat, (self._beta1, self._beta2)
        if rows is None:  # every member, in place on the pack's own buffers
            adam_update_(
                flat["params"], grad, flat["exp_avg"], flat["exp_avg_sq"], self._lrs, self._groups, step, factor,
                betas, self._eps, mask,
            )  # fmt: skip
            return
        p, m, v = flat["params"][rows], flat["exp_avg"][rows], flat["exp_avg_sq"][rows]
        adam_update_(p, grad, m, v, self._lrs[rows], self._groups, step, factor, betas, self._eps, mask)
        with torch.no_grad():
            for key, rows_now in (("params", p), ("exp_avg", m), ("exp_avg_sq", v)):
                flat[key].index_copy_(0, rows, rows_now)

    def _train_step(self, active: list[int], rows: Tensor | None, x: Tensor, step: int, alive: Tensor | None) -> Tensor:
        """One optimisation step of the ``active`` members (all at ``step``; ``rows`` their indices on the device,
        None when every member trains); returns their losses.

        With ``alive`` (one bool per active member, on the device: the batched path), a member whose loss is not
        finite keeps its state, and ``alive`` is cleared for it in place, with no host sync; :meth:`train` reads it
        once at the end. Without (solo kernels, on the CPU, where a read is free), the failure is recorded here."""
        if rows is None:
            params, grad = self._params, self._flat["grad"]
            grad.zero_()
        else:  # the training members' rows, copied out: the others' weights are not even read
            sub = self._flat["params"][rows]
            grad = torch.zeros_like(sub)
            params = self._leaves(sub, grad)
        losses = self._losses(x, params, None if rows is None else active, self._hard_negatives(step), rows)
        backward_into_flat(losses.sum())
        losses = losses.detach()
        factor = self._members[active[0]]._lr_factor(step)
        if alive is not None:
            alive.logical_and_(torch.isfinite(losses))
            self._adam(grad, rows, step + 1, factor, alive)
            return losses
        finite = torch.isfinite(losses).tolist()  # a failing member must not be updated
        if all(finite):
            self._adam(grad, rows, step + 1, factor)
        elif any(finite):
            keep = [j for j, ok in enumerate(finite) if ok]
            update = torch.tensor([active[j] for j in keep], device=self.device)
            self._adam(grad[keep], update, step + 1, factor)
        for i, ok in zip(active, finite):
            if not ok:
                self.failed[i] = step + 1
        return losses

    def train(self, n_steps: int) -> list[dict[str, Any]]:
        """Run up to ``n_steps`` optimisation steps of every training member; return one dict per member: the
        keys of :meth:`Experiment.train` (``loss`` is the mean over the steps it took here, NaN if none) and
        ``status`` ("training", "frozen" or "failed"). A member whose loss becomes non-finite is marked failed
        (:attr:`failed`) with its state as after its last finite step (its data generator included); the others go
        on. On the batched path that is decided on the device and read once, at the end."""
        losses = torch.full((max(n_steps, 1), self.k), float("nan"), device=self.device, dtype=self.dtype)
        taken = [0] * self.k  # the steps each member took here
        done = 0
        while done < n_steps and self.active:
            active = self.active
            start, first = self._members[active[0]].step, done
            initial = before = [self._members[i].data_rng.get_state() for i in active]
            columns = torch.tensor(active, device=self.device)  # once per set of training members, not per step
            rows = None if len(active) == self.k else columns
            alive = None if self._solo_kernels else torch.ones(len(active), dtype=torch.bool, device=self.device)
            fail_at = None if alive is None else torch.full((len(active),), n_steps, device=self.device)
            keys = range(start, start + n_steps - done)
            with self._batches(active, keys) as batches:
                for x, states in batches:
                    losses[done, columns] = self._train_step(active, rows, x, start + done - first, alive)
                    if fail_at is not None:  # the step at which each member failed, kept on the device
                        fail_at.masked_fill_(~alive & (fail_at == n_steps), done - first)
                    done += 1
                    if any(i in self.failed for i in active):
                        break
                    before = states
            if fail_at is not None:  # the one read of the device's verdicts
                for i, at in zip(active, fail_at.tolist()):
                    if at < n_steps:
                        self.failed[i] = start + at + 1
            for j, i in enumerate(active):
                member = self._members[i]
                if i not in self.failed:
                    member.step = start + done - first
                    member.data_rng.set_state(states[j])  # not past what it trained on, if the sampler drew ahead
                elif fail_at is None:  # the host saw it fail at its last step here
                    member.step = self.failed[i] - 1
                    member.data_rng.set_state(before[j])
                else:  # its stream from this call's start, drawn again up to the batch before the failing one
                    member.step = self.failed[i] - 1
                    member.data_rng.set_state(initial[j])
                    for step in range(start, member.step):
                        self._latents([i], self._hard_negatives(step))
                taken[i] += member.step - start
        return self._summary(losses, taken)

    def _summary(self, losses: Tensor, taken: list[int]) -> list[dict[str, Any]]:
        """Each member's result of :meth:`train`, its mean loss over the ``taken`` steps read in one transfer."""
        # each member's mean as its solo run takes it (the mean of its own contiguous losses), read in one transfer
        trained = [i for i in range(self.k) if taken[i]]
        means = [losses[: taken[i], i].clone().mean() for i in trained]
        means = dict(zip(trained, torch.stack(means).tolist())) if means else {}
        out = []
        for i, m in enumerate(self._members):
            status = "failed" if i in self.failed else "frozen" if i in self.frozen else "training"
            factor = m._lr_factor(m.step - 1) if m.step else 1.0
            out.append(
                {
                    "step": m.step,
                    "samples_seen": m.step * self.configs[i].batch_size,
                    "loss": means.get(i, float("nan")),
                    "lr_now": self.configs[i].lr * factor,
                    "status": status,
                }
            )
        return out

    # ------------------------------------------------------------ evaluation
    def lambda_hat(self) -> Tensor | None:
        """Each member's Λ̂ ``(k, d)`` (learned or fixed), or None for InfoNCE."""
        if self._learn_lambda:
            with torch.no_grad():
                return self._softplus(self._params[-1])
        return None if self._fixed_lambda is None else self._fixed_lambda.clone()

    def evaluate(self, members: Sequence[int] | None = None) -> list[dict[str, Any]]:
        """:meth:`Experiment.evaluate` of each member (all, or those listed), in order: the same dict a solo run
        with the same weights returns. With solo kernels, member by member (to the last bit); on the batched path,
        the members at one step in one batched evaluation and one transfer (:mod:`.pack_eval`)."""
        members = list(range(self.k)) if members is None else list(members)
        if self._solo_kernels:
            out = []
            for i in members:
                self._scatter(i, optimizer=False)
                out.append(self._members[i].evaluate())
            return out
        found: dict[int, dict[str, Any]] = {}
        for step in sorted({self._members[i].step for i in members}):
            at_step = [i for i in members if self._members[i].step == step]
            found.update(zip(at_step, evaluate_members(self, at_step)))
        return [found[i] for i in members]


def member_state(state: dict[str, Any], i: int, device: str = "cpu") -> dict[str, Any]:
    """Member ``i``'s solo state (what ``Experiment(configs[i]).load_state_dict`` takes) derived from a pack
    checkpoint's stacked state: the pack is rebuilt on ``device`` from the configs the checkpoint holds, loaded,
    and member ``i``'s slices are copied out. A checkpoint holds each weight once; this is the derived copy."""
    configs = [
        RunConfig.model_validate({**{k: v for k, v in c.items() if k in RunConfig.model_fields}, "device": device})
        for c in state["configs"]
    ]
    pack = PackedExperiment(configs)
    pack.load_state_dict(state)
    return pack.member_state_dict(i)
