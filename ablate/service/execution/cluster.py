"""The Ray cluster: ``ray.init`` for runs (local or joined), token authentication, and `ablate dashboard`
(start or find a local Ray head whose dashboard binds to 127.0.0.1, with token auth on).

Not to be confused with ablate's *report* dashboards (``ablate/dashboards/*.yaml``, :mod:`ablate.reports.spec`):
"dashboard" here is always Ray's web UI.

Ray 2.60 turns token authentication on for local clusters: the dashboard asks for the token stored in
``~/.ray/auth_token`` (``ray get-auth-token`` prints it). ablate never turns it off. Binding to another
interface is allowed with a warning; binding to one while token authentication is disabled is refused.
The token file is kept readable by its owner only (0600, :func:`keep_token_private`): Ray itself writes it
with the process umask (usually 0644), so ablate writes it first for a head it starts, and tightens it after.
"""

from __future__ import annotations

import ipaddress
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate import ray_compat
from ablate.service.records.rundir import RunError

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "DashboardHandle",
    "auth_hint",
    "auth_lines",
    "check_host",
    "init_ray",
    "keep_token_private",
    "live_clusters",
    "serve",
    "start_or_find",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8265
TOKEN_FILE = Path.home() / ".ray" / "auth_token"


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def auth_mode(environ: dict[str, str] | None = None) -> str:
    """Ray's authentication mode for a local cluster: 'token' unless RAY_AUTH_MODE says otherwise."""
    env = os.environ if environ is None else environ
    return env.get("RAY_AUTH_MODE", "token").strip().lower() or "token"


