"""Only what ablate wrote is unpickled on --resume: signed run directories, crafted ones refused, private secrets.

One real smoke run is stopped by a real SIGINT (in a subprocess with its own HOME, so the Ray auth token it
makes is its own); each test works on a copy of it.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import smoke_cmd

from ablate import cli, signing
from ablate.rundir import SIGNATURES_FILE, RunError
from ablate.service.snapshots import BACKUP_DIR, DISCARDED_DIR, SnapshotError, choose_snapshot, sessions
from ablate.service.trust import check_before_resume

REPORTS = 12
STEPS = 5 * REPORTS


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _rows(run_dir: Path) -> dict[str, list[dict]]:
    out = {}
    for d in sorted(run_dir.glob("trial_*")):
        lines = (d / "result.json").read_text().splitlines() if (d / "result.json").exists() else []
        out[d.name] = [json.loads(line) for line in lines if line.endswith("}")]
    return out


def _args(storage: Path, *extra: str, name: str = "r") -> list[str]:
    # no --max-concurrent: Ray makes every trial at once, so each is in the snapshot and a copy of the run
    # resumes into the copy (a trial Ray had not made yet would be made at the original place: Ray 2.60's
    # search algorithm state keeps the storage path of the run it was saved in)
    return smoke_cmd(storage, "--name", name, "--set", f"max_steps={STEPS}", *extra)[3:]


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory) -> tuple[Path, Path]:
    """(run directory, HOME) of a smoke run that a real Ctrl-C (SIGINT to its process group) stopped mid-grid."""
    root = tmp_path_factory.mktemp("signed")
    home = root / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_AUTH_TOKEN", None)
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    run_dir = root / "r"
    with open(root / "run.log", "w") as log:
        cmd = [sys.executable, "-m", "ablate.cli", *_args(root, "--no-report")]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            deadline = time.time() + 240
            while time.time() < deadline and not any(len(v) >= 3 for v in _rows(run_dir).values()):
                assert proc.poll() is None, (root / "run.log").read_text()[-3000:]
                time.sleep(0.05)
            os.killpg(proc.pid, signal.SIGINT)
            code = proc.wait(timeout=90)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    assert code == 130, (root / "run.log").read_text()[-3000:]
    return run_dir, home


def _copy(run_dir: Path, tmp_path: Path, name: str = "r") -> Path:
    """A copy of the run. Copies resumed in this process need names of their own: Ray keeps one staging folder
    per run name and start time in a Ray session and copies all of it into the run it resumes."""
    target = tmp_path / name
    shutil.copytree(run_dir, target)
    return target


class _Evil:
    """Unpickling this creates a file: what a crafted pickle could do with any code."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def _refusal(tmp_path: Path, capsys, *extra: str, name: str = "r") -> tuple[int, str]:
    code = cli.main([*_args(tmp_path, "--no-report", "--verbose", "0", "--resume", name=name), *extra])
    return code, capsys.readouterr().err


# ------------------------------------------------------------------ the run resumes, signatures stay current
@pytest.mark.ray
def test_an_interrupted_run_resumes_normally(ray_session, interrupted, tmp_path):
    run_dir = _copy(interrupted[0], tmp_path, "normal")
    check_before_resume(str(run_dir))  # every file Ray will unpickle carries a valid signature
    code = cli.main(_args(tmp_path, "--no-report", "--verbose", "0", "--resume", name="normal"))
    assert code == 0
    rows = _rows(run_dir)
    assert len(rows) == 4
    for name, trial_rows in rows.items():
        assert [r["step"] for r in trial_rows] == list(range(5, STEPS + 1, 5)), name
    check_before_resume(str(run_dir))  # and still after the resumed driver rewrote them


@pytest.mark.ray
def test_the_ray_auth_token_and_the_signing_key_are_private(interrupted):
    token = interrupted[1] / ".ray" / "auth_token"
    assert token.is_file() and _mode(token) == 0o600
    key = signing.key_file()
    assert key.is_file() and _mode(key) == 0o600 and _mode(key.parent) == 0o700


