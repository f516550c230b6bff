"""What an `ablate run` does to a run directory, decided from ablate's own files before Ray starts.

For each of the grid's points (:func:`grid_points`): its trial finished (at the current ``max_steps`` /
``target_r2``): reuse it; it has reports: continue it from its newest checkpoint that loads and that its log
covers, the log cut back to that checkpoint; none: start it. A first run, ``--resume``, more seeds, a new axis
value, a higher ``max_steps`` or a ``--set`` that makes new points are all the same operation
(:func:`plan_run`): a decision read from the files alone (:func:`decide_run`, which writes nothing), then its
writes (:func:`apply_plan`); one fresh Ray Tune experiment then runs :attr:`Plan.units`, the work that remains.

A pack (``--pack``) is one unit of several points; a pack that exists in the run keeps its members, new points
are packed anew. Nothing Ray wrote is read.
"""

from __future__ import annotations

import copy
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from ablate.config import RunConfig
from ablate.service.records.record import RunRecord, TrialRecord
from ablate.service.records.rundir import TRIAL_PREFIX, RunError
from ablate.service.records.store import Listing, Store, as_store
from ablate.service.records.trial import (
    key_of,
    member_steps,
    pack_covered,
    pack_id,
    record_id,
    solo_covered,
)
from ablate.service.records.trial_log import ended
from ablate.service.specs.costs import costliest_first
from ablate.service.specs.grids import Grid
from ablate.service.specs.params import RECORD_KEY, config_from_params

__all__ = ["Plan", "Point", "RECORD_KEY", "apply_plan", "decide", "decide_run", "grid_points", "plan_run"]

_log = logging.getLogger("ablate.service.records.plan")


@dataclass
class Point:
    """One grid point: its trial id (folder ``trial_<id>``), its settings as params.json holds them, its config."""

    trial_id: str
    params: dict[str, Any]
    config: RunConfig
    label: str


@dataclass
class Plan:
    """What a run does: the trial ids it reuses, continues and starts, and the units Ray Tune runs."""

    points: list[Point]
    reused: list[str] = field(default_factory=list)
    continued: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    units: list[dict[str, Any]] = field(default_factory=list)
    kept_packs: int = 0  # packs that exist in the run and keep their members
    solo: dict[str, int] = field(default_factory=dict)  # with --pack: why points train solo → how many
    # what applying it writes (apply_plan), decided without writing:
    params: list[Point] = field(default_factory=list)  # points whose params.json is written (continued, started)
    new_packs: dict[str, list[str]] = field(default_factory=dict)  # pack id → members: pack.json written
    cuts: dict[str, int] = field(default_factory=dict)  # trial id → its log is cut back to this step (0: all)
    drops: dict[str, int | None] = field(default_factory=dict)  # trial or pack id → checkpoints past it dropped
    redone: int = 0  # reports the cut logs dropped, to be trained again (set by apply_plan)
    #: the run's files as the decision read them (one scan), which its writes read again rather than the store
    listing: Listing | None = field(default=None, repr=False, compare=False)

    def summary(self) -> str:
        """``N points: a reused, b continued, c started``."""
        return (
            f"{len(self.points)} points: {len(self.reused)} reused, {len(self.continued)} continued, "
            f"{len(self.started)} started"
        )

    def only(self, units: set[str]) -> Plan:
        """This plan cut down to the units whose ids (a point's trial id, a pack's id) are in ``units``: only
        their points' files are written when it is applied, only they run (the runner's retries)."""
        kept = [u for u in self.units if u[RECORD_KEY]["id"] in units]
        trials = {t for u in kept for t in u[RECORD_KEY].get("members", [u[RECORD_KEY]["id"]])}
        return Plan(
            self.points,
            continued=[t for t in self.continued if t in trials],
            started=[t for t in self.started if t in trials],
            units=kept,
            kept_packs=sum(1 for u in kept if "members" in u[RECORD_KEY] and u[RECORD_KEY]["id"] not in self.new_packs),
            params=[p for p in self.params if p.trial_id in trials],
            new_packs={k: v for k, v in self.new_packs.items() if k in units},
            cuts={k: v for k, v in self.cuts.items() if k in trials},
            drops={k: v for k, v in self.drops.items() if k in trials or k in units},
            listing=self.listing,
        )

    def solo_line(self) -> str | None:
        """With ``--pack``: which points train solo and why, in one line (None when every point packs)."""
        if not self.solo:
            return None
        n = sum(self.solo.values())
        return f"{n} point(s) train solo, not packed: " + "; ".join(f"{k} ({v})" for k, v in self.solo.items())