def check_host(host: str | None, environ: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """The interface to bind and the warnings to print; refuses an exposed dashboard without authentication.

    ``host`` None means the default, 127.0.0.1 (no warning). Any other non-loopback host warns: the dashboard
    can run code on the cluster, so only token authentication stands between it and the network.
    """
    mode = auth_mode(environ)
    warnings: list[str] = []
    chosen = DEFAULT_HOST if host is None else host.strip()
    if not chosen:
        raise RunError("--host: empty host; leave it out to bind to 127.0.0.1")
    exposed = not is_loopback(chosen)
    if exposed and mode != "token":
        raise RunError(
            f"--host {chosen}: refusing to expose the Ray dashboard beyond this machine while token authentication "
            f"is off (RAY_AUTH_MODE={mode}); unset RAY_AUTH_MODE, or keep the default host {DEFAULT_HOST} and use "
            f"an SSH tunnel: ssh -L {DEFAULT_PORT}:127.0.0.1:{DEFAULT_PORT} <head>"
        )
    if exposed:
        warnings.append(
            f"warning: --host {chosen} exposes the Ray dashboard (which can run code on the cluster) beyond this "
            f"machine; only the auth token protects it. Prefer the default {DEFAULT_HOST} with an SSH tunnel: "
            f"ssh -L {DEFAULT_PORT}:127.0.0.1:{DEFAULT_PORT} <head>"
        )
    if mode != "token":
        warnings.append(
            f"warning: RAY_AUTH_MODE={mode}: token authentication is off; ablate recommends keeping it on "
            "(unset RAY_AUTH_MODE)"
        )
    return chosen, warnings


def auth_lines(environ: dict[str, str] | None = None, token_file: Path = TOKEN_FILE) -> list[str]:
    """How to authenticate to the dashboard."""
    mode = auth_mode(environ)
    if mode != "token":
        return [f"authentication: off (RAY_AUTH_MODE={mode})"]
    state = "exists" if token_file.is_file() else "is created when the head starts"
    return [
        "authentication: token (Ray's default for local clusters; keep it on)",
        f"  the dashboard asks for the token in {token_file} ({state});",
        "  print it with `ray get-auth-token` and paste it into the dashboard's login prompt",
    ]


@dataclass
class DashboardHandle:
    """A Ray head this process started or joined, and its dashboard URL."""

    url: str | None
    started: bool
    address: str | None = None
    notes: list[str] = field(default_factory=list)
    shutdown: Callable[[], None] = lambda: None
    """Disconnects (and stops the head if this process started it)."""


def live_clusters() -> set[str]:
    """GCS addresses of the Ray clusters running on this machine (found from their raylet processes)."""
    return ray_compat.live_clusters()


def init_ray(
    address: str | None, *, num_cpus: int | None = None, dashboard: bool = True, dashboard_host: str = DEFAULT_HOST
) -> dict[str, Any]:
    """Start (or join) Ray; the local dashboard binds to 127.0.0.1 and keeps token authentication."""
    import ray

    if ray.is_initialized():
        return {"dashboard_url": ray_compat.dashboard_url(), "joined": True}
    kwargs: dict[str, Any] = {"logging_level": "WARNING", "log_to_driver": True}
    if address:
        import ablate

        _keep_token_auth(address)
        # workers on the cluster get this package's code and data (they need torch and ray installed)
        kwargs["runtime_env"] = {"py_modules": [str(Path(ablate.__file__).parent)]}
        context = ray.init(address=address, **kwargs)
    else:
        keep_token_private(create=True)
        # address="local": always a fresh embedded Ray, even if a stale cluster address is on disk
        context = ray.init(
            address="local", num_cpus=num_cpus, include_dashboard=dashboard, dashboard_host=dashboard_host, **kwargs
        )
    keep_token_private()
    return {"dashboard_url": ray_compat.dashboard_url(context), "joined": bool(address)}


def keep_token_private(create: bool = False, environ: dict[str, str] | None = None) -> Path | None:
    """Make the auth token file Ray reads (``RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``) mode 0600.

    ``create``: for a local head about to start with token authentication and no token anywhere, write the
    token first, with mode 0600 (in Ray's format), instead of letting Ray write it world-readable. A file of
    another user is left alone. Returns the token file, or None when the token is not in a file.
    """
    env = os.environ if environ is None else environ
    if env.get("RAY_AUTH_TOKEN"):
        return None
    path = Path(env["RAY_AUTH_TOKEN_PATH"]).expanduser() if env.get("RAY_AUTH_TOKEN_PATH") else TOKEN_FILE
    try:
        if create and auth_mode(env) == "token" and not path.exists():
            if not path.parent.exists():
                path.parent.mkdir(mode=0o700, parents=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(ray_compat.new_auth_token())
        info = path.stat()
        if info.st_uid == os.getuid() and info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            os.chmod(path, 0o600)
    except FileExistsError:  # another process wrote it first: tighten it
        return keep_token_private(environ=environ)
    except OSError:
        return None  # no token file, or one ablate may not change: Ray reports what it needs
    return path


def _keep_token_auth(address: str) -> None:
    """Join an explicit address with token authentication exactly when the cluster has it on (``RAY_AUTH_MODE``,
    where set, decides as it does for Ray).

    The driver's mode must match the cluster's. Without a token against a cluster that checks them, ``ray.init``
    is refused. With one against a cluster that does not (`ray start --head` before Ray 2.59, which turns token
    auth on by itself only from then on and only where a token file exists; or a head with
    ``RAY_AUTH_MODE=disabled``), ``ray.init`` succeeds but the cluster's GCS calls the driver without a token, takes
    the refusal for the death of the actors' owner and cancels every trial's actor before it starts. Ray decides
    by itself only for ``address=auto`` (from 2.59, by the token file), so for an explicit address ablate asks the
    cluster; where that cannot tell (a ``ray://`` address, TLS), a token file here means token authentication.
    """
    if address == "auto" or "RAY_AUTH_MODE" in os.environ:
        return
    wants_token = ray_compat.cluster_wants_token(address)
    if wants_token is None:
        wants_token = TOKEN_FILE.is_file()
    if not wants_token:
        return
    os.environ["RAY_AUTH_MODE"] = "token"
    ray_compat.refresh_auth_config()


def auth_hint() -> str:
    """How to authenticate to the dashboard under Ray's token authentication."""
    mode = os.environ.get("RAY_AUTH_MODE", "token (Ray's default for local clusters)")
    return f"auth: {mode}; the dashboard asks for the token in {TOKEN_FILE} (print it with `ray get-auth-token`)"


def start_or_find(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> DashboardHandle:
    """Join the Ray cluster running on this machine or, if there is none, start a head with its dashboard.

    ``RAY_ADDRESS`` (other than auto/local) names the cluster to join. Otherwise only a cluster whose processes
    are alive on this machine is joined: ``address='auto'`` alone would also follow the address a finished
    ``ray start`` left in ``/tmp/ray/ray_current_cluster`` and wait minutes for it.
    """
    import ray

    notes: list[str] = []
    explicit = os.environ.get("RAY_ADDRESS", "").strip()
    live = {explicit} if explicit and explicit not in ("auto", "local") else live_clusters()
    if len(live) > 1:
        raise RunError(
            f"several Ray clusters run on this machine ({', '.join(sorted(live))}); ablate cannot tell "
            "which to show: stop the extra ones (`ray stop`) or open their dashboards directly"
        )
    if live:
        address = next(iter(live))
        _keep_token_auth(address)  # the cluster's own authentication mode, as `ablate run --address` joins it
        ctx = ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        started = False
        notes.append(
            f"joined the Ray cluster already running on this machine ({address}); its dashboard settings apply"
        )
    else:
        keep_token_private(create=True)
        # address="local": a new head even where /tmp/ray/ray_current_cluster names a cluster that is gone
        ctx = ray.init(
            address="local",
            include_dashboard=True,
            dashboard_host=host,
            dashboard_port=port,
            logging_level="WARNING",
            log_to_driver=False,
        )
        address = ctx.address_info.get("gcs_address")
        started = True
    keep_token_private()
    url = ray_compat.dashboard_url(ctx)
    if url and not started and f":{port}" not in url:
        notes.append(f"the running cluster's dashboard is on {url}, not port {port}")
    return DashboardHandle(url=url, started=started, address=address, notes=notes, shutdown=ray.shutdown)


def serve(
    host: str | None = None,
    port: int = DEFAULT_PORT,
    out: Callable[[str], None] = print,
    wait: Callable[[], None] | None = None,
) -> int:
    """Start or find the head, print the URL and how to log in, and keep running until Ctrl-C."""
    if not 0 < port < 65536:
        raise RunError(f"--port {port}: not a TCP port (1–65535)")
    chosen, warnings = check_host(host)
    for w in warnings:
        out(w)
    handle = start_or_find(chosen, port)
    for note in handle.notes:
        out(note)
    if handle.url is None:
        out("the running Ray cluster has no dashboard; stop it (`ray stop`) and run `ablate dashboard` again")
        handle.shutdown()
        return 1
    out(f"Ray dashboard: {handle.url}")
    for line in auth_lines():
        out(line)
    if handle.started:
        out("started a local Ray head; runs join it with `ablate run <grid> --address auto`")
    out(
        "trials run as actors named Ablate[<grid>:<point> R²=…] (Actors tab, 'Repr' column; Tune reuses an actor "
        "for several trials, so the name shows the first point it ran)"
    )
    out(
        f"on a cluster: ssh -L {DEFAULT_PORT}:127.0.0.1:{DEFAULT_PORT} <head>, then open http://127.0.0.1:{DEFAULT_PORT}"
    )
    out("press Ctrl-C to stop" + (" (this stops the Ray head it started)" if handle.started else ""))
    try:
        if wait is not None:
            wait()
        else:
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        out("stopping")
    finally:
        handle.shutdown()
    return 0