# ------------------------------------------------------------------ crafted run directories are refused
@pytest.mark.ray
def test_a_crafted_tuner_pkl_is_refused_before_it_is_unpickled(ray_session, interrupted, tmp_path, capsys):
    run_dir = _copy(interrupted[0], tmp_path, "crafted")
    created = tmp_path / "pwned"
    (run_dir / "tuner.pkl").write_bytes(pickle.dumps(_Evil(created)))
    code, err = _refusal(tmp_path, capsys, name="crafted")
    assert code == 2
    assert "tuner.pkl (altered: its signature does not match)" in err and "--trust-run-dir" in err, err
    assert not created.exists(), "the crafted pickle ran"
    # the threat is real: told to trust the directory, Ray unpickles the file and it runs
    with pytest.raises(Exception):  # noqa: B017 - whatever Ray makes of an open file instead of its Tuner
        _refusal(tmp_path, capsys, "--trust-run-dir", name="crafted")
    assert created.exists()


@pytest.mark.ray
def test_an_altered_experiment_state_is_set_aside_never_unpickled(interrupted, tmp_path, capsys):
    """A session file ablate did not sign (altered here; a kill while Ray copied a snapshot it had not yet let
    ablate sign does the same) is moved aside like a torn one, and the newest signed backup is resumed; without a
    signed backup the run is refused."""
    run_dir = _copy(interrupted[0], tmp_path)
    path = run_dir / f"experiment_state-{sessions(run_dir)[0]}.json"
    state = json.loads(path.read_text())
    state["stats"]["start_time"] = 0.0  # still complete Ray state, only not what ablate wrote
    altered = json.dumps(state)
    path.write_text(altered)
    choice = choose_snapshot(run_dir)
    assert choice.from_backup and "altered: its signature does not match" in choice.discarded[path.name]
    assert (run_dir / DISCARDED_DIR / path.name).read_text() == altered and path.read_text() != altered
    check_before_resume(str(run_dir))  # what Ray will unpickle now is signed

    path.write_text(altered)
    shutil.rmtree(run_dir / BACKUP_DIR)
    code, err = _refusal(tmp_path, capsys)
    assert code == 2 and f"{path.name}: altered: its signature does not match" in err, err
    assert "--trust-run-dir" in err, err


@pytest.mark.ray
def test_a_pickle_planted_in_a_checkpoint_is_refused(interrupted, tmp_path, capsys):
    run_dir = _copy(interrupted[0], tmp_path)
    checkpoint = sorted(run_dir.glob("trial_*/checkpoint_*"))[0]
    (checkpoint / "_dict_checkpoint.pkl").write_bytes(pickle.dumps(_Evil(tmp_path / "pwned")))
    code, err = _refusal(tmp_path, capsys)
    assert code == 2 and "_dict_checkpoint.pkl (ablate never writes this file)" in err, err


@pytest.mark.ray
def test_a_tampered_backup_is_never_copied_back(interrupted, tmp_path):
    run_dir = _copy(interrupted[0], tmp_path)
    (session,) = sessions(run_dir)
    name = f"experiment_state-{session}.json"
    (run_dir / name).write_bytes((run_dir / name).read_bytes()[:500])  # torn: the backup must stand in
    older, newer = sorted((run_dir / BACKUP_DIR).iterdir())
    (newer / name).write_text((newer / name).read_text().replace('"stats": {', '"stats": {"x": 1, ', 1))
    choice = choose_snapshot(run_dir)
    assert choice.from_backup and (run_dir / name).read_bytes() == (older / name).read_bytes()
    check_before_resume(str(run_dir))  # what was copied back is signed

    (run_dir / name).write_bytes(b"{")
    (older / name).write_text((older / name).read_text().replace('"stats": {', '"stats": {"x": 1, ', 1))
    with pytest.raises(SnapshotError, match="every experiment snapshot is damaged"):
        choose_snapshot(run_dir)
    assert (run_dir / name).read_bytes() == b"{", "an altered backup was copied in"


