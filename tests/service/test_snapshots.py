"""Resuming from torn experiment snapshots: the files a driver killed mid-copy leaves behind.

Ray copies its snapshot into the run directory non-atomically and, when it cannot read it on resume,
starts a new experiment with no parameters. These tests tear the files the way a kill does (truncation at
every kind of boundary, a missing searcher state) and check that ablate resumes from the newest complete
snapshot, or stops with a clear error, and never lets Ray restart the grid empty.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from ablate.rundir import RunError
from ablate.service.grids import load_grid
from ablate.service.runner import run_grid
from ablate.service.snapshots import (
    BACKUP_DIR,
    DISCARDED_DIR,
    TUNER_FILE,
    choose_snapshot,
    file_problem,
    sessions,
)


def _grid():
    grid = load_grid("batch_vs_dim", "smoke")
    grid.stop.max_steps = 15
    return grid


@pytest.fixture(scope="module")
def finished_run(ray_session, tmp_path_factory) -> Path:
    """A finished smoke run (4 trials) resumed once, so it holds two sessions; copied by each test."""
    storage = tmp_path_factory.mktemp("runs")
    first = run_grid(_grid(), storage=str(storage), name="r", verbose=0)
    assert not first.failed
    again = run_grid(_grid(), storage=str(storage), name="r", verbose=0, resume=True)
    assert not again.failed
    run_dir = storage / "r"
    assert len(sessions(run_dir)) == 2
    return run_dir


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "r"
    shutil.copytree(run_dir, target)
    return target


def _truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def _final_r2(run_dir: Path) -> dict[str, float]:
    out = {}
    for trial in sorted(run_dir.glob("trial_*")):
        rows = [json.loads(line) for line in (trial / "result.json").read_text().splitlines() if line.strip()]
        out[trial.name] = rows[-1]["r2"]
    return out


def test_complete_files_pass_and_every_truncation_is_caught(finished_run):
    newest = sessions(finished_run)[0]
    state = finished_run / f"experiment_state-{newest}.json"
    searcher = finished_run / f"basic-variant-state-{newest}.json"
    assert file_problem(state, "json") is None
    assert file_problem(searcher, "pickle") is None
    rng = random.Random(0)
    for path, kind in ((state, "json"), (searcher, "pickle")):
        data = path.read_bytes()
        cuts = {0, 1, len(data) - 1, *(rng.randrange(1, len(data)) for _ in range(40))}
        for cut in sorted(cuts):
            torn = path.with_name("torn-" + path.name)
            torn.write_bytes(data[:cut])
            assert file_problem(torn, kind), (path.name, cut)
            torn.unlink()


def test_json_that_is_not_ray_state_is_refused(tmp_path):
    path = tmp_path / "experiment_state-x.json"
    path.write_text('{"something": 1}')
    assert "trial_data" in file_problem(path, "json")


def test_torn_newest_session_falls_back_to_the_older_one(finished_run, tmp_path):
    run_dir = _copy(finished_run, tmp_path)
    shutil.rmtree(run_dir / BACKUP_DIR)  # only the run directory's own files
    old, new = sessions(run_dir)[1], sessions(run_dir)[0]
    _truncate(run_dir / f"basic-variant-state-{new}.json", 100)
    choice = choose_snapshot(run_dir)
    assert choice.session == old and not choice.from_backup
    assert set(choice.discarded) == {f"experiment_state-{new}.json", f"basic-variant-state-{new}.json"}
    assert sorted(p.name for p in (run_dir / DISCARDED_DIR).iterdir()) == sorted(choice.discarded)
    assert sessions(run_dir) == [old]


def test_missing_searcher_state_is_a_torn_session(finished_run, tmp_path):
    run_dir = _copy(finished_run, tmp_path)
    shutil.rmtree(run_dir / BACKUP_DIR)
    new = sessions(run_dir)[0]
    (run_dir / f"basic-variant-state-{new}.json").unlink()
    choice = choose_snapshot(run_dir)
    assert choice.session == sessions(finished_run)[1]
    assert "search algorithm state was never written" in choice.discarded[f"experiment_state-{new}.json"]


def test_torn_only_session_resumes_from_ablates_backup(ray_session, finished_run, tmp_path):
    run_dir = _copy(finished_run, tmp_path)
    for session in sessions(run_dir):  # tear every session Ray left in the run directory
        _truncate(run_dir / f"experiment_state-{session}.json", 2000)
    before = _final_r2(run_dir)
    outcome = run_grid(_grid(), storage=str(tmp_path), name="r", verbose=0, resume=True)
    assert len(outcome.trials) == 4 and not outcome.failed
    assert all(t.params.get("grid") == "batch_vs_dim" for t in outcome.trials)
    assert outcome.set_aside  # the torn files were moved aside, not deleted
    assert len(list(run_dir.glob("trial_*"))) == 4, "no new trial was started"
    assert _final_r2(run_dir) == before


def test_every_backup_keeps_a_complete_tuner(finished_run):
    generations = sorted((finished_run / BACKUP_DIR).iterdir())
    assert generations
    for generation in generations:
        assert file_problem(generation / TUNER_FILE, "pickle") is None, generation


@pytest.mark.parametrize("keep", [0, 300])  # empty (killed as the copy opened it) and cut mid-stream
def test_torn_tuner_is_put_back_from_ablates_backup(ray_session, finished_run, tmp_path, keep):
    """After a resume Ray copies tuner.pkl back at every snapshot; a kill then can tear it (seen in CI)."""
    run_dir = _copy(finished_run, tmp_path)
    whole = (run_dir / TUNER_FILE).read_bytes()
    _truncate(run_dir / TUNER_FILE, keep)
    before = _final_r2(run_dir)
    outcome = run_grid(_grid(), storage=str(tmp_path), name="r", verbose=0, resume=True)
    assert len(outcome.trials) == 4 and not outcome.failed
    assert "tuner.pkl" in outcome.set_aside
    assert (run_dir / DISCARDED_DIR / TUNER_FILE).read_bytes() == whole[:keep]  # set aside, not deleted
    assert file_problem(run_dir / TUNER_FILE, "pickle") is None
    assert len(list(run_dir.glob("trial_*"))) == 4, "no new trial was started"
    assert _final_r2(run_dir) == before


def test_torn_tuner_without_a_backup_is_a_clear_error(ray_session, finished_run, tmp_path):
    run_dir = _copy(finished_run, tmp_path)
    shutil.rmtree(run_dir / BACKUP_DIR)
    _truncate(run_dir / TUNER_FILE, 0)
    with pytest.raises(RunError, match="tuner.pkl: empty, and .ablate_snapshot/ holds no complete copy"):
        run_grid(_grid(), storage=str(tmp_path), name="r", verbose=0, resume=True)
    assert len(list(run_dir.glob("trial_*"))) == 4


def test_no_complete_snapshot_is_a_clear_error_before_ray_runs_anything(ray_session, finished_run, tmp_path):
    run_dir = _copy(finished_run, tmp_path)
    shutil.rmtree(run_dir / BACKUP_DIR)
    for session in sessions(run_dir):
        _truncate(run_dir / f"experiment_state-{session}.json", 500)
    with pytest.raises(RunError, match="every experiment snapshot is damaged.*not complete JSON"):
        run_grid(_grid(), storage=str(tmp_path), name="r", verbose=0, resume=True)
    assert len(list(run_dir.glob("trial_*"))) == 4


def test_state_ray_cannot_read_stops_instead_of_restarting_empty(ray_session, finished_run, tmp_path):
    run_dir = _copy(finished_run, tmp_path)
    shutil.rmtree(run_dir / BACKUP_DIR)
    newest = run_dir / f"experiment_state-{sessions(run_dir)[0]}.json"
    state = json.loads(newest.read_text())
    state["trial_data"] = [['{"not": "a trial"}', "{}"]]  # complete JSON, but not trials Ray can restore
    newest.write_text(json.dumps(state))
    # trusted: an altered state is refused earlier (test_signing); this is the backstop behind that check
    with pytest.raises(RunError, match="stopped instead of restarting the grid from scratch"):
        run_grid(_grid(), storage=str(tmp_path), name="r", verbose=0, resume=True, trust_run_dir=True)
    assert len(list(run_dir.glob("trial_*"))) == 4, "Ray must not have started an empty experiment"


def test_optuna_run_with_a_torn_snapshot_resumes_from_the_backup(ray_session, tmp_path):
    """The Optuna searcher's files (search_gen_state, searcher-state) are backed up and checked too."""
    grid = load_grid("tune_aninfonce", "smoke")
    first = run_grid(grid, storage=str(tmp_path), name="opt", verbose=0)
    run_dir = first.run_dir
    (session,) = sessions(run_dir)
    backup = sorted((run_dir / BACKUP_DIR).iterdir())[-1]
    assert {p.name for p in backup.iterdir()} >= {f"search_gen_state-{session}.json", f"searcher-state-{session}.pkl"}
    _truncate(run_dir / f"searcher-state-{session}.pkl", 50)
    again = run_grid(grid, storage=str(tmp_path), name="opt", verbose=0, resume=True)
    assert f"searcher-state-{session}.pkl" in again.set_aside
    assert len(again.trials) == len(first.trials) and not again.failed
    assert len(list(run_dir.glob("trial_*"))) == len(first.trials), "no new trial was started"


