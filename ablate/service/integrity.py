"""Each report once: a trial's result log checked against its checkpoints, and both mended before ``--resume``.

A trial reports once per report period; Ray numbers the reports 1, 2, … (``training_iteration``) and ablate's
result log (``trial_<id>/result.json``) holds one row per report, in order. A checkpoint taken after report K
holds the experiment at step min(K·report_every, max_steps), so its iteration follows from its step
(:func:`checkpoint_iteration`) and a trial restored from it reports K + 1 next, whichever checkpoint Ray had
recorded: the Trainable restores the newest checkpoint that exists and loads (:func:`newest_loadable`) and
tells Ray that checkpoint's iteration, and the result log drops the rows the trial now reports again.

A log is intact when its rows run 1..N without a gap or a repeat (:func:`intact_rows`) and N reaches the
iteration Ray recorded for the trial (:func:`log_problem`, which ``ablate status`` shows). Before a resume,
:func:`mend_for_resume` cuts a damaged log back to its intact rows, moves the checkpoints taken after them
into ``.ablate_discarded/`` (nothing is deleted), and re-opens a finished trial, so the resumed trial reports
the missing rows again from the newest checkpoint at or before its last intact row (or from step 0).
Restoring gives the same numbers as never stopping (the experiment's state holds its random generators).

Nothing here imports Ray; torch only to read a checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate import ray_compat
from ablate.rundir import RESULT_FILE, TRIAL_PREFIX, RunReader, atomic_write

__all__ = [
    "CHECKPOINT_FILE",
    "Mended",
    "checkpoint_iteration",
    "intact_rows",
    "load_state",
    "log_problem",
    "mend_for_resume",
    "newest_loadable",
]

_log = logging.getLogger("ablate.service.integrity")

#: The experiment's state in a checkpoint folder (torch, loaded with ``weights_only=True``).
CHECKPOINT_FILE = "state.pt"
_CHECKPOINT_PREFIX = "checkpoint_"
#: Where damaged logs and set-aside checkpoints go (ablate.service.snapshots uses the same folder).
_DISCARDED_DIR = ".ablate_discarded"


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


def checkpoint_iteration(step: int, report_every: int) -> int:
    """The report after which a checkpoint at ``step`` was taken: each report period trains ``report_every``
    steps, except the last of a run, which may train fewer."""
    return -(-step // report_every)


def _checkpoints_from(here: Path) -> list[Path]:
    """``here`` (when it exists) and the trial's older checkpoint folders, newest first."""
    older = [p for p in here.parent.glob(f"{_CHECKPOINT_PREFIX}*") if p.is_dir() and p.name < here.name]
    return ([here] if here.is_dir() else []) + sorted(older, reverse=True)


def newest_loadable(
    here: str | os.PathLike, map_location: Any = "cpu", max_step: int | None = None
) -> tuple[Path, dict[str, Any]] | None:
    """(folder, state) of the newest checkpoint, ``here`` or an older one of the same trial, that exists, loads,
    and (given ``max_step``) is not ahead of it; None when there is none. Each one passed over is logged."""
    for candidate in _checkpoints_from(Path(here)):
        try:
            state = load_state(candidate, map_location)
        except RuntimeError as exc:
            _log.warning("%s; trying an earlier checkpoint", exc)
            continue
        if max_step is not None and state["step"] > max_step:
            _log.warning("checkpoint %s is ahead of the one Ray recorded; trying an earlier one", candidate)
            continue
        return candidate, state
    return None


def intact_rows(rows: list[dict[str, Any]]) -> int:
    """How many leading rows of a result log run 1, 2, …, N by ``training_iteration`` with rising steps."""
    n, before = 0, -1
    for row in rows:
        step = row.get("step")
        if row.get("training_iteration") != n + 1 or not isinstance(step, int) or step <= before:
            break
        n, before = n + 1, step
    return n


def log_problem(rows: list[dict[str, Any]], recorded: int | None) -> str | None:
    """Why a trial's result log does not hold each report exactly once, or None when it does.

    ``rows``: its parsed rows; ``recorded``: the iteration Ray recorded for the trial (its snapshot's last
    result), which a log written before each snapshot always reaches.
    """
    n = intact_rows(rows)
    if recorded is not None and n < recorded:
        return f"result.json holds reports 1–{n} intact of the {recorded} Ray recorded"
    if n < len(rows):
        return f"result.json repeats or skips a report after report {n}"
    return None


