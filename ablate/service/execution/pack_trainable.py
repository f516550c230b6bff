"""The Ray Tune Trainable of a pack: several grid points trained as one batched model in one Ray trial.

A pack trial's config holds the grid's shared settings and, under ``pack``, its members' grid points (see
:meth:`ablate.service.specs.grids.Grid.param_space`). The trial trains them with :class:`ablate.core.pack.PackedExperiment`
(a member whose loss has no batched form trains alone, as a pack of one) and reports every member's row under
``members``; :class:`ablate.service.execution.callbacks.ResultLog` writes each row into the member's own trial folder, so
status, export, report, claims and resume see ordinary trials. A member that reaches its stop (``max_steps`` or
``target_r2``) reports ``done`` once and is frozen; a member whose loss goes non-finite reports its error once
(``member_error``) and the others go on. The trial is done when every member is.

Checkpoints (written after each report into the pack's own folder, ``trial_pack-<key>``) hold the stacked state, each
weight once (``ablate.core.pack.member_state`` derives a member's solo state from it); a pack continues from the newest one that every member's log covers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ablate.config import RunConfig
from ablate.core.experiment import Experiment, NonFiniteLossError
from ablate.core.pack import PackedExperiment
from ablate.core.pack_fields import can_pack
from ablate.service.execution.trainable import SPARE_CORES_FOR_PREFETCH, AblateTrainable
from ablate.service.records.record import trial_records
from ablate.service.records.trial import pack_covered
from ablate.service.specs.params import PACK_KEY, RECORD_KEY, config_from_params, flat_params, pack_members

__all__ = ["PackRun", "PackTrainable"]

#: The metrics shown in Ray's progress table for a pack: the mean over the members that reported.
_MEAN_METRICS = ("r2", "loss", "mcc")


class _SoloPack:
    """One :class:`Experiment` behind the interface of :class:`PackedExperiment` (a loss with no batched form)."""

    def __init__(self, config: RunConfig):
        self.configs, self.k = [config], 1
        self._exp = Experiment(config)
        self.device = self._exp.device
        self.frozen: set[int] = set()
        self.failed: dict[int, int] = {}
        self._error: NonFiniteLossError | None = None

    @property
    def active(self) -> list[int]:
        return [] if self.frozen or self.failed else [0]

    @property
    def steps(self) -> list[int]:
        return [self._exp.step]

    @property
    def prefetch(self) -> bool:
        return self._exp.prefetch

    @prefetch.setter
    def prefetch(self, enabled: bool) -> None:
        self._exp.prefetch = enabled

    def freeze(self, i: int) -> None:
        self.frozen.add(i)

    def error(self, i: int) -> NonFiniteLossError:
        assert self._error is not None
        return self._error

    def train(self, n_steps: int) -> list[dict[str, Any]]:
        if not self.active:
            return [{"step": self._exp.step, "status": "failed" if self.failed else "frozen"}]
        try:
            return [{**self._exp.train(n_steps), "status": "training"}]
        except NonFiniteLossError as exc:
            self.failed[0], self._error = self._exp.step, exc
            return [{"step": self._exp.step, "status": "failed"}]

    def evaluate(self, members=None) -> list[dict[str, Any]]:
        return [self._exp.evaluate() for _ in ([0] if members is None else members)]

    def state_dict(self) -> dict[str, Any]:
        return {"members": [self._exp.state_dict()], "frozen": sorted(self.frozen), "failed": list(self.failed.items())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._exp.load_state_dict(state["members"][0])
        self.frozen = {int(i) for i in state.get("frozen", [])}
        self.failed = {int(i): int(s) for i, s in state.get("failed", [])}


class PackRun:
    """A pack's experiment as the Trainable drives it: :class:`PackedExperiment`, or one experiment alone; its
    state carries ``step`` (the pack's furthest member), which the checkpoint machinery reads."""

    def __init__(self, configs: list[RunConfig]):
        packable = all(can_pack(c)[0] for c in configs)
        if not packable and len(configs) > 1:
            raise ValueError(f"a pack of {len(configs)}: {can_pack(configs[0])[1]}")
        self.pack = PackedExperiment(configs) if packable else _SoloPack(configs[0])
        self.device = self.pack.device

    @property
    def step(self) -> int:
        """The furthest step of any member (members that froze early stay behind)."""
        return max(self.pack.steps)

    def state_dict(self) -> dict[str, Any]:
        return {**self.pack.state_dict(), "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pack.load_state_dict(state)


class PackTrainable(AblateTrainable):
    """Ray Tune Trainable of one pack; ``config`` is the pack trial's param dict (shared settings + ``pack``)."""

    def _build(self, config: dict[str, Any]) -> None:
        config = flat_params(config)  # a run's unit travels under "point": its pack and its record
        if PACK_KEY not in config:
            raise ValueError(f"trial {self.trial_name}: its config has no pack (keys: {sorted(config)})")
        self.params = dict(config)
        self.member_params = pack_members(config)
        configs = [
            config_from_params(p, f"trial {self.trial_name} member {i}") for i, p in enumerate(self.member_params)
        ]
        self.run_config = configs[0]  # the schedule every member shares (report_every, max_steps)
        self.configs = configs
        self.experiment = PackRun(configs)
        self.latest_r2 = None
        self._continue_from_record()

    def _covered(self, raw: list[dict[str, Any]]):
        """Which of the pack's checkpoints its members' logs cover (``raw``, the pack folder's own log, is empty)."""
        return pack_covered([member.raw_rows() for member in trial_records(self.params[RECORD_KEY])])

    def _logged_step(self) -> Callable[[], int | None]:
        """What reads the least step up to which the logs of the members training now hold their reports."""
        members = trial_records(self.params[RECORD_KEY])
        training = [members[i] for i in self.experiment.pack.active]

        def least() -> int | None:
            steps = [member.last_step() for member in training]
            return None if not steps or None in steps else min(s for s in steps if s is not None)

        return least

    def _continue_from_record(self) -> None:
        """Continue from the pack's newest covered checkpoint; members frozen at a ``max_steps`` since raised train
        on (those at the step the pack's training members are at, or at the furthest step when none trains)."""
        super()._continue_from_record()
        pack = self.experiment.pack
        steps = pack.steps
        reopen = [
            i for i in sorted(pack.frozen) if steps[i] < self.configs[i].max_steps and self.configs[i].target_r2 is None
        ]
        active = {steps[i] for i in pack.active}
        at = next(iter(active)) if len(active) == 1 else max((steps[i] for i in reopen), default=None)
        for i in reopen:
            if steps[i] == at:
                pack.frozen.discard(i)

    def _report(self) -> dict[str, Any]:
        pack = self.experiment.pack
        cfg = self.run_config
        n = min(cfg.report_every, cfg.max_steps - self.experiment.step)
        spare = self._spare_cores.spare()
        pack.prefetch = spare is not None and spare >= SPARE_CORES_FOR_PREFETCH
        reporting = list(pack.active)
        trained = pack.train(n)
        finite = [i for i in reporting if i not in pack.failed]
        evaluated = dict(zip(finite, pack.evaluate(finite)))
        rows: list[dict[str, Any] | None] = [None] * pack.k
        for i in reporting:
            if i in pack.failed:
                rows[i] = {"step": trained[i]["step"], "member_error": str(pack.error(i)), "done": True}
                continue
            row = {**{k: v for k, v in trained[i].items() if k != "status"}, **evaluated[i]}
            target = self.configs[i].target_r2
            row["done"] = row["step"] >= self.configs[i].max_steps or (target is not None and row["r2"] >= target)
            if row["done"]:
                pack.freeze(i)
            rows[i] = row
        result: dict[str, Any] = {"members": rows, "step": self.experiment.step, "prefetch": pack.prefetch}
        for key in _MEAN_METRICS:
            values = [r[key] for r in rows if r is not None and isinstance(r.get(key), float) and math.isfinite(r[key])]
            result[key] = sum(values) / len(values) if values else float("nan")
        self.latest_r2 = result["r2"]
        result["done"] = not pack.active
        return result

    def __repr__(self) -> str:
        members = getattr(self, "member_params", [])
        if not members:
            return "AblatePack[?]"
        varied = [k for k in members[0] if len({repr(m.get(k)) for m in members}) > 1 and k != "point"]
        points = ";".join(",".join(f"{k}={_short(m.get(k))}" for k in varied) for m in members)
        return f"AblatePack[{members[0].get('grid', '?')}:{len(members)}:{points}]"


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("name", value))
    return f"{value:g}" if isinstance(value, float) else str(value)
