"""The Ray Tune Trainable: a thin adapter from Ray's class API to :class:`ablate.core.experiment.Experiment`.

One Ray iteration = one report period (``report_every`` steps, fewer at the end). Checkpoints hold the
experiment's state as a torch file (loadable with ``weights_only=True``) plus the config as JSON, both
written atomically (temporary name, then rename).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from ray import tune

from ablate import ray_compat
from ablate.core.experiment import Experiment
from ablate.rundir import atomic_write
from ablate.service.integrity import CHECKPOINT_FILE, checkpoint_iteration, load_state, newest_loadable
from ablate.service.params import config_from_params, flat_params
from ablate.service.spare_cores import SpareCoreMeter

__all__ = ["AblateTrainable", "CHECKPOINT_FILE", "FaultSpec", "InjectedFault", "load_state", "write_checkpoint"]

_log = logging.getLogger("ablate.service.trainable")

CONFIG_FILE = "config.json"
_FAULT_COUNTER = "ablate_faults_fired"
#: Idle cores (beyond the trial's own) that switch its batch prefetch thread on for the next report period.
SPARE_CORES_FOR_PREFETCH = 0.5


class InjectedFault(RuntimeError):
    """Raised by the test-only fault hook (:class:`FaultSpec`)."""


class FaultSpec(BaseModel):
    """Test-only fault injection: raise once the trial passes ``at_step``, ``times`` times per trial.

    Not a RunConfig field: a test puts it under the trial param key ``fault`` (in the grid's base or in a
    variant, from Python; grid files cannot set it) and only this Trainable reads it.
    """

    model_config = ConfigDict(extra="forbid")
    at_step: int = Field(ge=1, description="raise when training passes this step")
    times: int = Field(default=1, ge=1, description="how many times (across retries) the fault fires")

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> FaultSpec | None:
        """The fault a trial's params ask for (its variant's wins), or None."""
        variant = params.get("variant")
        raw = variant.get("fault") if isinstance(variant, dict) and "fault" in variant else params.get("fault")
        return None if raw is None else cls.model_validate(raw)


def write_checkpoint(directory: str | os.PathLike, state: dict[str, Any], config: dict[str, Any]) -> None:
    """Write ``state`` (torch) and ``config`` (JSON) into ``directory``, each atomically."""
    d = Path(directory)
    atomic_write(d / CHECKPOINT_FILE, lambda p: torch.save(state, p))
    atomic_write(d / CONFIG_FILE, lambda p: p.write_text(json.dumps(config, indent=1, default=str)))


class AblateTrainable(tune.Trainable):
    """Ray Tune Trainable running one grid point; ``config`` is the trial's param dict."""

    def setup(self, config: dict[str, Any]) -> None:
        for name in ("ray.tune", "ray.train"):  # no log line per checkpoint
            logging.getLogger(name).setLevel(logging.WARNING)
        ray_compat.quiet_exit_on_sigterm()
        self._use_assigned_cpus()
        self._spare_cores = SpareCoreMeter()
        self._build(config)

    def _build(self, config: dict[str, Any]) -> None:
        if "grid" not in config:  # never silently train RunConfig defaults for a trial that lost its point
            raise ValueError(f"trial {self.trial_name}: its config has no grid point (keys: {sorted(config)})")
        self.params = flat_params(config)  # the grid point's axes, variant and seed at the top level
        self.run_config = config_from_params(self.params, f"trial {self.trial_name}")
        self.experiment = Experiment(self.run_config)
        self.latest_r2: float | None = None

    def _use_assigned_cpus(self) -> None:
        import ray

        if not ray.is_initialized():  # used directly, outside Ray: keep torch's own setting
            return
        try:
            cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
        except AssertionError:  # Ray is up but this is the driver, not a trial's actor
            return
        torch.set_num_threads(max(1, int(round(cpus))))

    def step(self) -> dict[str, Any]:
        cfg = self.run_config
        n = min(cfg.report_every, cfg.max_steps - self.experiment.step)
        self._maybe_inject_fault(n)
        spare = self._spare_cores.spare()
        # the prefetch thread only where it gets an idle core (same numbers either way; see spare_cores.py)
        self.experiment.prefetch = spare is not None and spare >= SPARE_CORES_FOR_PREFETCH
        result = self.experiment.train(n)
        result["prefetch"] = self.experiment.prefetch
        result.update(self.experiment.evaluate())
        self.latest_r2 = result["r2"]
        reached = cfg.target_r2 is not None and result["r2"] >= cfg.target_r2
        result["done"] = self.experiment.step >= cfg.max_steps or reached
        return result

    def _maybe_inject_fault(self, n_steps: int) -> None:
        fault = FaultSpec.from_params(self.params)
        if fault is None or not (self.experiment.step < fault.at_step <= self.experiment.step + n_steps):
            return
        counter = Path(self.logdir) / _FAULT_COUNTER
        fired = int(counter.read_text()) if counter.exists() else 0
        if fired < fault.times:
            counter.write_text(str(fired + 1))
            raise InjectedFault(f"injected fault at step {fault.at_step} ({fired + 1} of {fault.times})")

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        write_checkpoint(checkpoint_dir, self.experiment.state_dict(), self.params)

    def restore(self, checkpoint_path: Any) -> None:
        """Restore from the newest checkpoint of this trial that exists and loads, at or before the one Ray
        recorded (a damaged or deleted one falls back to the previous one, else to a fresh start), and tell Ray
        that checkpoint's iteration, so the trial's next report is numbered after it (Ray would number it after
        the one it recorded) and the result log drops the rows the trial reports again. Remote storage: Ray's
        own restore, with :meth:`load_checkpoint`'s fallback."""
        folder, metrics = ray_compat.checkpoint_to_restore(checkpoint_path)
        if folder is None:
            return super().restore(checkpoint_path)
        cfg, recorded = self.run_config, metrics.get("training_iteration")
        max_step = min(recorded * cfg.report_every, cfg.max_steps) if isinstance(recorded, int) else None
        found = newest_loadable(folder, self.experiment.device, max_step)
        if found is None:
            _log.warning("trial %s: no loadable checkpoint; restarting from step 0", self.trial_name)
            self._build(self.params)  # Ray's counters stay at zero: the trial reports from 1 again
            return None
        chosen, state = found
        if chosen != Path(folder):
            self._say_earlier(chosen, state)
        self._loaded = (chosen, state)
        iteration = checkpoint_iteration(state["step"], cfg.report_every)
        return super().restore(ray_compat.training_result(str(chosen), {**metrics, "training_iteration": iteration}))

    def load_checkpoint(self, checkpoint: str | dict | None) -> None:
        """Restore from ``checkpoint``; a damaged one falls back to the previous one, else a fresh start."""
        if checkpoint is None:
            return
        here = Path(checkpoint)
        loaded, self._loaded = getattr(self, "_loaded", None), None
        found = loaded if loaded is not None and loaded[0] == here else newest_loadable(here, self.experiment.device)
        if found is None:
            _log.warning("trial %s: no loadable checkpoint; restarting from step 0", self.trial_name)
            self._build(self.params)
            return
        candidate, state = found
        if candidate != here:
            self._say_earlier(candidate, state)
        self.experiment.load_state_dict(state)

    def _say_earlier(self, folder: Path, state: dict[str, Any]) -> None:
        _log.warning(
            "trial %s: restored from the earlier checkpoint %s (step %s)", self.trial_name, folder, state["step"]
        )

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self._build(new_config)
        return True

    def __repr__(self) -> str:
        params = getattr(self, "params", {})
        point = ",".join(f"{k}={v}" for k, v in params.items() if k in ("batch_size", "latent_dim", "seed"))
        variant = params.get("variant")
        if isinstance(variant, dict):
            point = f"{variant.get('name')},{point}"
        r2 = getattr(self, "latest_r2", None)
        r2_text = "n/a" if r2 is None else f"{r2:.3f}"
        return f"Ablate[{params.get('grid', '?')}:{point} R²={r2_text}]"
