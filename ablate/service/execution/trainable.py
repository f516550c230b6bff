"""The Ray Tune Trainable: a thin adapter from Ray's class API to :class:`ablate.core.experiment.Experiment`.

One Ray iteration = one report period (``report_every`` steps, fewer at the end). After each report the
Trainable writes the experiment's state into its trial's own folder in the run directory
(``checkpoint_<step>/state.pt``, atomically, loadable with ``weights_only=True``; :mod:`ablate.service.records.trial`),
and at setup it continues from the newest one its result log covers: a resumed or extended run, or Ray's retry of
a failed trial, continues from ablate's files, never from Ray's.

A loss that goes non-finite is a result of the science, not a crash (the same seed reaches it at the same step
again): the trial reports it once (:data:`ablate.service.records.trial_log.ERROR_KEY`, naming the step) and ends, as a pack's
member does; Ray does not retry it. Any other exception is Ray's to retry (``--max-failures``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import torch
from ray import tune

from ablate import ray_compat
from ablate.core.experiment import Experiment, NonFiniteLossError
from ablate.service.execution.results import RAY_KEYS, REPORTS_KEY
from ablate.service.execution.spare_cores import SpareCoreMeter
from ablate.service.records.checkpoint_writer import CheckpointWriter
from ablate.service.records.record import TrialRecord, own_record
from ablate.service.records.store.flock import LockHeld
from ablate.service.records.trial import CHECKPOINT_FILE, checkpoint_names, record_of, solo_covered
from ablate.service.records.trial_log import ERROR_KEY, ended, intact_rows
from ablate.service.specs.params import PACK_KEY, config_from_params, flat_params

__all__ = ["AblateTrainable", "CHECKPOINT_FILE"]

_log = logging.getLogger("ablate.service.execution.trainable")

#: Idle cores (beyond the trial's own) that switch its batch prefetch thread on for the next report period.
SPARE_CORES_FOR_PREFETCH = 0.5


class AblateTrainable(tune.Trainable):
    """Ray Tune Trainable running one grid point; ``config`` is the trial's param dict. It has no Ray checkpoint
    (``save_checkpoint``): the runner turns Ray's checkpoints off, and the trial keeps its own in its record."""

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
        self._continue_from_record()

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
        """One Ray result: the reports trained until ``--results-every`` seconds have passed (a search's trial, or
        one used outside a run: one report), the last one with the ones before it under ``reports``
        (:mod:`ablate.service.execution.results`); its checkpoint after the last one only, since a checkpoint
        counts once its report is in the log, and the log gets these reports together. An exception after some
        reports of a result first hands those reports to Ray, and is raised at the next call (Ray's retry then
        continues from the last checkpoint, as it would have)."""
        if self._finished_row is not None:  # a search's repeat of a setting the run finished or failed: its end
            return {**self._finished_row, "done": True}
        error, self._deferred_error = getattr(self, "_deferred_error", None), None
        if error is not None:
            raise error
        deadline = time.monotonic() + self._results_every()
        earlier: list[dict[str, Any]] = []
        while True:
            begun = time.monotonic()
            try:
                result = self._report()
            except Exception as exc:
                if not earlier:
                    raise
                self._deferred_error = exc
                result = {k: v for k, v in earlier.pop().items() if k != "time_this_iter_s"}
                break  # no checkpoint: the experiment is past this report, part way into the failing one
            if result.get("done") or time.monotonic() >= deadline:
                break
            earlier.append({**result, "time_this_iter_s": time.monotonic() - begun})
        if earlier:
            result[REPORTS_KEY] = earlier
        if not result.get(ERROR_KEY) and self._deferred_error is None:  # none of non-finite or part-trained weights
            self._save_to_record(final=bool(result.get("done")))
        return result

    def _results_every(self) -> float:
        """Seconds between the trial's results to Ray (its record's ``results_every``; 0 outside a run)."""
        return float(self._record.get("results_every", 0.0)) if self._own() is not None else 0.0

    def _report(self) -> dict[str, Any]:
        """Train one report period and evaluate: the report (``done`` at the trial's stop; its error, done, when
        the loss went non-finite)."""
        cfg = self.run_config
        n = min(cfg.report_every, cfg.max_steps - self.experiment.step)
        spare = self._spare_cores.spare()
        # the prefetch thread only where it gets an idle core (same numbers either way; see spare_cores.py)
        self.experiment.prefetch = spare is not None and spare >= SPARE_CORES_FOR_PREFETCH
        try:
            result = self.experiment.train(n)
        except NonFiniteLossError as exc:  # ends the trial with its error
            return self._error_row(exc)
        result["prefetch"] = self.experiment.prefetch
        result.update(self.experiment.evaluate())
        self.latest_r2 = result["r2"]
        reached = cfg.target_r2 is not None and result["r2"] >= cfg.target_r2
        result["done"] = self.experiment.step >= cfg.max_steps or reached
        return result

    def _error_row(self, exc: NonFiniteLossError) -> dict[str, Any]:
        """The trial's last report after its loss went non-finite: the step, the error, done. A search's metric is
        in it as NaN (Ray Tune wants it in every report; the search counts the trial as failed, not by it)."""
        row: dict[str, Any] = {"step": self.experiment.step, ERROR_KEY: f"{type(exc).__name__}: {exc}", "done": True}
        metric = (self._record or {}).get("metric") if self._own() is not None else None
        if isinstance(metric, str):
            row[metric] = float("nan")
        return row

    # ------------------------------------------------------------------ the trial's own record
    def _own(self) -> TrialRecord | None:
        """The trial's own record in the run directory (``params["record"]``: a point's folder, or a pack's; None
        when used outside a run); worked out once per build (a search trial's id hashes its settings)."""
        if getattr(self, "_record_for", None) is not self.params:
            record = record_of(self.params)
            self._record = record
            self._record_for = self.params
            self._own_record = own_record(record) if record is not None else None
        return self._own_record

    def _continue_from_record(self) -> None:
        """Continue from the trial's newest checkpoint that loads and that its result log covers (the driver cut
        the log back to it before the run; a retry within the run finds the one it wrote last).

        The trial holds its folder's lock (a lease on object storage) while it trains: a search that suggests a
        setting a trial of the run is training right now (the same folder) waits for it, then continues it (or
        reports its end)."""
        self._finished_row = None
        own = self._own()
        if own is None:
            return
        self._lock_record(own)
        listing = own.scan()  # its log's pieces and its checkpoints, in one LIST on object storage
        self._checkpoints_there = checkpoint_names(own.checkpoints, listing)
        raw = own.raw_rows(listing)
        rows = intact_rows(raw)
        if ended(rows, self.run_config.max_steps, self.run_config.target_r2) and PACK_KEY not in self.params:
            self._finished_row = {k: v for k, v in rows[-1].items() if k not in RAY_KEYS}
            return
        covered = self._covered(raw)
        state = None if covered is None else own.resume_point(covered, self.experiment.device, listing)
        if state is not None:
            self.experiment.load_state_dict(state)
            _log.info("trial %s: continues from step %d", self.trial_name, state["step"])

    def _lock_record(self, own: TrialRecord) -> None:
        self._release_record()

        def waiting(held: LockHeld, seconds: float) -> None:
            _log.info(
                "trial %s: waits (%.0f s so far) for %s: the same setting is training", self.trial_name, seconds, held
            )

        # a holder whose Ray node died (a spot node gone) is taken over as soon as Ray knows, not after the ttl
        self._record_lock = own.hold(waiting, owner=ray_compat.this_node(), dead=ray_compat.node_dead)

    def _release_record(self) -> None:
        """Finish the checkpoint in flight (a stop, a signal, another trial on this actor), then unlock the folder."""
        writer, self._writer = getattr(self, "_writer", None), None
        if writer is not None:
            try:
                writer.wait()
            except Exception as exc:  # noqa: BLE001 - the trial is ending; the error of its last write is logged
                _log.warning("trial %s: its last checkpoint was not written: %s", self.trial_name, exc)
        lock, self._record_lock = getattr(self, "_record_lock", None), None
        if lock is not None:
            lock.release()

    def cleanup(self) -> None:
        self._flush_checkpoint()
        self._release_record()

    def _covered(self, raw: list[dict[str, Any]]):
        """Which checkpoints of the trial its log covers (``raw``: its log's rows), or None when none can be."""
        return solo_covered(raw) if raw else None

    def _save_to_record(self, final: bool = False) -> None:
        """The checkpoint after a report, in the trial's own folder, written by a thread while the next steps train
        (:mod:`ablate.service.records.checkpoint_writer`; a checkpoint counts once its report is in the log and its
        file is whole); the ``final`` report's is on disk before the report goes to Ray. With ``--checkpoint-every
        S``, only at the first report S seconds after the last checkpoint (and the final one, and at a stop)."""
        own = self._own()
        if own is None:
            return
        every = float(self._record.get("every", 0.0))
        now = time.monotonic()
        if not final and every > 0 and now - getattr(self, "_checkpoint_at", -math.inf) < every:
            self._unsaved = True  # written at the next chosen report, or by _flush_checkpoint at a stop
            return
        self._checkpoint_at, self._unsaved = now, False
        lock = getattr(self, "_record_lock", None)
        if lock is not None:  # a lease (object storage) lost to another trial of this setting: write nothing more
            lock.check()
        writer = getattr(self, "_writer", None)
        if writer is None or writer.trial_dir != own.folder:  # one per record (_release_record finishes it)
            if writer is not None:
                writer.wait()
            there, self._checkpoints_there = getattr(self, "_checkpoints_there", None), None
            self._writer = writer = CheckpointWriter(own.checkpoints, int(self._record.get("keep", 2)), there)
        writer.submit(self.experiment.state_dict(), self._logged_step(), wait=final)

    def _logged_step(self) -> Callable[[], int | None]:
        """What reads the step up to which the trial's log holds its reports (a pack: its members' least), bound
        to the trial now: the checkpoint writer calls it in its thread, only when it deletes a checkpoint."""
        own = self._own()
        assert own is not None
        return own.last_step

    def _flush_checkpoint(self) -> None:
        """At a stop or before the actor takes another trial: the last report's checkpoint, if the interval skipped
        it (the state is still that report's: nothing trains between a report and a stop)."""
        if getattr(self, "_unsaved", False) and self._own() is not None:
            try:
                self._save_to_record(final=True)
            except Exception as exc:  # noqa: BLE001 - the trial is ending; its record keeps the checkpoint before
                _log.warning("trial %s: its last checkpoint was not written: %s", self.trial_name, exc)

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self._flush_checkpoint()
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
