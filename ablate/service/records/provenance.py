"""What produced a run: ablate's version and git commit, the Python stack, the machine and the command line.

:func:`collect` describes this process; :func:`record_provenance` appends it to ``RUN_DIR/ablate_provenance.jsonl`` when a run
starts and at every ``--resume`` (one JSON object per line), and writes the installed distributions (a ``pip freeze``
of ``importlib.metadata``) beside it. :func:`science_changes` names what changed between two records in a way
that can change a run's numbers (torch, numpy, ablate's code). Nothing here imports torch's CUDA runtime unless
torch is already imported, and nothing starts Ray.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ablate.service.records.reader import RunReader
from ablate.service.records.rundir import ENVIRONMENT_FILE, PROVENANCE_FILE
from ablate.service.records.store import as_store

__all__ = ["SCIENCE_KEYS", "collect", "distributions", "record_provenance", "science_changes", "summary_line"]

_log = logging.getLogger("ablate.service.records.provenance")

#: Versions whose change can change a run's numbers (a resume across one says so before it runs).
SCIENCE_KEYS = ("ablate", "git_commit", "git_dirty", "torch", "numpy")
_PACKAGES = ("torch", "ray", "optuna", "numpy", "scipy", "pandas", "pydantic")


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(root: Path) -> dict[str, Any]:
    """The commit and dirtiness of the checkout ``root`` belongs to, or {} (an installed wheel, no git)."""
    git = shutil.which("git")
    if git is None or not (root / ".git").exists():
        return {}
    try:
        commit = subprocess.run([git, "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        status = subprocess.run(
            [git, "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    if commit.returncode != 0:
        return {}
    return {"git_commit": commit.stdout.strip(), "git_dirty": bool(status.stdout.strip())}


def _cpu() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model, "cpu_count": os.cpu_count()}


def query_gpus() -> list[dict[str, Any]]:
    """This node's GPUs from nvidia-smi: name, total memory in MiB, driver; [] without one. ablate reads GPUs here
    only (provenance, the memory check), and not with torch: a driver process must not start CUDA, whose context
    takes memory on the card and does not survive a fork."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    query = "--query-gpu=name,memory.total,driver_version"
    try:
        out = subprocess.run([smi, query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            gpus.append({"name": parts[0], "memory_mib": int(float(parts[1])), "driver": parts[2]})
        except (IndexError, ValueError):
            continue
    return gpus


def _gpus() -> list[dict[str, Any]]:
    """This node's GPUs (name, memory, driver) and torch's CUDA version, for the provenance record."""
    cuda = None
    if "torch" in sys.modules:
        cuda = getattr(sys.modules["torch"].version, "cuda", None)
    return [
        {"name": g["name"], "memory": f"{g['memory_mib']} MiB", "driver": g["driver"], "cuda": cuda}
        for g in query_gpus()
    ]


def collect(argv: list[str] | None = None, event: str = "start") -> dict[str, Any]:
    """This process's provenance: ``event`` (start or resume), time, ablate's version (and git commit and
    dirtiness when it runs from a checkout), Python and package versions, host, CPU, GPUs, the command line."""
    import ablate

    record: dict[str, Any] = {
        "event": event,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "ablate": ablate.__version__,
        **_git(Path(ablate.__file__).resolve().parent.parent),
        "python": platform.python_version(),
        **{name: _version(name) for name in _PACKAGES},
        "host": platform.node(),
        "platform": platform.platform(),
        **_cpu(),
        "gpus": _gpus(),
        "command": list(sys.argv if argv is None else argv),
    }
    return record


def distributions() -> str:
    """Every installed distribution as ``name==version`` lines, sorted (what ``pip freeze`` lists)."""
    seen = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            seen[name.lower()] = f"{name}=={dist.version}"
    return "\n".join(seen[k] for k in sorted(seen)) + "\n"


def science_changes(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``key: old -> new`` for each of :data:`SCIENCE_KEYS` that differs between two records, and for each plugin
    whose distribution's version changed."""
    changes = [f"{k}: {before.get(k)} -> {now.get(k)}" for k in SCIENCE_KEYS if before.get(k) != now.get(k)]
    old = {(p.get("kind"), p.get("name")): p for p in before.get("plugins") or []}
    for p in now.get("plugins") or []:
        was = old.get((p.get("kind"), p.get("name")))
        if was is not None and was.get("version") != p.get("version"):
            changes.append(
                f"{p.get('kind')} {p.get('name')} ({p.get('distribution')}): {was.get('version')} -> {p.get('version')}"
            )
    return changes


def summary_line(record: dict[str, Any]) -> str:
    """One line: ablate's version and commit, the stack, the machine."""
    commit = record.get("git_commit")
    code = f"ablate {record.get('ablate')}" + (
        f" (git {commit[:10]}{', dirty' if record.get('git_dirty') else ''})" if commit else ""
    )
    gpus = record.get("gpus") or []
    device = ", ".join(f"{g['name']} (driver {g['driver']}, CUDA {g.get('cuda')})" for g in gpus) or (
        f"{record.get('cpu')} × {record.get('cpu_count')}"
    )
    stack = ", ".join(f"{k} {record.get(k)}" for k in ("python", "torch", "ray", "numpy") if record.get(k))
    parts = [
        f"{p.get('kind')} {p.get('name')} ({p.get('distribution') or 'no distribution'} {p.get('version') or ''})".replace(
            " )", ")"
        )
        for p in record.get("plugins") or []
    ]
    plugins = f"; plugins: {', '.join(parts)}" if parts else ""
    return f"{code}; {stack}{plugins}; {device} on {record.get('host')}"


def record_provenance(run_dir: str, event: str, plugins: list[dict[str, Any]] | None = None) -> list[str]:
    """Append this process's provenance to ``RUN_DIR/ablate_provenance.jsonl`` and write the installed
    distributions beside it; on a resume, warn (and return) what changed since the last record that can change
    the run's numbers (``torch: 2.13.0 -> 2.14.1``). ``plugins``: the plugin parts the run's points name (kind,
    name, distribution, version; :meth:`ablate.plugins.Plugin.provenance`)."""
    before = RunReader(as_store(run_dir)).provenance()
    record = collect(event=event)
    if plugins:
        record["plugins"] = plugins
    changes = science_changes(before[-1], record) if before and event == "resume" else []
    if changes:
        _log.warning(
            "--resume: the code that continues this run differs from the code that wrote it (%s); the resumed "
            "reports may not equal a run that never stopped",
            "; ".join(changes),
        )
    store = as_store(run_dir)  # each file written whole: on disk atomically, on object storage one upload
    store.write_text(PROVENANCE_FILE, "".join(json.dumps(r) + "\n" for r in [*before, record]))
    store.write_text(ENVIRONMENT_FILE, distributions())
    return changes