def grid_points(grid: Grid) -> list[Point]:
    """The grid's points, costliest first (the order Ray starts them in); points with the same science settings
    and seed (the same key) once."""
    shown = grid.axis_names()
    base = {"grid": grid.name, "scale": grid.scale, **copy.deepcopy(grid.base), **grid.stop.settings()}
    trials = grid.trials
    points, seen = [], set()
    for i in costliest_first([t.config for t in trials]):
        trial = trials[i]
        params = {**base, **copy.deepcopy(grid.point_params(trial))}
        tid = record_id(params, trial.config, shown)
        if key_of(tid) in seen:
            continue
        seen.add(key_of(tid))
        points.append(Point(tid, params, trial.config, trial.label))
    return points


def _existing(run_dir: Store, listing: Listing) -> dict[str, str]:
    """key → trial id of the trial folders already in the run (a point keeps the folder it was first given)."""
    out = {}
    for trial in RunRecord(run_dir).points(listing):
        out.setdefault(key_of(trial.id), trial.id)
    return out


def decide(config: RunConfig, rows: list[dict[str, Any]]) -> str:
    """What a run does with a point's trial, from its settings and its log's intact ``rows``: ``"reuse"`` (finished
    at these stop settings, or its loss went non-finite: it stays failed), ``"continue"`` (it has reports: from its
    newest checkpoint its log covers) or ``"start"``. :func:`plan_run` acts on it; ``ablate status`` says it."""
    if ended(rows, config.max_steps, config.target_r2):
        return "reuse"
    return "continue" if rows else "start"


def _write_params(run_dir: Store, point: Point, listing: Listing | None) -> None:
    """A point's params.json, and its folder cleared of an earlier run's error and stopped files (the run trains
    it again): its record says so (``prepared``), and the driver does not clear them again as the trial starts."""
    trial = TrialRecord(run_dir, point.trial_id)
    trial.write_params(point.params)
    trial.clear_error(listing)
    trial.clear_stopped(listing)


def _unit(point: Point, record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in point.params.items() if k not in ("grid", "scale")} | {RECORD_KEY: record}


def _check_budget(points: list[Point], logs: dict[str, list[dict[str, Any]]]) -> None:
    """Refuse a ``max_steps`` below the steps trials of the run have trained (:class:`RunError`, before anything is
    written): the run keeps what it trained, and its record cannot say both budgets at once (its points would
    read max_steps N while their folders say they trained past it)."""
    over = []
    for p in points:
        rows = logs[p.trial_id]
        step = rows[-1].get("step") if rows else None
        if isinstance(step, int) and step > p.config.max_steps:
            over.append((step, p))
    if over:
        step, p = max(over, key=lambda item: item[0])
        raise RunError(
            f"max_steps {p.config.max_steps}: {len(over)} trial(s) of this run trained past it (trial_{p.trial_id} "
            f"to step {step}); a run keeps what it trained: run it with max_steps >= {step}, or start a new run "
            "with another --name"
        )


def check_trial_folders(run_dir: str | os.PathLike) -> None:
    """Refuse (:class:`RunError`) a run whose trial folder is a link, or leads out of the run directory: ablate
    writes only inside the run, and a link would have it write (and cut logs, drop checkpoints) elsewhere (the
    store says where a folder leads: :meth:`~ablate.service.records.store.base.Store.linked_out`; a bucket has no
    links)."""
    store = as_store(run_dir)
    for name in store.list(dirs=True):
        target = store.linked_out(name) if name.startswith(TRIAL_PREFIX) else None
        if target is not None:
            raise RunError(
                f"{store.join(name)}: a trial folder that links to {target}; ablate writes only inside the run "
                "directory: put the folder itself there (or remove the link) and run again"
            )


