"""A trial's own record in the run directory: its stable id, its result log and its checkpoints.

A trial is its grid point. Its science settings and seed (:meth:`ablate.config.RunConfig.science`) give a stable
key, and the values that vary in its grid give a readable folder name: ``trial_<readable>-<key>``. The folder
holds params.json, result.json (one JSON line per report, append-only) and the checkpoints the Trainable writes
itself after each report (``checkpoint_<step>/state.pt``, atomically, loaded with ``weights_only=True``). The
checkpoint functions take the trial's folder as a local path, a URI or its own
:class:`~ablate.service.records.store.Store`: on object storage a checkpoint is one upload, listed, read and
deleted through the store.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ablate.config import RunConfig
from ablate.service.records.rundir import ERROR_FILE
from ablate.service.records.store import Listing, LocalStore, Store, open_store
from ablate.service.records.trial_log import intact_rows

__all__ = [
    "CHECKPOINT_FILE",
    "CHECKPOINT_PREFIX",
    "ERROR_FILE",
    "TrialDir",
    "checkpoint_folders",
    "checkpoint_names",
    "drop_checkpoints_after",
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
#: A trial's folder as the checkpoint functions take it: a local path, a URI, or the folder's own store.
TrialDir = str | os.PathLike | Store


def _store(trial_dir: TrialDir) -> Store:
    """The store of a trial's folder: ``trial_dir`` itself, or the store of its path or URI."""
    return trial_dir if isinstance(trial_dir, Store) else open_store(trial_dir)


def _step(name: str) -> int:
    return int(name.removeprefix(CHECKPOINT_PREFIX))


class _Unwritten(RuntimeError):
    """A checkpoint folder without its state (a write that a kill or a full disk cut short)."""


def _load(store: Store, name: str, map_location: Any) -> dict[str, Any]:
    """The state of checkpoint ``name`` in a trial folder's ``store``, loaded with ``weights_only=True`` from its
    bytes (one read; a failure to read is raised as it is, not taken for a damaged checkpoint)."""
    import torch

    path = store.join(name, CHECKPOINT_FILE)
    data = store.read_bytes(f"{name}/{CHECKPOINT_FILE}")
    if data is None:
        raise _Unwritten(f"checkpoint {store.join(name)} holds no {CHECKPOINT_FILE}")
    source = io.BytesIO(data)
    try:
        state = torch.load(source, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises several types for truncated or foreign files
        raise RuntimeError(f"checkpoint {path} cannot be loaded ({type(exc).__name__}: {exc})") from exc
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise RuntimeError(f"checkpoint {path} cannot be loaded (not an experiment state with a step)")
    return state


def load_state(
    directory: str | os.PathLike, map_location: Any = "cpu", *, store: Store | None = None
) -> dict[str, Any]:
    """Load a checkpoint's state with ``weights_only=True``; a damaged file names itself in the error.
    ``directory``: the checkpoint's folder (a local path), or with ``store`` (a trial folder's) its name there."""
    if store is not None:
        return _load(store, str(directory), map_location)
    folder = Path(directory)
    return _load(LocalStore(folder.parent), folder.name, map_location)


def checkpoint_names(trial_dir: TrialDir, listing: Listing | None = None) -> list[str]:
    """The names of a trial's checkpoint folders, newest (highest step) first (``listing``: a scan of the folder,
    read instead of listing it)."""
    found = [n for n in _store(trial_dir).listed(listing, dirs=True) if re.fullmatch(rf"{CHECKPOINT_PREFIX}\d+", n)]
    return sorted(found, key=_step, reverse=True)


def checkpoint_folders(trial_dir: str | os.PathLike) -> list[Path]:
    """A local trial's checkpoint folders, newest (highest step) first."""
    folder = Path(trial_dir)
    return [folder / name for name in checkpoint_names(LocalStore(folder))]


def _remove(store: Store, name: str) -> None:
    """Delete checkpoint ``name`` and its folder; a failure leaves it (as :func:`shutil.rmtree`'s
    ``ignore_errors``)."""
    with contextlib.suppress(OSError):
        store.delete_tree(name)


#: The step of a trial's log's last row (None: no row), or a function that reads it when it is needed.
Logged = int | None | Callable[[], int | None]


def write_checkpoint(trial_dir: TrialDir, state: dict[str, Any], keep: int, logged: Logged = None) -> str:
    """Write ``state`` as the trial's checkpoint at ``state["step"]`` (atomically: on local disk a folder whose
    state.pt is renamed into place, on object storage one upload of ``<folder>/state.pt``), then delete all but the
    newest ``keep`` checkpoints, never the newest one at or before ``logged`` (the step of the log's last row: the one
    a resume would continue from; a function is called only when a checkpoint is to be deleted). Returns the new
    folder's location (its path; in a bucket its URI)."""
    store = _store(trial_dir)
    write_and_prune(store, state, keep, logged, checkpoint_names(store))
    return store.join(f"{CHECKPOINT_PREFIX}{int(state['step']):09d}")


def write_and_prune(store: Store, state: dict[str, Any], keep: int, logged: Logged, names: list[str]) -> list[str]:
    """:func:`write_checkpoint` given the names of the checkpoints there (``names``, newest first: a trial that
    holds its folder's lock writes them alone, so it knows them without listing); the names there after it."""
    import torch

    name = f"{CHECKPOINT_PREFIX}{int(state['step']):09d}"
    buffer = io.BytesIO()  # serialised first: a full disk is then an OSError of the write, not torch's stream error
    torch.save(state, buffer)
    store.put(f"{name}/{CHECKPOINT_FILE}", buffer.getvalue())  # whole or not at all: a failed write leaves none
    existing = sorted({*names, name}, key=_step, reverse=True)
    old = existing[max(keep, 1) :]
    if old:
        step = logged() if callable(logged) else logged
        covered = next((n for n in existing if step is not None and _step(n) <= step), None)
        for gone in old:
            if gone != covered:
                _remove(store, gone)
                existing.remove(gone)
    return existing


def resume_point(
    trial_dir: TrialDir,
    covered: Callable[[dict[str, Any]], bool],
    map_location: Any = "cpu",
    listing: Listing | None = None,
) -> dict[str, Any] | None:
    """The state of the trial's newest checkpoint that loads and that its log covers (``covered(state)``: every
    report up to the checkpoint is in the log), or None: the trial starts from step 0. Each checkpoint passed
    over is logged. ``listing``: a scan of the folder (its checkpoints without a listing)."""
    store = _store(trial_dir)
    for name in checkpoint_names(store, listing):
        try:
            state = _load(store, name, map_location)
        except _Unwritten:
            continue  # a checkpoint whose write never finished (a kill, a full disk)
        except RuntimeError as exc:
            _log.warning("%s; trying an earlier checkpoint", exc)
            continue
        if covered(state):
            return state
        _log.info("checkpoint %s is ahead of the trial's result log; trying an earlier one", store.join(name))
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


def drop_checkpoints_after(trial_dir: TrialDir, step: int | None, listing: Listing | None = None) -> list[str]:
    """Delete the trial's checkpoints whose folder step is past ``step`` (all of them for None): a checkpoint its
    log does not cover cannot be continued from, and would crowd out the ones written next. Returns their names.
    ``listing``: a scan of the folder."""
    store = _store(trial_dir)
    gone = []
    for name in checkpoint_names(store, listing):
        if step is None or _step(name) > step:
            _remove(store, name)
            gone.append(name)
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
