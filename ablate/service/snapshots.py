"""Pick a complete experiment snapshot before Ray Tune resumes a run, without unpickling anything.

Ray Tune snapshots a run as a set of files per driver session ``S`` (a timestamp): ``experiment_state-S.json``
(the trials), the search algorithm's state (``basic-variant-state-S.json`` for a grid, or
``search_gen_state-S.json`` plus ``searcher-state-S.pkl`` for Optuna) and, when a callback keeps state,
``callback-states-S.pkl``. It writes them in a staging folder and copies them into the run directory in
the background, one file after another and not atomically. A driver killed during that copy leaves the
newest session's set torn: a truncated file, or the experiment state without its searcher state.

Ray then fails to read it and, instead of stopping, logs "Failed to restore the run state" and starts a
*new* experiment from an empty search space: one trial with no parameters. :func:`choose_snapshot` guards
against that: it keeps the newest session whose files are all complete and moves the files of newer, torn
sessions into ``.ablate_discarded/`` (nothing is deleted), so Ray resumes from the last consistent
snapshot. Completeness is checked by parsing: JSON with :func:`json.loads`, pickles by walking their
opcodes with :mod:`pickletools` (which executes nothing).

Ray's ``tuner.pkl`` (the Tuner itself, written once when the run starts) is copied the same way after a
resume: restoring downloads every ``.json``/``.pkl`` of the run directory into the staging folder, and every
later snapshot copies them back, so a kill can tear it too. It never changes during a run, so any complete
copy will do: :func:`save_backup` keeps one with each generation, and :func:`choose_snapshot` puts it back.

A torn *only* session (the first driver killed mid-copy) leaves nothing older to fall back to, so the
runner also keeps its own copy: :func:`save_backup` copies the staging folder's newest session, which Ray
has just written in full, into ``.ablate_snapshot/<generation>/`` (a folder renamed into place, so it is
never half-written). :func:`choose_snapshot` puts that copy back when it is the newest complete one.

Each generation carries its own signature file (:data:`ablate.rundir.SIGNATURES_FILE`, see
:mod:`ablate.signing`), written with the copy; :func:`choose_snapshot` copies a backup back only when its
signatures match (unless the run directory is trusted), and signs what it copied in.
"""

from __future__ import annotations

import json
import os
import pickletools
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ablate import signing
from ablate.ray_compat import EXPERIMENT_STATE_RE, SEARCHER_FILES, SNAPSHOT_FILES, TUNER_FILE
from ablate.rundir import SIGNATURES_FILE, atomic_write

__all__ = [
    "BACKUP_DIR",
    "DISCARDED_DIR",
    "TUNER_FILE",
    "SnapshotChoice",
    "SnapshotError",
    "choose_snapshot",
    "file_problem",
    "has_snapshot",
    "save_backup",
    "sessions",
]

DISCARDED_DIR = ".ablate_discarded"
BACKUP_DIR = ".ablate_snapshot"
_KEEP_BACKUPS = 2


class SnapshotError(RuntimeError):
    """No complete experiment snapshot is left in a run directory."""


@dataclass
class SnapshotChoice:
    """The session a resume continues from, and the torn newer sessions set aside."""

    session: str
    discarded: dict[str, str] = field(default_factory=dict)  # file name -> why it was set aside
    from_backup: bool = False  # the files were put back from .ablate_snapshot/


def file_problem(path: Path, kind: str) -> str | None:
    """Why ``path`` is not a complete ``kind`` ('json' or 'pickle') file, or None when it is complete."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    if not data:
        return "empty"
    if kind == "json":
        try:
            state = json.loads(data)
        except ValueError as exc:
            return f"not complete JSON ({exc})"
        if not isinstance(state, dict) or "trial_data" not in state or "runner_data" not in state:
            return "JSON without Ray's trial_data and runner_data"
        return None
    try:
        opcodes = [op.name for op, _arg, _pos in pickletools.genops(data)]
    except Exception as exc:  # noqa: BLE001 - pickletools raises ValueError, KeyError, struct errors...
        return f"truncated pickle ({type(exc).__name__}: {exc})"
    if not opcodes or opcodes[-1] != "STOP":
        return "truncated pickle (no STOP opcode)"
    return None


def _session_problems(folder: Path, session: str) -> list[str]:
    problems = []
    for template, kind in SNAPSHOT_FILES.items():
        path = folder / template.format(session)
        if path.exists():
            why = file_problem(path, kind)
            if why:
                problems.append(f"{path.name}: {why}")
    if not any((folder / t.format(session)).exists() for t in SEARCHER_FILES):
        problems.append(f"experiment_state-{session}.json: its search algorithm state was never written")
    return problems


def sessions(folder: str | Path) -> list[str]:
    """Session names of the experiment snapshots directly in ``folder``, newest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    names = (EXPERIMENT_STATE_RE.match(p.name) for p in folder.iterdir() if p.is_file())
    return sorted((m["session"] for m in names if m), reverse=True)


