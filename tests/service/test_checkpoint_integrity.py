"""Each report once, whatever checkpoint a trial resumes from (issue 23, items 2-4): real Ray, real files.

A trial that stopped part-way (an injected fault with no retries leaves it ERROR, which --resume continues
from its checkpoint) or a finished one is damaged on disk: garbage in its latest checkpoint, in both, the
latest checkpoint folder deleted, its result.json cut mid-file. After --resume its export must equal, row for
row, that of a run never stopped (timing columns aside): no report missing, none repeated, the same numbers.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ablate.service.grids import load_grid
from ablate.service.integrity import CHECKPOINT_FILE, intact_rows, log_problem
from ablate.service.runner import run_grid

REPORT_EVERY, MAX_STEPS = 5, 40  # 8 reports
#: The faulty trial stops during report 6: checkpoints after reports 4 and 5 (steps 20, 25).
_FAULT = {"at_step": 28, "times": 1}
#: Columns that differ between two runs of the same point by their timing or their bookkeeping only.
_TIMING = {"trial_id", "status", "time_total_s", "prefetch"}


def _grid(**base):
    grid = load_grid("batch_vs_dim", "smoke")
    grid.axes = {"batch_size": [32], "latent_dim": [3]}
    grid.base.update(base)
    grid.stop.max_steps = MAX_STEPS
    return grid


def _export(run_dir: Path):
    from ablate.analysis.results import load_results

    df = load_results(run_dir)
    return df[[c for c in df.columns if c not in _TIMING]].reset_index(drop=True)


def _trial(run_dir: Path) -> Path:
    (trial,) = run_dir.glob("trial_*")
    return trial


def _checkpoints(run_dir: Path) -> list[Path]:
    return sorted(_trial(run_dir).glob("checkpoint_*"))


@pytest.fixture(scope="module")
def runs(ray_session, tmp_path_factory):
    """A run never stopped, and the folder for the others."""
    root = tmp_path_factory.mktemp("integrity")
    clean = run_grid(_grid(), storage=str(root), name="clean", verbose=0)
    assert not clean.failed
    return root, _export(clean.run_dir)


def _stopped(root: Path, name: str) -> Path:
    """The point stopped by a fault during report 6 (ERROR, resumable; the fault fires once per run, as long
    as the run keeps its name: Ray keeps the trial's working folder, where the fault counts, by that name)."""
    stopped = run_grid(_grid(fault=_FAULT), storage=str(root), name=name, verbose=0, max_failures=0)
    assert [t.status for t in stopped.trials] == ["ERROR"]
    assert [p.name for p in _checkpoints(stopped.run_dir)] == ["checkpoint_000003", "checkpoint_000004"]
    return stopped.run_dir


def _resume(run_dir: Path, **base):
    return run_grid(_grid(**base), storage=str(run_dir.parent), name=run_dir.name, resume=True, verbose=0)


def _assert_as_never_stopped(run_dir: Path, reference) -> None:
    from pandas.testing import assert_frame_equal

    df = _export(run_dir)
    steps = list(range(REPORT_EVERY, MAX_STEPS + 1, REPORT_EVERY))
    assert df["step"].tolist() == steps and df["training_iteration"].tolist() == list(range(1, len(steps) + 1))
    assert_frame_equal(df[reference.columns], reference, check_exact=True)


def _status(run_dir: Path) -> dict:
    from ablate.analysis.status import run_status

    return run_status(run_dir)


def test_garbage_in_the_latest_checkpoint_resumes_from_the_earlier_one_without_repeating_a_report(runs):
    root, reference = runs
    run_dir = _stopped(root, "garbage_latest")
    (_checkpoints(run_dir)[-1] / CHECKPOINT_FILE).write_bytes(b"garbage")
    _resume(run_dir, fault=_FAULT)
    _assert_as_never_stopped(run_dir, reference)  # report 5 (step 25) once, numbered 5


def test_both_checkpoints_rejected_restarts_at_step_0_and_rewrites_every_report_once(runs):
    root, reference = runs
    run_dir = _stopped(root, "garbage_both")
    for ckpt in _checkpoints(run_dir):
        (ckpt / CHECKPOINT_FILE).write_bytes(b"garbage")
    _resume(run_dir, fault=_FAULT)
    _assert_as_never_stopped(run_dir, reference)


def test_a_deleted_latest_checkpoint_folder_resumes_from_the_newest_that_exists(runs, caplog):
    root, reference = runs
    run_dir = _stopped(root, "deleted_latest")
    shutil.rmtree(_checkpoints(run_dir)[-1])
    with caplog.at_level("WARNING"):
        outcome = _resume(run_dir, fault=_FAULT)
    assert not outcome.failed, [t.error for t in outcome.failed]  # Ray alone: "checkpoint ... does not exist"
    _assert_as_never_stopped(run_dir, reference)
    # Ray deletes the checkpoints it tracks as new ones come; a missing one made it log a traceback
    assert "checkpoint_000004 is gone" in caplog.text and "Error handling checkpoint" not in caplog.text
    assert [p.name for p in _checkpoints(run_dir)] == ["checkpoint_000007", "checkpoint_000008"]


def _cut_mid_file(run_dir: Path, fraction: float) -> None:
    log = _trial(run_dir) / "result.json"
    data = log.read_bytes()
    log.write_bytes(data[: int(len(data) * fraction)])


def test_a_result_log_cut_mid_file_in_a_stopped_trial_is_flagged_and_refilled(runs):
    root, reference = runs
    run_dir = _stopped(root, "cut_stopped")
    _cut_mid_file(run_dir, 0.5)  # reports 1-2 whole, report 3 torn
    (problem,) = _status(run_dir)["damaged"].values()
    assert problem == "result.json holds reports 1–2 intact of the 5 Ray recorded", problem
    _resume(run_dir, fault=_FAULT)
    _assert_as_never_stopped(run_dir, reference)
    assert _status(run_dir)["damaged"] == {}
    assert (run_dir / ".ablate_discarded" / _trial(run_dir).name).is_dir(), "set aside, not deleted"


def test_a_result_log_cut_in_a_finished_trial_is_flagged_and_the_trial_reopened(runs):
    root, reference = runs
    run_dir = root / "cut_finished"
    shutil.copytree(root / "clean", run_dir)
    _cut_mid_file(run_dir, 0.6)
    info = _status(run_dir)
    assert info["counts"]["finished"] == 1
    (problem,) = info["damaged"].values()
    assert problem.startswith("result.json holds reports 1–4 intact of the 8 Ray recorded"), problem
    outcome = _resume(run_dir)
    assert [t.status for t in outcome.trials] == ["TERMINATED"]
    _assert_as_never_stopped(run_dir, reference)
    info = _status(run_dir)
    assert info["damaged"] == {} and info["counts"]["finished"] == 1


def test_intact_rows_and_log_problem():
    rows = [{"training_iteration": i, "step": 5 * i} for i in (1, 2, 3)]
    assert intact_rows(rows) == 3 and log_problem(rows, 3) is None
    assert log_problem(rows, 5) == "result.json holds reports 1–3 intact of the 5 Ray recorded"
    gap = [rows[0], rows[2]]
    assert intact_rows(gap) == 1 and log_problem(gap, 3) == "result.json holds reports 1–1 intact of the 3 Ray recorded"
    repeated_step = [*rows, {"training_iteration": 4, "step": 15}]  # a replay numbered after the checkpoint Ray had
    assert intact_rows(repeated_step) == 3
    assert log_problem(repeated_step, 4) is not None and log_problem(repeated_step, 3) is not None
    assert intact_rows([]) == 0 and log_problem([], None) is None