def plan_run(
    grid: Grid,
    run_dir: str | os.PathLike | Store,
    *,
    pack: int = 1,
    keep: int = 2,
    every: float = 0.0,
    results_every: float = 0.0,
) -> Plan:
    """Decide what running ``grid`` into the run directory does (:func:`decide_run`) and write it
    (:func:`apply_plan`): each point's params.json, new packs' pack.json, the logs of the trials that continue cut
    back to their checkpoint. Returns the :class:`Plan`."""
    plan = decide_run(grid, run_dir, pack=pack, keep=keep, every=every, results_every=results_every)
    return apply_plan(plan, run_dir)


def decide_run(
    grid: Grid,
    run_dir: str | os.PathLike | Store,
    *,
    pack: int = 1,
    keep: int = 2,
    every: float = 0.0,
    results_every: float = 0.0,
) -> Plan:
    """What running ``grid`` into ``run_dir`` does, decided from the run directory's files without writing any:
    per point reuse, continue (from which step) or start; the packs; and what :func:`apply_plan` will write.
    Refuses (:class:`RunError`) a ``max_steps`` below what the run trained.

    ``pack`` > 1: the points that remain train in packs of up to ``pack`` points (packs already in the run keep
    their members). ``keep``: checkpoints each trial keeps; ``every``: seconds between its checkpoints (0: every
    report); ``results_every``: seconds between a trial's results to Ray (0: a result per report).
    """
    run_dir = as_store(run_dir)
    listing = RunRecord(run_dir).scan()  # one LIST a thousand files in a bucket; every read below asks it first
    existing = _existing(run_dir, listing)
    points = grid_points(grid)
    for p in points:  # a point first recorded under another readable name keeps its folder
        p.trial_id = existing.get(key_of(p.trial_id), p.trial_id)
    plan = Plan(points, listing=listing)
    todo: list[Point] = []
    logs = {p.trial_id: TrialRecord(run_dir, p.trial_id).rows(listing) for p in points}
    _check_budget(points, logs)
    for p in points:
        action = decide(p.config, logs[p.trial_id])
        if action == "reuse":
            plan.reused.append(p.trial_id)
            continue
        plan.params.append(p)
        (plan.continued if action == "continue" else plan.started).append(p.trial_id)
        todo.append(p)
    record = {"dir": str(RunRecord(run_dir).dir), "keep": keep, "every": every, "results_every": results_every}
    if pack > 1:
        _plan_packs(plan, todo, run_dir, pack, record)
        return plan
    for p in todo:
        _continue_solo(plan, run_dir, p, logs[p.trial_id])
        plan.units.append(_unit(p, {**record, "id": p.trial_id, "prepared": True}))
    return plan


def apply_plan(plan: Plan, run_dir: str | os.PathLike | Store) -> Plan:
    """Write what ``plan`` decided: params.json of its points, pack.json of its new packs, each cut log (saying
    when reports are run again) and the checkpoints past each cut dropped. Returns ``plan``."""
    run_dir, listing = as_store(run_dir), plan.listing
    for p in plan.params:
        _write_params(run_dir, p, listing)
    for pid, members in plan.new_packs.items():
        TrialRecord(run_dir, pid).write_pack(members)
    for tid, step in plan.cuts.items():
        before, kept = TrialRecord(run_dir, tid).cut(step, listing)
        plan.redone += before - kept
        if kept < before and tid in plan.drops:  # a solo trial's (a pack says nothing per member)
            _log.warning("%s: continues from step %d; its reports after it (%d) are run again", tid, step,
                         before - kept)  # fmt: skip
    for tid, step in plan.drops.items():
        TrialRecord(run_dir, tid).drop_checkpoints_after(step, listing)
    return plan


