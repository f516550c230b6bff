"""Every place where ablate relies on Ray internals (private APIs, file formats, log messages), in one package:
:mod:`.snapshot` (files and storage), :mod:`.control` (stopping, signals, a full disk) and :mod:`.cluster` (ray.init,
auth, the dashboard).

Tested with Ray 2.60 (pyproject pins ``ray>=2.60,<2.61``). Each function says what it touches and why no public
API does the job, so a Ray upgrade is checked here and nowhere else. Nothing here imports Ray at import time.
"""

from __future__ import annotations

from ablate.ray_compat.cluster import dashboard_url, live_clusters, new_auth_token, refresh_auth_config
from ablate.ray_compat.control import (
    Terminated,
    graceful_interrupt,
    hide_full_disk_tracebacks,
    quiet_exit_on_sigterm,
    reclaim_sigterm,
    refuse_silent_restart,
)
from ablate.ray_compat.snapshot import (
    DICT_CHECKPOINT_FILE,
    EXPERIMENT_STATE_PREFIX,
    EXPERIMENT_STATE_RE,
    SEARCHER_FILES,
    SNAPSHOT_FILES,
    TUNER_FILE,
    checkpoint_to_restore,
    json_encoder,
    parse_experiment_state,
    reopen_trials,
    set_tune_environment,
    snapshot_paths,
    tracked_checkpoints,
    training_result,
    trial_folder,
    unpickled_on_restore,
)

__all__ = [
    "DICT_CHECKPOINT_FILE",
    "EXPERIMENT_STATE_PREFIX",
    "EXPERIMENT_STATE_RE",
    "SEARCHER_FILES",
    "SNAPSHOT_FILES",
    "Terminated",
    "TUNER_FILE",
    "checkpoint_to_restore",
    "dashboard_url",
    "graceful_interrupt",
    "hide_full_disk_tracebacks",
    "json_encoder",
    "live_clusters",
    "new_auth_token",
    "parse_experiment_state",
    "refresh_auth_config",
    "reopen_trials",
    "refuse_silent_restart",
    "set_tune_environment",
    "quiet_exit_on_sigterm",
    "reclaim_sigterm",
    "snapshot_paths",
    "tracked_checkpoints",
    "trial_folder",
    "training_result",
    "unpickled_on_restore",
]
