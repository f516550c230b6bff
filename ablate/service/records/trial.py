"""A trial's own record in the run directory: its stable id, its result log and its checkpoints.

A trial is its grid point. Its science settings and seed (:meth:`ablate.config.RunConfig.science`) give a stable
key, and the values that vary in its grid give a readable folder name: ``trial_<readable>-<key>``. The folder
holds params.json, result.json (one JSON line per report, append-only) and the checkpoints the Trainable writes
itself after each report (``checkpoint_<step>/state.pt``, atomically, loaded with ``weights_only=True``).

Ray Tune only executes: nothing it writes is read back. Whether a trial is finished, where it continues from and
what its log keeps follow from these files alone (:func:`resume_point`): an unfinished trial continues from its
newest checkpoint that loads and that its log covers, with the log cut back to that checkpoint.

Nothing here imports Ray; torch only to read and write a checkpoint.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ablate.config import RunConfig
from ablate.files import atomic_write
from ablate.service.records.rundir import ERROR_FILE
from ablate.service.records.trial_log import intact_rows

__all__ = [
    "CHECKPOINT_FILE",
    "CHECKPOINT_PREFIX",
    "ERROR_FILE",
    "checkpoint_folders",
    "load_state",
    "record_id",
    "record_of",
    "resume_point",
    "trial_key",
    "write_checkpoint",
]

_log = logging.getLogger("ablate.service.records.trial")

#: The experiment's state in a checkpoint folder (torch, loaded with ``weights_only=True``).
CHECKPOINT_FILE = "state.pt"
#: Checkpoint folders are ``checkpoint_<step, 9 digits>``: their names sort by step.
CHECKPOINT_PREFIX = "checkpoint_"
#: Characters kept in the readable part of a folder name (others become ``_``), and its length.
_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+-]")
_READABLE_MAX = 80


def trial_key(config: RunConfig) -> str:
    """A stable key of a trial's science settings and seed (12 hex digits of their SHA-256): two trials with the
    same key train the same numbers, so a run keeps one folder per key."""
    text = json.dumps(config.science(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _short(value: Any) -> str:
    if isinstance(value, dict):
        if "name" in value:
            return str(value["name"])
        return "/".join(_short(v) for v in value.values())
    if isinstance(value, list | tuple):
        return "/".join(_short(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def record_id(params: dict[str, Any], config: RunConfig, shown: list[str]) -> str:
    """A trial's id (its folder is ``trial_<id>``): the values of ``shown`` (the keys its grid varies) as
    ``k=v,…``, then its :func:`trial_key`. Readable, and as stable as the key."""
    parts = [f"{k}={_short(params.get(k))}" for k in shown if k in params and k != "variant"]
    if isinstance(params.get("variant"), dict | str) and "variant" in shown:
        parts.insert(0, _short(params["variant"]))
    readable = _UNSAFE.sub("_", ",".join(parts))[:_READABLE_MAX].strip("._")
    key = trial_key(config)
    return f"{readable}-{key}" if readable else key


def key_of(trial_id: str) -> str:
    """The key part of a trial id (:func:`record_id`)."""
    return trial_id.rsplit("-", 1)[-1]


# ------------------------------------------------------------------ checkpoints
def load_state(directory: str | os.PathLike, map_location: Any = "cpu") -> dict[str, Any]:
    """Load a checkpoint's state with ``weights_only=True``; a damaged file names itself in the error."""
    import torch

    path = Path(directory) / CHECKPOINT_FILE
    if not path.is_file():
        raise RuntimeError(f"checkpoint {directory} holds no {CHECKPOINT_FILE}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises several types for truncated or foreign files
        raise RuntimeError(f"checkpoint {path} cannot be loaded ({type(exc).__name__}: {exc})") from exc
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise RuntimeError(f"checkpoint {path} cannot be loaded (not an experiment state with a step)")
    return state


def checkpoint_folders(trial_dir: str | os.PathLike) -> list[Path]:
    """A trial's checkpoint folders, newest (highest step) first."""
    folder = Path(trial_dir)
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and re.fullmatch(rf"{CHECKPOINT_PREFIX}\d+", p.name)]
    return sorted(found, key=lambda p: int(p.name.removeprefix(CHECKPOINT_PREFIX)), reverse=True)


