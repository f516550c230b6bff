"""ray.init's side: the dashboard's URL, token authentication and the clusters running on this machine (see
:mod:`ablate.ray_compat`)."""

from __future__ import annotations

import os
from typing import Any


# ------------------------------------------------------------------ ray.init, auth and the dashboard
def dashboard_url(context: Any = None) -> str | None:
    """The dashboard URL of the connected Ray, with ``http://``; None without a dashboard.

    ``ray.init`` returns it (``RayContext.dashboard_url``, public); ablate keeps the last one it saw, because the
    runtime context of a process that is already connected has none."""
    global _LAST_DASHBOARD
    url = getattr(context, "dashboard_url", None) if context is not None else _LAST_DASHBOARD
    if context is not None:
        _LAST_DASHBOARD = url
    if url and not url.startswith("http"):
        url = "http://" + url
    return url or None


_LAST_DASHBOARD: str | None = None


def refresh_auth_config() -> None:
    """Make Ray re-read ``RAY_AUTH_MODE`` after ablate set it: Ray caches its config in ``ray._raylet.Config``
    and calls ``Config.initialize("")`` itself when it turns token authentication on for ``address=auto``."""
    try:
        from ray._raylet import Config

        Config.initialize("")
    except (ImportError, AttributeError):
        pass


def cluster_wants_token(address: str, timeout: float = 5.0) -> bool | None:
    """Whether the Ray cluster whose GCS listens on ``address`` (``host:port``) checks auth tokens: True or False,
    None where it cannot tell (a ``ray://`` or ``auto`` address, TLS, a GCS that does not answer in ``timeout``).

    No public API tells a cluster's authentication mode before ``ray.init``, and the driver's must match it (see
    ``_keep_token_auth`` in :mod:`ablate.service.execution.cluster`). So this asks the GCS for its cluster id
    without a token, over plain gRPC: ``ray.rpc.NodeInfoGcsService/GetClusterId`` (the first call of every Ray
    client, an empty request) answers a cluster without token authentication and is refused UNAUTHENTICATED by
    one with it (checked on Ray 2.52 and 2.60)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address or os.environ.get("RAY_USE_TLS", "0") not in ("", "0"):
        return None
    try:
        import grpc

        with grpc.insecure_channel(address) as channel:
            channel.unary_unary("/ray.rpc.NodeInfoGcsService/GetClusterId")(b"", timeout=timeout)
        return False
    except ImportError:
        return None
    except Exception as e:  # grpc.RpcError: refused for want of a token, or no answer
        code = getattr(e, "code", None)
        return True if callable(code) and code() == grpc.StatusCode.UNAUTHENTICATED else None


def new_auth_token() -> str:
    """A new dashboard auth token in Ray's format (256 random bits as hex, as `ray get-auth-token --generate`)."""
    import secrets

    return secrets.token_hex(32)


def live_clusters() -> set[str]:
    """GCS addresses of the Ray clusters whose processes run on this machine: each raylet's ``--gcs-address``
    (what ``ray.init(address="auto")`` follows), read from the process table with psutil, so a stale address file
    of a stopped cluster is never followed."""
    import psutil

    found = set()
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            if "raylet" not in (proc.info["name"] or ""):
                continue
            for arg in proc.info["cmdline"] or []:
                if arg.startswith("--gcs-address="):
                    found.add(arg.split("=", 1)[1])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


# ------------------------------------------------------------------ nodes
def this_node() -> dict[str, str]:
    """``{"ray_node": ID}``: the Ray node this process runs on ({} outside a connected Ray), for a lease to name
    (:func:`node_dead` asks about it). ``ray.get_runtime_context().get_node_id()``, public API."""
    import ray

    if not ray.is_initialized():
        return {}
    return {"ray_node": ray.get_runtime_context().get_node_id()}


def node_dead(info: dict[str, Any]) -> bool:
    """Whether the Ray node ``info["ray_node"]`` names (:func:`this_node`) is one this cluster lists as dead
    (``ray.nodes()``, public API: Ray marks a node dead once its health checks fail, and retries its trials
    elsewhere). False for a node it does not list, or outside a connected Ray: not known dead."""
    import ray

    node = info.get("ray_node")
    if not node or not ray.is_initialized():
        return False
    return any(n.get("NodeID") == node and not n.get("Alive", True) for n in ray.nodes())
