"""Every place where ablate relies on Ray's behaviour beyond its Python API (environment variables, log messages,
signal handling), in one package: :mod:`.tune_env` (Tune's settings), :mod:`.control` (stopping, signals, a full
disk) and :mod:`.cluster` (ray.init, auth, the dashboard). No ``ray._private`` or ``ray.*._internal`` import; the one private name left is ``ray._raylet.Config``, re-read after ablate sets ``RAY_AUTH_MODE``; the one
RPC of Ray's own is the GCS's ``GetClusterId``, which tells whether a cluster checks auth tokens.

Each function says what it touches and why no public API does the job, so a Ray upgrade is checked here and
nowhere else. Nothing here imports Ray at import time.
"""

from __future__ import annotations

from ablate.ray_compat.cluster import (
    cluster_wants_token,
    dashboard_url,
    live_clusters,
    new_auth_token,
    node_dead,
    refresh_auth_config,
    this_node,
)
from ablate.ray_compat.control import (
    Terminated,
    graceful_interrupt,
    hide_full_disk_tracebacks,
    hide_tune_resume_hint,
    quiet_exit_on_sigterm,
    reclaim_sigterm,
)
from ablate.ray_compat.tune_env import set_tune_environment

__all__ = [
    "Terminated",
    "cluster_wants_token",
    "dashboard_url",
    "graceful_interrupt",
    "hide_full_disk_tracebacks",
    "hide_tune_resume_hint",
    "live_clusters",
    "new_auth_token",
    "node_dead",
    "refresh_auth_config",
    "set_tune_environment",
    "quiet_exit_on_sigterm",
    "this_node",
    "reclaim_sigterm",
]