def write_checkpoint(trial_dir: str | os.PathLike, state: dict[str, Any], keep: int, logged: int | None = None) -> Path:
    """Write ``state`` as the trial's checkpoint at ``state["step"]`` (atomically: a folder whose state.pt is
    renamed into place), then delete all but the newest ``keep`` checkpoints, never the newest one at or before
    ``logged`` (the step of the log's last row: the one a resume would continue from). Returns the new folder."""
    import torch

    folder = Path(trial_dir) / f"{CHECKPOINT_PREFIX}{int(state['step']):09d}"
    buffer = io.BytesIO()  # serialised first: a full disk is then an OSError of the write, not torch's stream error
    torch.save(state, buffer)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        atomic_write(folder / CHECKPOINT_FILE, lambda p: p.write_bytes(buffer.getbuffer()))
    except OSError:
        with contextlib.suppress(OSError):
            folder.rmdir()  # only if empty: a checkpoint written before stays
        raise
    existing = checkpoint_folders(trial_dir)
    steps = [int(p.name.removeprefix(CHECKPOINT_PREFIX)) for p in existing]
    covered = next((p for p, s in zip(existing, steps) if logged is not None and s <= logged), None)
    for old in existing[max(keep, 1) :]:
        if old != covered:
            shutil.rmtree(old, ignore_errors=True)
    return folder


def resume_point(
    trial_dir: str | os.PathLike,
    covered: Callable[[dict[str, Any]], bool],
    map_location: Any = "cpu",
) -> dict[str, Any] | None:
    """The state of the trial's newest checkpoint that loads and that its log covers (``covered(state)``: every
    report up to the checkpoint is in the log), or None: the trial starts from step 0. Each checkpoint passed
    over is logged."""
    for folder in checkpoint_folders(trial_dir):
        if not (folder / CHECKPOINT_FILE).is_file():
            continue  # a checkpoint whose write never finished (a kill, a full disk)
        try:
            state = load_state(folder, map_location)
        except RuntimeError as exc:
            _log.warning("%s; trying an earlier checkpoint", exc)
            continue
        if covered(state):
            return state
        _log.info("checkpoint %s is ahead of the trial's result log; trying an earlier one", folder)
    return None


def solo_covered(rows: list[dict[str, Any]]) -> Callable[[dict[str, Any]], bool]:
    """A solo trial's checkpoint is covered when its log holds the report at its step."""
    steps = {r["step"] for r in intact_rows(rows)}
    return lambda state: state["step"] in steps


def member_steps(state: dict[str, Any]) -> list[int]:
    """Each member's step in a pack checkpoint."""
    if "steps" in state:
        return [int(s) for s in state["steps"]]
    return [int(m["step"]) for m in state["members"]]


def pack_covered(member_rows: list[list[dict[str, Any]]]) -> Callable[[dict[str, Any]], bool]:
    """A pack checkpoint is covered when each member's log holds that member's report at its step in it (a member
    at step 0 has none to hold)."""
    steps = [{r["step"] for r in intact_rows(rows)} for rows in member_rows]

    def covered(state: dict[str, Any]) -> bool:
        found = member_steps(state)
        return len(found) == len(steps) and all(s == 0 or s in have for s, have in zip(found, steps))

    return covered


def pack_id(member_ids: list[str]) -> str:
    """A pack's id (its folder keeps the pack's checkpoints): ``pack-`` and a key of its members' keys, in order."""
    text = ",".join(key_of(m) for m in member_ids)
    return "pack-" + hashlib.sha256(text.encode()).hexdigest()[:12]


def drop_checkpoints_after(trial_dir: str | os.PathLike, step: int | None) -> list[str]:
    """Delete the trial's checkpoints whose folder step is past ``step`` (all of them for None): a checkpoint its
    log does not cover cannot be continued from, and would crowd out the ones written next. Returns their names."""
    gone = []
    for folder in checkpoint_folders(trial_dir):
        if step is None or int(folder.name.removeprefix(CHECKPOINT_PREFIX)) > step:
            shutil.rmtree(folder, ignore_errors=True)
            gone.append(folder.name)
    return gone


def record_of(config: dict[str, Any]) -> dict[str, Any] | None:
    """Where a Ray trial's record lives, from its config: ``{"dir", "id", "keep", …}`` (a pack's also
    ``members``); a search trial's id follows from its settings (:func:`record_id` over ``shown``). None outside
    a run."""
    from ablate.service.specs.params import RECORD_KEY, config_from_params, flat_params

    flat = flat_params(config)
    record = flat.get(RECORD_KEY)
    if not isinstance(record, dict):
        return None
    if "id" in record:
        return record
    return {**record, "id": record_id(flat, config_from_params(flat), list(record.get("shown", [])))}
