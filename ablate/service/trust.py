"""Only what ablate wrote is ever unpickled: signing a run's pickled files, and checking them before --resume.

Ray Tune resumes a run by unpickling files of its run directory (:func:`ablate.ray_compat.unpickled_on_restore`:
``tuner.pkl`` and the experiment snapshots), so a crafted run directory would run code on ``--resume``.
ablate signs each such file with the user's key (:mod:`ablate.signing`) when its own process writes it:

- ``tuner.pkl`` right after Ray writes it (:func:`sign_files`, from the runner);
- every experiment snapshot while Ray saves it, before Ray copies it into the run directory
  (:func:`sign_session`, from :class:`ablate.service.callbacks.SnapshotKeeper`; the last one when the run
  ends); the backups in ``.ablate_snapshot/`` carry signatures of their own (:mod:`ablate.service.snapshots`).

:func:`check_before_resume` then refuses, before anything is unpickled, a run directory holding any file
Ray would unpickle that does not match a signature, and any ``_dict_checkpoint.pkl`` in a trial's checkpoint
(ablate never writes one; Ray would unpickle it in the trial). ``trust=True`` (``--trust-run-dir``) signs
them instead: the user vouches for a run copied from elsewhere, and later resumes need no flag.

What else is read on resume is safe without signatures: checkpoints are loaded with
``torch.load(..., weights_only=True)``; ``error.pkl`` of a failed trial is read by Ray only when the trial
failed in the same driver (a resumed trial's error file name is cleared); ablate's own readers (status,
export, report, claims) parse JSON, and Optuna's study is SQLite (RDBStorage unpickles nothing).
Remote storage (``s3://``, ``gs://``) cannot be signed as Ray writes it, so resuming there needs ``trust``.
"""

from __future__ import annotations

from pathlib import Path

from ablate import ray_compat, signing
from ablate.rundir import SIGNATURES_FILE, TRIAL_PREFIX, RunError, is_remote
from ablate.service.snapshots import BACKUP_DIR, sessions

__all__ = ["check_before_resume", "check_key", "restore_files", "sign_files", "sign_session"]


def check_key() -> None:
    """Read (or create) the signing key now, before any compute; :class:`RunError` when it is unusable."""
    try:
        signing.load_key()
    except signing.SigningError as exc:
        raise RunError(str(exc)) from None


def restore_files(run_dir: str | Path) -> list[Path]:
    """The files at the root of ``run_dir`` that Ray may unpickle when it resumes the run."""
    root = Path(run_dir)
    return sorted(p for p in root.iterdir() if p.is_file() and ray_compat.unpickled_on_restore(p.name))


def sign_files(run_dir: str | Path, paths: list[Path]) -> None:
    """Record the signatures of ``paths`` (files this process wrote, or copies of them) in ``run_dir``."""
    signing.sign(Path(run_dir) / SIGNATURES_FILE, paths, signing.load_key())


def sign_session(staging_dir: str | Path, run_dir: str | Path) -> None:
    """Sign the newest session's snapshot files in Ray's staging folder, recording them in ``run_dir``.

    Ray writes them in the driver's thread and copies them into ``run_dir`` afterwards, under the same names:
    the copy that lands there is then one of the signed versions (:data:`ablate.signing.HISTORY` are kept).
    """
    staging_dir = Path(staging_dir)
    found = sessions(staging_dir)
    if found:
        paths = [staging_dir / t.format(found[0]) for t in ray_compat.SNAPSHOT_FILES]
        sign_files(run_dir, [p for p in paths if p.exists()])


def _unsigned(run_dir: Path, key: bytes) -> list[str]:
    signatures = signing.read_signatures(run_dir / SIGNATURES_FILE)
    found = ((p, signing.problem(signatures, p, key)) for p in restore_files(run_dir))
    problems = [f"{p.name} ({why})" for p, why in found if why]
    for path in sorted(run_dir.glob(f"{TRIAL_PREFIX}*/*/{ray_compat.DICT_CHECKPOINT_FILE}")):
        problems.append(f"{path.relative_to(run_dir)} (ablate never writes this file)")
    return problems


def _adopt(run_dir: Path) -> None:
    """Sign every file Ray may unpickle in ``run_dir`` and its backups: the user vouched for them."""
    sign_files(run_dir, restore_files(run_dir))
    backups = run_dir / BACKUP_DIR
    for folder in sorted(backups.iterdir()) if backups.is_dir() else []:
        if folder.is_dir() and folder.name.isdigit():
            files = [p for p in folder.iterdir() if p.is_file() and ray_compat.unpickled_on_restore(p.name)]
            signing.sign(folder / SIGNATURES_FILE, files, signing.load_key())


def check_before_resume(run_dir: str, trust: bool = False) -> None:
    """Raise :class:`RunError` unless every file Ray would unpickle to resume ``run_dir`` carries ablate's
    signature; with ``trust``, sign them instead. Reads bytes only: nothing is unpickled here."""
    if is_remote(run_dir):
        if not trust:
            raise RunError(
                f"--resume: {run_dir} is on remote storage, where ablate cannot sign the files Ray unpickles to "
                "resume a run (unpickling a crafted file runs code); if only you can write there, add "
                "--trust-run-dir"
            )
        return
    root = Path(run_dir)
    try:
        if trust:
            _adopt(root)
            return
        problems = _unsigned(root, signing.load_key())
    except signing.SigningError as exc:
        raise RunError(f"--resume: {exc}") from None
    if problems:
        raise RunError(
            f"--resume: refusing {run_dir}: Ray would unpickle files (which can run code) that ablate did not "
            f"write with your signing key {signing.key_file()}: {'; '.join(problems)}. ablate resumes only runs "
            "it wrote itself; for a run copied from elsewhere that you trust, add --trust-run-dir"
        )