# ------------------------------------------------------------------ --trust-run-dir
@pytest.mark.ray
def test_trust_run_dir_resumes_a_run_signed_with_another_key(ray_session, interrupted, tmp_path, capsys, monkeypatch):
    run_dir = _copy(interrupted[0], tmp_path, "trusted")
    monkeypatch.setenv(signing.KEY_ENV, str(tmp_path / "other-user" / "signing.key"))
    code, err = _refusal(tmp_path, capsys, name="trusted")  # the snapshot is checked first, then tuner.pkl
    assert code == 2 and "altered: its signature does not match" in err and "--trust-run-dir" in err, err
    code = cli.main([*_args(tmp_path, "--no-report", "--verbose", "0", "--resume", name="trusted"), "--trust-run-dir"])
    assert code == 0
    assert all(len(v) == REPORTS for v in _rows(run_dir).values()) and len(_rows(run_dir)) == 4
    check_before_resume(str(run_dir))  # adopted: the next resume needs no flag


def test_a_run_on_remote_storage_resumes_only_when_trusted(capsys):
    code = cli.main(["run", "batch_vs_dim", "--scale", "smoke", "--storage", "s3://bucket/runs", "--resume"])
    assert code == 2
    assert "remote storage" in capsys.readouterr().err
    with pytest.raises(RunError, match="--trust-run-dir"):
        check_before_resume("s3://bucket/runs/r")
    args = cli.build_parser().parse_args(["run", "batch_vs_dim", "--storage", "s3://bucket/runs"])
    assert cli.resume_command(args).endswith("--trust-run-dir --resume")


# ------------------------------------------------------------------ ablate.signing and the token file
def test_the_key_is_created_private_once_and_refused_when_others_can_read_it(tmp_path, monkeypatch):
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    path = signing.key_file()
    assert path == tmp_path / "config" / "ablate" / "signing.key"
    key = signing.load_key()
    assert len(key) == 32 and _mode(path) == 0o600 and _mode(path.parent) == 0o700
    assert signing.load_key() == key
    path.chmod(0o644)
    with pytest.raises(signing.SigningError, match="chmod 600"):
        signing.load_key()


def test_a_signature_binds_the_name_and_the_bytes_and_keeps_recent_versions(tmp_path):
    key = b"k" * 32
    assert signing.digest(key, "a.pkl", b"x") != signing.digest(key, "b.pkl", b"x")
    assert signing.digest(key, "a.pkl", b"x") != signing.digest(b"j" * 32, "a.pkl", b"x")
    path, sig = tmp_path / "a.pkl", tmp_path / SIGNATURES_FILE
    assert signing.problem({}, path, key) == "unsigned"
    for version in range(signing.HISTORY + 1):
        path.write_bytes(b"v%d" % version)
        signing.sign(sig, [path], key)
    signatures = signing.read_signatures(sig)
    assert signing.problem(signatures, path, key) is None
    path.write_bytes(b"v1")  # an older version Ray may still be copying into place
    assert signing.problem(signatures, path, key) is None
    path.write_bytes(b"v0")  # older than the history
    assert signing.problem(signatures, path, key) == "altered: its signature does not match"


def test_the_token_file_is_written_and_kept_private(tmp_path):
    from ablate.service.cluster import keep_token_private

    token = tmp_path / "ray" / "token"
    env = {"RAY_AUTH_TOKEN_PATH": str(token)}
    assert keep_token_private(create=True, environ=env) == token
    assert _mode(token) == 0o600 and len(token.read_text()) == 64
    token.chmod(0o644)  # as Ray writes it
    keep_token_private(environ=env)
    assert _mode(token) == 0o600
    other = tmp_path / "off"
    off = {"RAY_AUTH_TOKEN_PATH": str(other), "RAY_AUTH_MODE": "disabled"}
    assert keep_token_private(create=True, environ=off) is None and not other.exists()