@dataclass
class Mended:
    """What :func:`mend_for_resume` changed: one line per trial, and the snapshot files it rewrote."""

    messages: list[str] = field(default_factory=list)
    rewritten: list[Path] = field(default_factory=list)


def _set_aside(path: Path, run_dir: Path, trial: str) -> Path:
    target = run_dir / _DISCARDED_DIR / trial / path.name
    if target.exists():
        target = target.with_name(f"{path.name}.{time.time_ns()}")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(path), target)
    return target


def _mend_trial(run_dir: Path, trial: str, rows: list[dict[str, Any]], recorded: int) -> tuple[str, list[str]]:
    """Cut a trial's log to its intact rows and set aside the checkpoints taken after them: (message, moved)."""
    folder, n = run_dir / trial, intact_rows(rows)
    limit = rows[n - 1]["step"] if n else 0
    problem = log_problem(rows, recorded)
    moved = []
    for ckpt in sorted(folder.glob(f"{_CHECKPOINT_PREFIX}*")):
        try:
            step = load_state(ckpt)["step"]
        except RuntimeError:
            continue  # the Trainable passes over a checkpoint that does not load
        if step > limit:
            _set_aside(ckpt, run_dir, trial)
            moved.append(ckpt.name)
    log = folder / RESULT_FILE
    if log.exists():
        text = "".join(json.dumps(r) + "\n" for r in rows[:n])
        (run_dir / _DISCARDED_DIR / trial).mkdir(parents=True, exist_ok=True)
        shutil.copy2(log, run_dir / _DISCARDED_DIR / trial / f"{RESULT_FILE}.{time.time_ns()}")
        atomic_write(log, lambda p: p.write_text(text))
    start = f"the newest checkpoint at or before step {limit}" if n else "step 0"
    aside = f"; set aside {', '.join(moved)} in {_DISCARDED_DIR}/{trial}/" if moved else ""
    return f"{trial}: {problem}: reports {n + 1}–{recorded} run again from {start}{aside}", moved


def mend_for_resume(run_dir: str | os.PathLike) -> Mended:
    """Before Ray resumes the local ``run_dir``: make each trial's log and checkpoints agree (each change logged).

    A trial whose log misses reports Ray recorded (a cut or damaged ``result.json``) gets its log cut to its
    intact rows and its later checkpoints set aside; a finished one is re-opened (its status in the newest
    snapshot set to PENDING; that file is listed in :attr:`Mended.rewritten`). A checkpoint folder Ray
    tracks that is gone (deleted by hand, or set aside here) is made again, empty: Ray deletes the folders it
    tracks as newer checkpoints come, and fails on a missing one; the Trainable never restores an empty one.
    """
    run_dir = Path(run_dir)
    reader = RunReader(run_dir)
    names = reader.list_files(ray_compat.EXPERIMENT_STATE_PREFIX)
    if not names:
        return Mended()
    state_path = run_dir / names[-1]  # the newest session, as Ray reads it
    text = state_path.read_text()
    out, reopen = Mended(), set()
    tracked = ray_compat.tracked_checkpoints(text)
    for trial_id, state in ray_compat.parse_experiment_state(text).items():
        trial = f"{TRIAL_PREFIX}{trial_id}"
        if not (run_dir / trial).is_dir():
            continue
        rows, recorded, moved = reader.results(trial), state.get("iteration") or 0, []
        if intact_rows(rows) < recorded:
            message, moved = _mend_trial(run_dir, trial, rows, recorded)
            out.messages.append(message)
            if state["status"] == "TERMINATED":
                reopen.add(trial_id)
        for name in sorted(tracked.get(trial_id, ())):
            if not (run_dir / trial / name).exists():
                (run_dir / trial / name).mkdir()
                if name not in moved:
                    out.messages.append(f"{trial}: {name} is gone; it resumes from the newest checkpoint that loads")
    if reopen:
        atomic_write(state_path, lambda p: p.write_text(ray_compat.reopen_trials(text, reopen)))
        out.rewritten.append(state_path)
    for line in out.messages:
        _log.warning("--resume: %s", line)
    return out
