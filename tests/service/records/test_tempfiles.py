"""No temporary file outlives a failed write, and a write that fails says so in one line (issue 23, item 5).

A full disk is a real one where the tests may mount a tmpfs (root), and otherwise a real file-size limit
(RLIMIT_FSIZE, EFBIG) on a real subprocess (the limit is the whole process's: pytest's own files would meet it
too); a read-only folder is a read-only tmpfs (root) or a folder without write permission (other users). Commands
that need no limit of their own run in this process (tests/conftest.py's ``ablate_cli``). Nothing of ablate is
patched.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_logged, runs_root, smoke_run

CLI = [sys.executable, "-m", "ablate.cli"]


@pytest.fixture(scope="module")
def run_dir(ray_session, tmp_path_factory) -> Path:
    """One real smoke run of batch_vs_dim (Ray), shared with tests/reports/test_report.py in the same session."""
    return smoke_run("batch_vs_dim", runs_root(tmp_path_factory))


def _mount(target: Path, options: str) -> bool:
    target.mkdir(parents=True, exist_ok=True)
    return (
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], capture_output=True).returncode
        == 0
    )


@pytest.fixture()
def read_only_dir(tmp_path):
    """A folder nothing can be written into: a read-only tmpfs as root, a 0555 folder for other users."""
    folder = tmp_path / "ro"
    if os.geteuid() == 0:
        if not _mount(folder, "ro,size=1m"):
            pytest.skip("root, but cannot mount a read-only tmpfs here")
        yield folder
        subprocess.run(["umount", "-l", str(folder)], check=False)
        return
    folder.mkdir()
    folder.chmod(0o555)
    yield folder
    folder.chmod(0o755)


def _limited(max_bytes: int):
    """preexec_fn: files the subprocess writes may not grow beyond ``max_bytes`` (a write past it fails, EFBIG)."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))


def _cli(args: list[str], max_file_bytes: int | None = None) -> subprocess.CompletedProcess:
    limit = _limited(max_file_bytes) if max_file_bytes is not None else None
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, preexec_fn=limit)


def _temporaries(folder: Path) -> list[str]:
    return sorted(
        str(p.relative_to(folder)) for p in folder.rglob("*") if ".tmp-" in p.name or p.name.startswith("tmp-")
    )