def _continue_solo(plan: Plan, run_dir: Store, point: Point, rows: list[dict[str, Any]]) -> None:
    """Where a trial continues from: its newest checkpoint that loads and that its log covers (step 0 without
    one); its log is cut back to it and the checkpoints past it dropped (:func:`apply_plan`). ``rows``: its log's
    intact rows (none: no checkpoint can be covered, and none is read)."""
    trial = TrialRecord(run_dir, point.trial_id)
    listing = plan.listing
    state = trial.resume_point(solo_covered(trial.raw_rows(listing)), listing=listing) if rows else None
    plan.cuts[point.trial_id] = state["step"] if state is not None else 0
    plan.drops[point.trial_id] = state["step"] if state is not None else None


def _recorded_packs(run_dir: Store, listing: Listing | None) -> dict[str, list[str]]:
    """pack id → its members' trial ids, from the pack folders already in the run."""
    out = {}
    for pack in RunRecord(run_dir).packs(listing):
        members = pack.read_pack()
        if members is not None:
            out[pack.id] = members
    return out


def _plan_packs(plan: Plan, todo: list[Point], run_dir: Store, size: int, record: dict[str, Any]) -> None:
    """Packs in the run that hold a point to train continue with their members; the other points are packed anew."""
    from ablate.core.pack_fields import can_pack, pack_groups

    by_id = {p.trial_id: p for p in plan.points}
    waiting = {p.trial_id for p in todo}
    for pid, members in _recorded_packs(run_dir, plan.listing).items():
        if not waiting.intersection(members):
            continue
        points = [by_id.get(m) or _recorded_point(run_dir, m) for m in members]
        if any(p is None for p in points):
            _log.warning("pack %s: a member's params.json is missing; its members are packed anew", pid)
            continue
        waiting.difference_update(members)
        plan.kept_packs += 1
        _continue_pack(plan, run_dir, pid, points)  # type: ignore[arg-type]
        plan.units.append(_pack_unit(points, {**record, "id": pid}))  # type: ignore[arg-type]
    for p in todo:  # each trains in a pack of its own
        ok, why = can_pack(p.config)
        if not ok:
            plan.solo[why] = plan.solo.get(why, 0) + 1
    fresh = [p for p in todo if p.trial_id in waiting]
    for group in pack_groups([p.config for p in fresh], size):
        points = [fresh[i] for i in group]
        pid = pack_id([p.trial_id for p in points])
        plan.new_packs[pid] = [p.trial_id for p in points]
        _continue_pack(plan, run_dir, pid, points)
        plan.units.append(_pack_unit(points, {**record, "id": pid, "prepared": True}))


def _recorded_point(run_dir: Store, trial_id: str) -> Point | None:
    """A pack member that is not a point of this grid, from its params.json."""
    params = TrialRecord(run_dir, trial_id).read_params()
    if params is None:
        return None
    try:
        return Point(trial_id, params, config_from_params(params, trial_id), trial_id)
    except ValueError:
        return None


def _continue_pack(plan: Plan, run_dir: Store, pid: str, points: list[Point]) -> None:
    """Where a pack continues from: its newest checkpoint its members' logs cover; each member's log is cut back to
    its step in it and the pack's checkpoints past it dropped (:func:`apply_plan`)."""
    listing = plan.listing
    logs = [TrialRecord(run_dir, p.trial_id).raw_rows(listing) for p in points]
    state = TrialRecord(run_dir, pid).resume_point(pack_covered(logs), listing=listing)
    steps = member_steps(state) if state is not None else [0] * len(points)
    for p, step in zip(points, steps):
        plan.cuts[p.trial_id] = step
    plan.drops[pid] = state["step"] if state is not None else None


def _pack_unit(points: list[Point], record: dict[str, Any]) -> dict[str, Any]:
    members = [
        {**_unit(p, {"id": p.trial_id}), "grid": p.params.get("grid"), "scale": p.params.get("scale")} for p in points
    ]
    return {"pack": members, RECORD_KEY: {**record, "members": [p.trial_id for p in points]}}
