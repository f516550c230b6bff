"""The fixed-shape sampler (``sampler: fixed``): one training batch of latents for k runs at once, with shapes
that do not depend on the draws, and one host read per batch, or per chunk of batches drawn ahead
(:func:`draw_ahead`).

The papers' rejection sampler (:func:`ablate.core.dgp.sample_conditional`, ``sampler: adaptive``) redraws the
rows it rejected in rounds sized by the acceptance measured so far, so every round asks the host how many rows
are left: about ten host syncs per batch, and per member of a pack. Here each positive (and hard negative) is the
first accepted of a fixed number ``K`` of candidates drawn at once, ``K`` chosen when the sampler is built from the
acceptance measured on a probe of its own (so the data stream is not touched) such that a row misses all ``K`` with
probability about :data:`MISS_RATE`. The law is the same: each row's value is the first accepted draw of an i.i.d.
sequence, which is what rejection sampling returns. A row that misses all ``K`` is not biased: it is finished
exactly by the adaptive sampler, continuing the same member's random stream, after one read of a flag
(``hit.all()``) tells the host that some row missed; the rows so finished are counted (:attr:`misses`).

Every member draws its candidates from its own generator, in the same order as its solo run (anchors,
positives, hard negatives, then the finishing rounds), and the selection is element-wise or a reduction along
each row, so a member of a pack equals its solo run bit for bit (tests/core/test_fixed_sampler.py). The data
stream differs from the adaptive sampler's, so the sampler is a science field of the run (:class:`RunConfig`).
Pure torch: no I/O.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ablate.core import dgp

__all__ = [
    "AHEAD_ELEMENTS",
    "AHEAD_WASTE",
    "MAX_AHEAD",
    "MISS_RATE",
    "FixedShapeSampler",
    "PendingBatch",
    "candidate_count",
    "draw_ahead",
]

#: Target probability that a row misses all of its candidates (before the memory cap binds).
MISS_RATE = 1e-6
#: Batches drawn ahead per host read in :func:`draw_ahead`: at most this many, and at most this many elements of
#: latents held at once.
MAX_AHEAD, AHEAD_ELEMENTS = 32, 2**24
#: The share of batches :func:`draw_ahead` may draw in vain (after a miss in their chunk) when it sizes a chunk.
AHEAD_WASTE = 0.05
#: The probe that measures the acceptance: anchors, candidates per anchor, and its own seed.
_PROBE_ROWS, _PROBE_PER_ROW, _PROBE_SEED = 4096, 16, 20_261_128


@functools.lru_cache(maxsize=256)
def _acceptance(lam: tuple[float, ...], threshold: float) -> float:
    """The acceptance of the rejection rule for uniform anchors, measured on a fixed-seed float64 probe."""
    d = len(lam)
    rng = torch.Generator().manual_seed(_PROBE_SEED)
    z = dgp.sample_uniform(_PROBE_ROWS, d, generator=rng, dtype=torch.float64)
    std = torch.tensor(lam, dtype=torch.float64).rsqrt()
    eps = torch.randn((_PROBE_ROWS, _PROBE_PER_ROW, d), generator=rng, dtype=torch.float64) * std
    ok = ((z.unsqueeze(1) + eps).norm(dim=-1) - 1.0).abs() < threshold
    return float(ok.double().mean())


def candidate_count(lam: Sequence[float], threshold: float | None, rows: int, *, miss: float = MISS_RATE) -> int:
    """Candidates per row so that a row misses all of them with probability about ``miss``, at the acceptance
    measured for Λ = ``lam`` (its lower 3-SE bound), capped so that one draw of ``rows`` rows holds at most
    :data:`ablate.core.dgp._MAX_CANDIDATE_ELEMENTS` elements (past the cap, more rows are finished exactly).

    Raises:
        LowAcceptanceError: the acceptance is below :data:`ablate.core.dgp.MIN_ACCEPTANCE` (before any training).
    """
    if threshold is None:
        return 1
    lam = tuple(float(v) for v in lam)
    rate = _acceptance(lam, float(threshold))
    drawn = _PROBE_ROWS * _PROBE_PER_ROW
    if rate < dgp.MIN_ACCEPTANCE:
        raise dgp._acceptance_error(torch.tensor(lam), len(lam), threshold, round(rate * drawn), drawn)
    low = max(rate / 2, rate - 3.0 * math.sqrt(rate * (1.0 - rate) / _PROBE_ROWS))
    wanted = 1 if low >= 1.0 else math.ceil(math.log(miss) / math.log1p(-low))
    cap = max(1, dgp._MAX_CANDIDATE_ELEMENTS // max(rows * len(lam), 1))
    return max(1, min(wanted, cap))


@dataclass
class PendingBatch:
    """A batch drawn up to its finishing rounds (:meth:`FixedShapeSampler.draw_pending`): anchors ``z``, the chosen
    positives and hard negatives each with whether its row had an accepted candidate, and ``missed``, a device flag
    (None without a rejection rule) set where some row had none."""

    z: Tensor
    lam: Tensor
    pos: tuple[Tensor, Tensor]
    neg: tuple[Tensor, Tensor] | None
    members: list[int]
    missed: Tensor | None
    n_negatives: int

    def latents(self) -> tuple[Tensor, Tensor, Tensor | None]:
        """``(z, z⁺, negatives)`` as :meth:`FixedShapeSampler.draw` returns them."""
        k, n, d = self.z.shape
        return self.z, self.pos[0], None if self.neg is None else self.neg[0].view(k, n, self.n_negatives, d)


class FixedShapeSampler:
    """Anchors, positives and hard negatives of one batch for k runs, each from its own generator (module doc).

    Args:
        concentration: each run's Λ ``(k, d)``.
        negative_concentration: each run's Λ⁻ ``(k, d)``, or None without hard negatives.
        batch_size: anchors per batch; sizes the memory cap of ``K``.
        n_negatives: hard negatives per anchor.
        threshold: the rejection threshold, or None for none (then ``K`` = 1 and nothing is rejected).

    Attributes:
        candidates: each run's ``K`` for positives (and :attr:`negative_candidates` for hard negatives).
        misses: rows finished by the exact adaptive round since the sampler was built.
        batches_read, batches_missed: batches whose miss flag :func:`draw_ahead` read, and how many of them missed
            (its estimate of a batch's miss rate, which sizes its chunks).
    """

    def __init__(
        self,
        concentration: Tensor,
        negative_concentration: Tensor | None,
        *,
        batch_size: int,
        n_negatives: int = 0,
        threshold: float | None = 0.1,
    ):
        self.lam, self.lam_neg, self.threshold = concentration, negative_concentration, threshold
        self.n_negatives = n_negatives
        self.candidates = [candidate_count(row.tolist(), threshold, batch_size) for row in concentration]
        self.negative_candidates = (
            None
            if negative_concentration is None
            else [candidate_count(row.tolist(), threshold, batch_size * n_negatives) for row in negative_concentration]
        )
        self.misses = 0
        self.batches_read = self.batches_missed = 0  # batches whose flag draw_ahead read, and those that missed
        self._valid_columns: dict[tuple[int, ...], Tensor] = {}
        self._member_rows: dict[tuple[int, ...], Tensor] = {}

    def draw(
        self, generators: Sequence[torch.Generator], n: int, *, members: Sequence[int] | None = None,
        hard_negatives: bool = False,
    ) -> tuple[Tensor, Tensor, Tensor | None]:  # fmt: skip
        """One batch of ``n`` anchors per member listed in ``members`` (all by default; ``generators`` are theirs,
        in the same order): ``(z, z⁺, negatives)`` of shapes ``(k, n, d)``, ``(k, n, d)`` and ``(k, n, M, d)`` or
        None. Reads one flag on the host (whether any row missed)."""
        batch = self.draw_pending(generators, n, members=members, hard_negatives=hard_negatives)
        missed = batch.missed is not None and bool(batch.missed)  # the one host read
        return self.finish(batch, generators) if missed else batch.latents()

    def draw_pending(
        self, generators: Sequence[torch.Generator], n: int, *, members: Sequence[int] | None = None,
        hard_negatives: bool = False,
    ) -> PendingBatch:  # fmt: skip
        """A batch as :meth:`draw` draws it up to its finishing rounds, reading nothing on the host: its rows,
        and whether any row missed as a device flag (:class:`PendingBatch`). Where the flag is set, the batch is
        finished by :meth:`finish` with the generators as they were right after this draw; otherwise its
        :meth:`PendingBatch.latents` are the batch."""
        members = list(range(self.lam.shape[0])) if members is None else list(members)
        rows = self._rows(members)
        lam = self.lam if rows is None else self.lam[rows]
        k, d = lam.shape
        z = torch.empty((k, n, d), device=lam.device, dtype=lam.dtype)
        for row, rng in zip(z, generators):
            torch.randn((n, d), generator=rng, out=row)
        z = z / z.norm(dim=-1, keepdim=True)
        pos = self._first_accepted(z, lam, [self.candidates[i] for i in members], generators)
        neg = None
        if hard_negatives and self.lam_neg is not None:
            anchors = z.repeat_interleave(self.n_negatives, dim=1)
            counts = [self.negative_candidates[i] for i in members]
            lam_neg = self.lam_neg if rows is None else self.lam_neg[rows]
            neg = self._first_accepted(anchors, lam_neg, counts, generators)
        hits = [pos[1]] + ([] if neg is None else [neg[1]])
        missed = None if self.threshold is None else ~torch.stack([h.all() for h in hits]).all()
        return PendingBatch(z, lam, pos, neg, members, missed, self.n_negatives)

    def finish(
        self, batch: PendingBatch, generators: Sequence[torch.Generator]
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """The batch with its missed rows drawn exactly by the adaptive sampler, member by member, from
        ``generators`` (as they were right after :meth:`draw_pending` drew it); the rows so finished are counted."""
        for j, (i, rng) in enumerate(zip(batch.members, generators)):
            parts = [(batch.pos, batch.z[j], batch.lam[j])]
            if batch.neg is not None:
                parts.append((batch.neg, batch.z[j].repeat_interleave(self.n_negatives, dim=0), self.lam_neg[i]))
            for (values, hit), anchors, concentration in parts:
                rows = (~hit[j]).nonzero().squeeze(1)
                if rows.numel():
                    values[j, rows] = dgp.sample_conditional(
                        anchors[rows], concentration, threshold=self.threshold, generator=rng
                    )
                    self.misses += rows.numel()
        return batch.latents()

    def _first_accepted(
        self, z: Tensor, lam: Tensor, counts: list[int], generators: Sequence[torch.Generator]
    ) -> tuple[Tensor, Tensor]:
        """Each row's first accepted candidate of its member's ``K`` ``(k, n, d)``, and whether it had one."""
        k, n, d = z.shape
        width = max(counts)
        eps = torch.empty((k, n, width, d), device=z.device, dtype=z.dtype)
        for i, (count, rng) in enumerate(zip(counts, generators)):
            if count == width:
                torch.randn((n, count, d), generator=rng, out=eps[i])
            else:  # a narrower member: its own K draws, the padding never accepted
                eps[i, :, :count] = torch.randn((n, count, d), generator=rng, device=z.device, dtype=z.dtype)
        x = z.unsqueeze(2) + eps * lam.rsqrt()[:, None, None, :]
        if self.threshold is None:
            first = x[:, :, 0]
            return first / first.norm(dim=-1, keepdim=True), torch.ones((k, n), dtype=torch.bool, device=z.device)
        norm = x.norm(dim=-1)
        ok = (norm - 1.0).abs() < self.threshold
        if min(counts) < width:
            ok &= self._valid(tuple(counts), z.device)[:, None, :]
        first = ok.to(torch.int8).argmax(dim=-1, keepdim=True)  # the first accepted (0 where none is)
        chosen = x.gather(2, first.unsqueeze(-1).expand(k, n, 1, d)).squeeze(2)
        return chosen / norm.gather(2, first), ok.any(dim=-1)

    def _rows(self, members: list[int]) -> Tensor | None:
        """The members' rows as a device index built once per set of members (None: all, in order), so that a draw
        copies no Python list to the device."""
        key = tuple(members)
        if key == tuple(range(self.lam.shape[0])):
            return None
        if key not in self._member_rows:
            self._member_rows[key] = torch.tensor(key, device=self.lam.device)
        return self._member_rows[key]

    def _valid(self, counts: tuple[int, ...], device: torch.device) -> Tensor:
        """``(k, K_max)``: which candidate columns each member drew (built once per set of members)."""
        if counts not in self._valid_columns:
            width = torch.arange(max(counts), device=device)
            self._valid_columns[counts] = width < torch.tensor(counts, device=device)[:, None]
        return self._valid_columns[counts]


def draw_ahead(
    sampler: FixedShapeSampler,
    generators: Sequence[torch.Generator],
    n: int,
    steps: Sequence[int],
    *,
    members: Sequence[int] | None = None,
    hard: Callable[[int], bool] = lambda step: False,
    chunk: int | None = None,
) -> Iterator[tuple[tuple[Tensor, Tensor, Tensor | None], list[Tensor]]]:
    """The batches of ``steps`` in order, each with every generator's state after it: what :meth:`FixedShapeSampler.draw`
    per step gives, bit for bit, but reading the miss flags once per ``chunk`` batches instead of once per batch.

    A chunk's batches are drawn up to their finishing rounds (:meth:`FixedShapeSampler.draw_pending`), noting each
    generator's state after each, and their flags read together. Where batch j missed, the generators go back to
    their state after j, j is finished exactly (:meth:`FixedShapeSampler.finish`) and the batches after it are drawn
    again from there: the stream is the per-batch one. ``hard(step)``: whether that step's batch has hard negatives.

    ``chunk``: batches per read. By default it is sized so that the batches drawn in vain after a miss stay about
    :data:`AHEAD_WASTE` of those drawn: a chunk of c batches that miss with probability q each wastes about q·c/2 of
    them, so c = 2·AHEAD_WASTE / q, with q the share of batches that missed among those read so far
    (:attr:`FixedShapeSampler.batches_missed`, starting from one miss in 40) and c at most :data:`MAX_AHEAD`
    batches holding at most :data:`AHEAD_ELEMENTS` latents. Where candidates are capped by memory (d = 16 at batch
    1024, where half the batches miss a row) that is one batch per read, as :meth:`FixedShapeSampler.draw`; where
    misses are rare, the cap. The batches are the same at any chunk size; only the reads and the work differ.
    """
    adapt = chunk is None
    if adapt:
        k = sampler.lam.shape[0] if members is None else len(members)
        per_batch = k * n * sampler.lam.shape[1] * (2 + sampler.n_negatives)
        cap = max(1, min(MAX_AHEAD, AHEAD_ELEMENTS // max(per_batch, 1)))
    todo = list(steps)
    while todo:
        if adapt:
            miss_rate = (sampler.batches_missed + 0.025) / (sampler.batches_read + 1)
            chunk = max(1, min(cap, int(2 * AHEAD_WASTE / miss_rate)))
        pending = []
        for step in todo[: max(chunk, 1)]:
            batch = sampler.draw_pending(generators, n, members=members, hard_negatives=hard(step))
            pending.append((batch, [g.get_state() for g in generators]))
        flags = (
            [False] * len(pending)
            if pending[0][0].missed is None
            else torch.stack([b.missed for b, _ in pending]).tolist()  # the one host read of the chunk
        )
        first_miss = next((j for j, missed in enumerate(flags) if missed), None)
        sampler.batches_read += len(pending) if first_miss is None else first_miss + 1
        sampler.batches_missed += first_miss is not None
        for j, (batch, after) in enumerate(pending):
            if j == first_miss:
                for g, state in zip(generators, after):
                    g.set_state(state)
                yield sampler.finish(batch, generators), [g.get_state() for g in generators]
                todo = todo[j + 1 :]  # drawn again after the finishing rounds
                break
            yield batch.latents(), after
        else:
            todo = todo[len(pending) :]


def stacked_rows(z: Tensor, z_pos: Tensor, neg: Tensor | None) -> Tensor:
    """A batch's latents ``(k, rows, d)``: anchors, positives, then hard negatives, as
    :meth:`ablate.core.experiment.Experiment.compute_loss` lays its rows out."""
    return torch.cat([z, z_pos] + ([] if neg is None else [neg.flatten(1, 2)]), dim=1)
