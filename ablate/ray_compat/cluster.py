"""ray.init's side: the dashboard's URL, token authentication and the clusters running on this machine (Ray 2.60
internals; see :mod:`ablate.ray_compat`)."""

from __future__ import annotations


# ------------------------------------------------------------------ ray.init, auth and the dashboard
def dashboard_url() -> str | None:
    """The dashboard URL of the connected Ray, with ``http://``; None without a dashboard.

    The runtime context has no public dashboard URL in Ray 2.60; ``ray._private.worker.get_dashboard_url`` is
    what ``ray.init`` itself prints.
    """
    import ray

    try:
        ctx = ray.get_runtime_context()
        url = ctx.dashboard_url if hasattr(ctx, "dashboard_url") else None
    except Exception:
        url = None
    if not url:
        try:
            url = ray._private.worker.get_dashboard_url()  # noqa: SLF001 - see the docstring
        except Exception:
            url = None
    if url and not url.startswith("http"):
        url = "http://" + url
    return url or None


def refresh_auth_config() -> None:
    """Make Ray re-read ``RAY_AUTH_MODE`` after ablate set it: Ray caches its config in ``ray._raylet.Config``
    and calls ``Config.initialize("")`` itself when it turns token authentication on for ``address=auto``."""
    try:
        from ray._raylet import Config

        Config.initialize("")
    except (ImportError, AttributeError):
        pass


def new_auth_token() -> str:
    """A new dashboard auth token in Ray's own format
    (``ray._private.authentication.authentication_token_generator``; 256 random bits as hex in Ray 2.60)."""
    try:
        from ray._private.authentication.authentication_token_generator import generate_new_authentication_token
    except ImportError:  # pragma: no cover - the module moved: the same format
        import secrets

        return secrets.token_hex(32)
    return generate_new_authentication_token()


def live_clusters() -> set[str]:
    """GCS addresses of the Ray clusters whose processes run on this machine.

    ``ray._private.services.find_gcs_addresses`` is what ``ray.init(address="auto")`` uses to find them; ablate
    calls it directly so a stale address file of a stopped cluster is never followed.
    """
    from ray._private.services import find_gcs_addresses

    find_gcs_addresses.cache_clear()
    return set(find_gcs_addresses())