def has_snapshot(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds an experiment snapshot, Ray's own or ablate's backup."""
    run_dir = Path(run_dir)
    return bool(sessions(run_dir)) or any(sessions(backup) for backup in _backups(run_dir))


def save_backup(staging_dir: str | Path, run_dir: str | Path) -> Path | None:
    """:func:`_save_backup`; on any failure (a full disk) its temporary folder is removed before the error goes on."""
    try:
        return _save_backup(staging_dir, run_dir)
    except BaseException:
        shutil.rmtree(Path(run_dir) / BACKUP_DIR / f"tmp-{os.getpid()}", ignore_errors=True)
        raise


def _save_backup(staging_dir: str | Path, run_dir: str | Path) -> Path | None:
    """Copy the newest session's snapshot files from Ray's ``staging_dir`` into ``run_dir/.ablate_snapshot/``.

    Call it right after Ray wrote the staging folder (Ray writes it whole, in the driver's thread). The copy
    lands in a temporary folder renamed into place; only the last two generations are kept.
    """
    staging_dir, root = Path(staging_dir), Path(run_dir) / BACKUP_DIR
    found = sessions(staging_dir)
    if not found:
        return None
    files = [staging_dir / t.format(found[0]) for t in SNAPSHOT_FILES]
    root.mkdir(exist_ok=True)
    tmp = root / f"tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for path in files:
        if path.exists():
            shutil.copy2(path, tmp / path.name)
    # after a resume the staging folder holds the Tuner too; in a fresh run only the run directory does
    candidates = (staging_dir / TUNER_FILE, Path(run_dir) / TUNER_FILE)
    tuner = next((p for p in candidates if p.exists() and file_problem(p, "pickle") is None), None)
    key = signing.load_key()
    if tuner is not None and (tuner.parent == staging_dir or _signed_problem(Path(run_dir), tuner, key) is None):
        shutil.copy2(tuner, tmp / TUNER_FILE)
    # the files come from Ray's staging folder, written by this process (or a signed tuner.pkl): sign them
    signing.sign(tmp / SIGNATURES_FILE, [p for p in tmp.iterdir() if p.name != SIGNATURES_FILE], key)
    final = root / f"{time.time_ns():020d}"
    os.rename(tmp, final)
    for old in sorted(p for p in root.iterdir() if p.name.isdigit())[:-_KEEP_BACKUPS]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _backups(run_dir: Path) -> list[Path]:
    root = run_dir / BACKUP_DIR
    return sorted((p for p in root.iterdir() if p.is_dir() and p.name.isdigit()), reverse=True) if root.is_dir() else []


def _signed_problem(folder: Path, path: Path, key: bytes) -> str | None:
    """Why ``path`` does not match the signatures kept in ``folder`` (None: it does)."""
    return signing.problem(signing.read_signatures(folder / SIGNATURES_FILE), path, key)


def choose_snapshot(run_dir: str | Path, trust: bool = False) -> SnapshotChoice:
    """Make the newest complete snapshot of ``run_dir`` the one Ray resumes from.

    Candidates, newest session first and, within a session, the most recently written first (a backup is
    stamped when it was taken, the run directory's copy by its modification time): every session in
    ``run_dir`` and every generation in ``.ablate_snapshot/``. Files of torn sessions at
    least as new as the pick are moved into ``.ablate_discarded/``; a picked backup is copied back into
    ``run_dir``. Raises :class:`SnapshotError` naming every problem when no candidate is complete.
    A session counts only when its signatures match (any when ``trust``): one in the run directory that ablate did
    not sign (a kill while Ray copied a snapshot it had just written, or a file put there by someone else) is set
    aside like a torn one, never unpickled; what is copied back is signed.
    """
    run_dir = Path(run_dir)
    candidates = [
        (session, (run_dir / f"experiment_state-{session}.json").stat().st_mtime_ns, run_dir)
        for session in sessions(run_dir)
    ]
    for backup in _backups(run_dir):
        candidates += [(session, int(backup.name), backup) for session in sessions(backup)[:1]]
    if not candidates:
        raise SnapshotError(f"{run_dir}: no experiment_state-*.json to resume from")
    torn: dict[str, list[str]] = {}
    key = None if trust else signing.load_key()
    for session, _, folder in sorted(candidates, key=lambda c: (c[0], c[1]), reverse=True):
        problems = _session_problems(folder, session)
        if key is not None and not problems:  # an unsigned copy (a kill while Ray copied a snapshot it had not
            problems += _signature_problems(folder, run_dir, session, key)  # yet let ablate sign) counts as torn
        if problems:
            if folder == run_dir:
                torn[session] = problems
            continue
        choice = SnapshotChoice(session, from_backup=folder != run_dir)
        tuner_problem = _tuner_problem(run_dir)
        for newer, why in torn.items():
            choice.discarded.update(_set_aside(run_dir, newer, "; ".join(why)))
        for older in sessions(run_dir):  # Ray copies old sessions back at every snapshot: a kill can tear one
            if older < session:
                why = _session_problems(run_dir, older) or (
                    _signature_problems(run_dir, run_dir, older, key) if key is not None else []
                )
                if why:
                    choice.discarded.update(_set_aside(run_dir, older, "; ".join(why)))
        if choice.from_backup:
            _put_back(folder, run_dir, session)
        if tuner_problem:
            choice.discarded.update(_mend_tuner(run_dir, tuner_problem, key))
        return choice
    detail = "; ".join(p for problems in torn.values() for p in problems)
    unsigned = "signature" in detail or "unsigned" in detail
    hint = "; for a run copied from elsewhere that you trust, add --trust-run-dir" if unsigned else ""
    raise SnapshotError(f"{run_dir}: every experiment snapshot is damaged, so it cannot be resumed ({detail}){hint}")


def _tuner_problem(run_dir: Path) -> str | None:
    path = run_dir / TUNER_FILE
    problem = file_problem(path, "pickle") if path.exists() else "missing"
    return None if problem is None else f"{TUNER_FILE}: {problem}"


def _signature_problems(folder: Path, run_dir: Path, session: str, key: bytes) -> list[str]:
    """The files of ``session`` in ``folder`` (the run directory or a backup) that ablate did not sign."""
    signatures = signing.read_signatures(folder / SIGNATURES_FILE)
    paths = [folder / t.format(session) for t in SNAPSHOT_FILES]
    found = ((p, signing.problem(signatures, p, key)) for p in paths if p.exists())
    return [f"{p.relative_to(run_dir)}: {why}" for p, why in found if why]


def _mend_tuner(run_dir: Path, problem: str, key: bytes | None) -> dict[str, str]:
    """Put back the newest complete (and, unless ``key`` is None, signed) backup of ``tuner.pkl``, the torn
    one set aside; raise if there is none."""
    for backup in _backups(run_dir):
        source = backup / TUNER_FILE
        signed = key is None or (source.exists() and _signed_problem(backup, source, key) is None)
        if source.exists() and file_problem(source, "pickle") is None and signed:
            moved = _move_aside(run_dir / TUNER_FILE, problem)
            _copy_in(source, run_dir)
            return moved
    raise SnapshotError(f"{run_dir}: {problem}, and {BACKUP_DIR}/ holds no complete copy, so it cannot be resumed")


def _put_back(backup: Path, run_dir: Path, session: str) -> None:
    for template in SNAPSHOT_FILES:
        source = backup / template.format(session)
        if source.exists():
            _copy_in(source, run_dir)


def _set_aside(run_dir: Path, session: str, why: str) -> dict[str, str]:
    moved: dict[str, str] = {}
    for template in SNAPSHOT_FILES:
        moved.update(_move_aside(run_dir / template.format(session), why))
    return moved


def _copy_in(source: Path, run_dir: Path) -> None:
    """Copy a backed-up file into ``run_dir`` under its own name, atomically, and sign the copy (the backup was
    checked, or the run directory is trusted)."""
    atomic_write(run_dir / source.name, lambda tmp: shutil.copy2(source, tmp))
    signing.sign(run_dir / SIGNATURES_FILE, [run_dir / source.name], signing.load_key())


def _move_aside(path: Path, why: str) -> dict[str, str]:
    """Move ``path`` (if it exists) into the run directory's ``.ablate_discarded/``; return {name: why}."""
    if not path.exists():
        return {}
    target = path.parent / DISCARDED_DIR
    target.mkdir(exist_ok=True)
    shutil.move(str(path), target / path.name)
    return {path.name: why}
