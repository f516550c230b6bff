"""Each report once, whatever checkpoint a trial continues from: real Ray, real files.

A trial that stopped part-way (an injected fault with no retries leaves it ERROR, which --resume continues
from its own checkpoint) or a finished one is damaged on disk: garbage in its latest checkpoint, in both, the
latest checkpoint folder deleted, its result.json cut mid-file. After --resume its export must equal, row for
row, that of a run never stopped (timing columns aside): no report missing, none repeated, the same numbers.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ablate.service.execution.runner import run_grid
from ablate.service.records.trial import CHECKPOINT_FILE
from ablate.service.records.trial_log import intact_rows
from ablate.service.specs.grids import load_grid
from tests.service.execution.faulty import faulty

REPORT_EVERY, MAX_STEPS = 5, 40  # 8 reports
#: The faulty trial stops during report 6: checkpoints after reports 4 and 5 (steps 20, 25); its results reach
#: Ray one report each (``results_every=0``), so each report has its checkpoint.
_FAULT_STEP = 28
#: Columns that differ between two runs of the same point by their timing or their bookkeeping only.
_TIMING = {"trial_id", "status", "time_total_s", "prefetch"}


def _grid():
    grid = load_grid("batch_vs_dim", "smoke")
    grid.axes = {"batch_size": [32], "latent_dim": [3]}
    grid.stop.max_steps = MAX_STEPS
    return grid


def _export(run_dir: Path):
    from ablate.analysis.results import load_results

    df = load_results(run_dir)
    return df[[c for c in df.columns if c not in _TIMING]].reset_index(drop=True)


def _trial(run_dir: Path) -> Path:
    (trial,) = [p for p in run_dir.glob("trial_*") if p.is_dir()]
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
    """The point stopped by a fault during report 6 (ERROR, resumable; the fault fires once in all)."""
    trainable = faulty(root / f"{name}-faults", at_step=_FAULT_STEP)
    stopped = run_grid(
        _grid(), storage=str(root), name=name, verbose=0, max_failures=0, trainable=trainable, results_every=0
    )
    assert [t.status for t in stopped.trials] == ["ERROR"]
    assert [p.name for p in _checkpoints(stopped.run_dir)] == ["checkpoint_000000020", "checkpoint_000000025"]
    return stopped.run_dir


def _resume(run_dir: Path):
    return run_grid(_grid(), storage=str(run_dir.parent), name=run_dir.name, resume=True, verbose=0, results_every=0)


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
    _resume(run_dir)
    _assert_as_never_stopped(run_dir, reference)  # report 5 (step 25) once, numbered 5


def test_both_checkpoints_rejected_restarts_at_step_0_and_rewrites_every_report_once(runs):
    root, reference = runs
    run_dir = _stopped(root, "garbage_both")
    for ckpt in _checkpoints(run_dir):
        (ckpt / CHECKPOINT_FILE).write_bytes(b"garbage")
    _resume(run_dir)
    _assert_as_never_stopped(run_dir, reference)


def test_a_deleted_latest_checkpoint_folder_resumes_from_the_newest_that_exists(runs, caplog):
    root, reference = runs
    run_dir = _stopped(root, "deleted_latest")
    shutil.rmtree(_checkpoints(run_dir)[-1])
    outcome = _resume(run_dir)
    assert not outcome.failed, [t.error for t in outcome.failed]
    assert outcome.plan.continued == [t.trial_id for t in outcome.trials]
    _assert_as_never_stopped(run_dir, reference)
    assert [p.name for p in _checkpoints(run_dir)] == ["checkpoint_000000035", "checkpoint_000000040"]


def _cut_mid_file(run_dir: Path, fraction: float) -> None:
    log = _trial(run_dir) / "result.json"
    data = log.read_bytes()
    log.write_bytes(data[: int(len(data) * fraction)])


def test_a_result_log_cut_mid_file_in_a_stopped_trial_is_refilled(runs):
    root, reference = runs
    run_dir = _stopped(root, "cut_stopped")
    _cut_mid_file(run_dir, 0.5)  # reports 1-2 whole, report 3 torn; its checkpoints (20, 25) are ahead of the log
    info = _status(run_dir)
    assert info["counts"]["errored"] == 1 and info["damaged"] == {}
    outcome = _resume(run_dir)  # no checkpoint at step 10: the trial starts again from step 0
    assert [t.status for t in outcome.trials] == ["TERMINATED"]
    _assert_as_never_stopped(run_dir, reference)
    assert _status(run_dir)["damaged"] == {}


def test_a_result_log_cut_in_a_finished_trial_reopens_it(runs):
    root, reference = runs
    run_dir = root / "cut_finished"
    shutil.copytree(root / "clean", run_dir)
    _cut_mid_file(run_dir, 0.6)
    info = _status(run_dir)
    assert info["counts"]["interrupted"] == 1, info["counts"]  # its log stops short of max_steps
    outcome = _resume(run_dir)
    assert [t.status for t in outcome.trials] == ["TERMINATED"] and len(outcome.plan.continued) == 1
    _assert_as_never_stopped(run_dir, reference)
    info = _status(run_dir)
    assert info["damaged"] == {} and info["counts"]["finished"] == 1


def test_a_finished_run_run_again_reuses_every_trial_without_starting_ray(runs):
    root, reference = runs
    outcome = _resume(root / "clean")
    assert outcome.plan.reused == [t.trial_id for t in outcome.trials] and not outcome.plan.units
    _assert_as_never_stopped(root / "clean", reference)


def test_intact_rows():
    rows = [{"training_iteration": i, "step": 5 * i} for i in (1, 2, 3)]
    assert intact_rows(rows) == rows
    gap = [rows[0], rows[2]]
    assert intact_rows(gap) == gap, "a skipped report period is still rising steps"
    repeated_step = [*rows, {"training_iteration": 4, "step": 15}]
    assert intact_rows(repeated_step) == rows
    assert intact_rows([{"step": "x"}, *rows]) == [] and intact_rows([]) == []
