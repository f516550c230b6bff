"""Tune's settings from its documented environment variables (see :mod:`ablate.ray_compat`)."""

from __future__ import annotations

import logging
import os


def set_tune_environment(num_cpus: int | None) -> None:
    """Tune settings read from the environment (Ray Tune's documented env variables), unless already set."""
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # ablate adds its own result log
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the classic progress table (CLIReporter)
    # a trial's failure is one line of ablate's (its result log's), its traceback in the trial's error.json: not
    # Ray's traceback on the console at every failure and retry
    os.environ.setdefault("TUNE_PRINT_ALL_TRIAL_ERRORS", "0")
    # ablate never reads Tune's experiment snapshots (the run directory is its own record): take one an hour at
    # most, not one per step, which for a grid of thousands of trials costs more than the trials
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "3600")
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    os.environ.setdefault("TUNE_MAX_PENDING_TRIALS_PG", str(max(4, (num_cpus or os.cpu_count() or 2) * 2)))
    # Tune's result grid reads each trial's metrics from its own logger files, which ablate does not write (its
    # result log is the record): without this, the end of a run lists one "could not fetch metrics" line per trial
    if os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] == "1":
        logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