@pytest.mark.parametrize("torn", [b'{"step": 1', b"x" * 200_000])  # a cut row, short or longer than a chunk
def test_result_log_drops_a_torn_last_line_before_appending(tmp_path, torn):
    from ablate.service.callbacks import append_row

    path = tmp_path / "result.json"
    path.write_bytes(b'{"step": 0}\n' + torn)
    append_row(path, {"step": 1})
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"step": 0}, {"step": 1}]
    path.write_bytes(torn)  # no complete line at all
    append_row(path, {"step": 2})
    assert path.read_text() == '{"step": 2}\n'


def test_a_torn_run_marker_is_read_from_its_backup(tmp_path):
    """Ray's sync after a resume copies the run directory's files back non-atomically; a kill then can tear the
    marker (an empty ablate_run.json was seen in test_reliability). The backup copy keeps the run resumable."""
    from ablate.rundir import RUN_MARKER, RUN_MARKER_BACKUP, RunError, RunReader, write_marker

    write_marker(str(tmp_path), {"grid": "batch_vs_dim", "scale": "smoke"})
    (tmp_path / RUN_MARKER).write_text("")
    assert RunReader(tmp_path).marker()["grid"] == "batch_vs_dim"
    (tmp_path / RUN_MARKER_BACKUP).write_text('{"grid": "batch_v')
    with pytest.raises(RunError, match="damaged run marker .* no intact backup"):
        RunReader(tmp_path).marker()
