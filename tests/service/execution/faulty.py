"""Test-only Trainables, passed to ``run_grid(trainable=...)`` (the product Trainable has no fault hook):
:func:`faulty` raises once training passes a step, a given number of times per trial in all (counted in files of a
folder the test chooses, so the count runs across retries and later runs); :func:`counting` records each
training. Built inside a function, so Ray's cloudpickle carries the class by value to the trial actors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


class InjectedFault(RuntimeError):
    """Raised by a :func:`faulty` Trainable."""


def faulty(counter_dir: Path, *, at_step: int, times: int = 1, variant: str | None = None, pack: bool = False):
    """A Trainable class that raises :class:`InjectedFault` when a trial's training passes ``at_step``, ``times``
    times per trial in all; only in trials of ``variant`` when given."""
    from ablate.service.execution.pack_trainable import PackTrainable
    from ablate.service.execution.trainable import AblateTrainable

    base = PackTrainable if pack else AblateTrainable
    counter_dir = Path(counter_dir)
    counter_dir.mkdir(parents=True, exist_ok=True)

    class Faulty(base):
        def _report(self):  # a report's training, as many as --results-every puts in one Ray result
            step = self.experiment.step
            n = min(self.run_config.report_every, self.run_config.max_steps - step)
            chosen = variant is None or (self.params.get("variant") or {}).get("name") == variant
            if chosen and step < at_step <= step + n:
                point = json.dumps(self.params, sort_keys=True, default=str)
                counter = counter_dir / hashlib.sha256(point.encode()).hexdigest()[:16]
                fired = int(counter.read_text()) if counter.exists() else 0
                if fired < times:
                    counter.write_text(str(fired + 1))
                    raise InjectedFault(f"injected fault at step {at_step} ({fired + 1} of {times})")
            return super()._report()

    return Faulty


def counting(log: Path, *, pack: bool = False):
    """A Trainable class that appends its trial's record id and starting step to ``log`` each time it starts
    training (a trial started or continued), so a test counts trainings, not folders."""
    from ablate.service.execution.pack_trainable import PackTrainable
    from ablate.service.execution.trainable import AblateTrainable
    from ablate.service.records.trial import record_of

    base = PackTrainable if pack else AblateTrainable
    log = Path(log)

    class Counting(base):
        def _build(self, config):
            super()._build(config)
            self._counted = False

        def step(self):
            if not self._counted:  # the trial's first training step since it was built: one training
                self._counted = True
                with log.open("a") as f:
                    f.write(f"{record_of(self.params)['id']} {self.experiment.step}\n")
            return super().step()

    return Counting


def dying(counter_dir: Path, *, times: int = 1, at_step: int | None = None):
    """A Trainable class whose process dies (``os._exit``, as a kill or a lost node ends it: no exception, no
    cleanup) the first ``times`` times each point is handed to it: as Tune hands a reused actor its next point
    (``reset_config``), or, with ``at_step``, once the point's training passes that step. Counted per point in
    files of ``counter_dir``, so the count runs across Ray's and the runner's retries."""
    import os

    from ablate.service.execution.trainable import AblateTrainable
    from ablate.service.records.trial import record_of

    counter_dir = Path(counter_dir)
    counter_dir.mkdir(parents=True, exist_ok=True)

    def die_once(config) -> None:
        counter = counter_dir / record_of(config)["id"]
        fired = int(counter.read_text()) if counter.exists() else 0
        if fired < times:
            counter.write_text(str(fired + 1))
            os._exit(1)

    class Dying(AblateTrainable):
        def reset_config(self, new_config):
            if at_step is None:
                die_once(new_config)
            return super().reset_config(new_config)

        def _report(self):
            step = self.experiment.step
            if at_step is not None and step < at_step <= step + self.run_config.report_every:
                die_once(self.params)
            return super()._report()

    return Dying