def _one_error_line(done) -> str:
    """The one ``cannot write`` line of ``done`` (a subprocess's CompletedProcess or conftest's CliRun), exit 1."""
    assert done.returncode == 1, (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    (line,) = [x for x in done.stderr.splitlines() if x.strip()]
    assert line.startswith("ablate: error: cannot write "), line
    return line


def test_report_on_a_full_disk_says_what_and_leaves_no_temporary(run_dir, tmp_path):
    """The report (MBs) cannot be written past a 64 kB file limit: one line naming the file, exit 1, and no
    `.report.html.tmp-PID` left behind to keep the disk full; the old report stays as it was."""
    out = tmp_path / "out" / "report.html"
    out.parent.mkdir()
    out.write_text("the previous report")
    done = _cli(["report", str(run_dir), "--out", str(out)], max_file_bytes=64 * 1024)
    line = _one_error_line(done)
    assert line == f"ablate: error: cannot write {out} (File too large)", line
    assert _temporaries(out.parent) == []
    assert out.read_text() == "the previous report"


def test_report_on_a_real_full_tmpfs(run_dir, tmp_path, ablate_cli):
    """The same on a real full disk: a 1 MB tmpfs (mounting needs root) and a report of several MB."""
    disk = tmp_path / "disk"
    if not _mount(disk, "size=1m"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        done = ablate_cli("report", str(run_dir), "--out", str(disk / "report.html"))
        line = _one_error_line(done)
        assert line == f"ablate: error: cannot write {disk / 'report.html'} (No space left on device)", line
        assert sorted(p.name for p in disk.iterdir()) == [], "a temporary is left on the full disk"
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_export_into_a_read_only_folder_is_one_line(run_dir, read_only_dir, ablate_cli, suffix):
    out = read_only_dir / f"results{suffix}"
    line = _one_error_line(ablate_cli("export", str(run_dir), "--out", str(out)))
    assert line.startswith(f"ablate: error: cannot write {out} ("), line
    assert ("Read-only file system" in line) or ("Permission denied" in line), line
    assert list(read_only_dir.iterdir()) == []


def test_export_on_a_full_disk_leaves_neither_half_a_table_nor_a_temporary(run_dir, tmp_path):
    out = tmp_path / "results.csv"
    line = _one_error_line(_cli(["export", str(run_dir), "--out", str(out)], max_file_bytes=4096))
    assert line == f"ablate: error: cannot write {out} (File too large)", line
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    done = _cli(["export", str(run_dir), "--out", str(out)])  # with room, the same command writes it
    assert done.returncode == 0 and out.stat().st_size > 4096, done.stderr[-2000:]


def test_atomic_write_removes_its_temporary_whatever_fails(tmp_path):
    """A writer that raises (here: not an OSError) leaves the old file and no temporary."""
    from ablate.service.records.rundir import atomic_write

    target = tmp_path / "state.json"
    target.write_text("old")

    def half_then_fail(tmp: Path) -> None:
        tmp.write_text("half of the new")
        raise ValueError("the writer failed")

    with pytest.raises(ValueError, match="the writer failed"):
        atomic_write(target, half_then_fail)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
    assert target.read_text() == "old"


def test_sweep_removes_temporaries_of_dead_writers_only(tmp_path):
    from ablate.service.records.rundir import sweep_stale_temps

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = os.getpid()
    run = tmp_path / "run"
    (run / "trial_1").mkdir(parents=True)
    stale = [f".report.html.tmp-{dead.pid}-{dead.pid}", f"trial_1/.params.json.tmp-{dead.pid}"]  # and an old name
    kept = [f".report.html.tmp-{live}-7", f".marker.json.tmp-{live}"]
    for name in (*stale, *kept):
        (run / name).write_text("partial")
    (run / "trial_1" / "tmp-1").mkdir()  # not ablate's: a tmp-<pid> folder is kept
    removed = sweep_stale_temps(run)
    assert removed == sorted(stale)
    assert _temporaries(run) == sorted([*kept, "trial_1/tmp-1"])


def test_threads_of_one_process_write_one_file_at_once_each_through_its_own_temporary(tmp_path):
    """A lease's heartbeat and its release may write the same file from two threads: each whole write lands (the
    last rename wins), none fails on the other's temporary, and none is left behind."""
    import threading

    from ablate.service.records.rundir import atomic_write

    target, errors = tmp_path / "lease.json", []

    def writer(text: str) -> None:
        try:
            for _ in range(300):
                atomic_write(target, lambda tmp: tmp.write_text(text * 1000))
        except Exception as exc:  # noqa: BLE001 - collected, asserted below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(c,)) for c in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and target.read_text() in ("a" * 1000, "b" * 1000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lease.json"]


def test_resume_sweeps_what_killed_writers_left(run_dir, tmp_path):
    """A real `--resume` of a copy of the finished run removes the temporaries of dead pids (report, trial
    file), keeps a live writer's, says what it removed, and completes."""
    storage = tmp_path / "storage"
    copy = storage / run_dir.name
    shutil.copytree(run_dir, copy)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    trial = sorted(copy.glob("trial_*"))[0]
    planted = [copy / f".report.html.tmp-{dead.pid}", trial / f".params.json.tmp-{dead.pid}"]
    for path in planted:
        path.write_bytes(b"\0" * 4096)
    live = copy / f".report.html.tmp-{os.getpid()}"
    live.write_text("being written")
    cmd = [*CLI, "run", "batch_vs_dim", "--scale", "smoke", "--storage", str(storage), "--resume", "--verbose", "0"]
    code, out = run_logged([*cmd, "--no-report"], tmp_path / "resume.log")
    assert code == 0, out[-3000:]
    assert "removed 2 temporary file(s) of killed writers" in out, out[-3000:]
    assert not any(p.exists() for p in planted)
    assert live.exists()
