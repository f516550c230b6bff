"""ablate's result log: one row per report, steps rising, whatever a trial replays from an older checkpoint."""

from __future__ import annotations

import json
import logging

from unfinished_runs import finished_smoke_run, hand_made_run

from ablate.service.execution.callbacks import ResultLog
from ablate.service.records.record import TrialRecord
from ablate.service.records.trial_log import append_row, cut_log, finished, intact_rows, last_step, read_rows


def _write(path, rows, torn: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + torn)


def test_a_torn_last_line_is_skipped_when_read_and_cut_before_the_next_append(tmp_path):
    path = tmp_path / "result.json"
    _write(path, [{"step": 5}, {"step": 10}], torn='{"step": 1')
    assert [r["step"] for r in read_rows(path)] == [5, 10] and last_step(path) == 10
    append_row(path, {"step": 15})
    assert path.read_text().splitlines() == ['{"step": 5}', '{"step": 10}', '{"step": 15}']
    assert last_step(tmp_path / "missing.json") is None and read_rows(tmp_path / "missing.json") == []


def test_cut_log_keeps_the_intact_rows_it_is_told_to(tmp_path):
    path = tmp_path / "result.json"
    _write(path, [{"step": 5}, {"step": 10}, {"step": 15}, {"step": 10}], torn='{"st')
    kept = cut_log(path, lambda r: r["step"] <= 10)
    assert [r["step"] for r in kept] == [5, 10] and [r["step"] for r in read_rows(path)] == [5, 10]
    assert path.read_text().endswith("\n")


def test_intact_rows_stop_at_the_first_step_that_does_not_rise():
    rows = [{"step": 5}, {"step": 10}, {"step": 10}, {"step": 20}]
    assert intact_rows(rows) == rows[:2] and intact_rows([{"step": None}]) == []


def test_finished_reads_the_stop_settings_of_now():
    rows = [{"step": 10, "r2": 0.5}, {"step": 20, "r2": 0.9}]
    assert finished(rows, 20) and not finished(rows, 40), "a higher max_steps re-opens a finished trial"
    assert finished(rows, 40, target_r2=0.85) and not finished(rows, 40, target_r2=0.95)
    assert not finished([], 10) and not finished([{"step": 5, "r2": float("nan")}], 10, 0.5)


def test_a_replayed_report_replaces_the_rows_from_its_step_and_numbers_and_times_run_on(tmp_path):
    folder = tmp_path / "trial_x"
    folder.mkdir()
    _write(
        folder / "result.json", [{"step": 5 * i, "training_iteration": i, "time_total_s": 1.0 * i} for i in (1, 2, 3)]
    )
    log = ResultLog()  # a new driver: the trial continues from its checkpoint at step 10 and reports step 15 again
    trial = TrialRecord(tmp_path, "x")
    log._append(trial, {"step": 15, "r2": 0.7, "time_total_s": 0.5, "training_iteration": 1})
    log._append(trial, {"step": 20, "r2": 0.8, "time_total_s": 1.5, "training_iteration": 2})
    rows = read_rows(folder / "result.json")
    assert [r["step"] for r in rows] == [5, 10, 15, 20]
    assert [r["training_iteration"] for r in rows] == [1, 2, 3, 4]
    assert [r["time_total_s"] for r in rows] == [1.0, 2.0, 2.5, 3.5], "time runs on from the row before"
    assert rows[2]["r2"] == 0.7 and {r["trial_id"] for r in rows[2:]} == {"x"}


def test_a_line_appended_twice_is_left_out_by_every_command_and_the_hint_says_what_resume_does(tmp_path):
    """It became status's latest report while export used another, and status's hint said --resume would run the
    reports again (it reuses the finished trial)."""
    from ablate.analysis.results import load_results
    from ablate.analysis.status import run_status
    from ablate.service.records.rundir import RESULT_FILE, TRIAL_PREFIX

    run_dir = tmp_path / "run"
    ids = finished_smoke_run(run_dir)
    log = run_dir / f"{TRIAL_PREFIX}{ids[0]}" / RESULT_FILE
    log.write_text(log.read_text() + log.read_text().splitlines()[0] + "\n")  # report 1 once more, at the end
    status = run_status(run_dir)
    (row,) = [r for r in status["trials"] if r["trial"] == ids[0]]
    export = load_results(run_dir)
    last = export[export["trial_id"] == ids[0]].iloc[-1]
    assert (row["step"], row["r2"]) == (int(last["step"]), round(float(last["r2"]), 4)) == (10, 0.1)
    assert status["counts"]["finished"] == 4
    assert status["damaged"][ids[0]] == (
        "result.json holds reports 1–2 intact, then 1 out of order, which every command leaves out; --resume reuses "
        "the trial as finished"
    )


def test_a_science_set_beside_the_old_points_is_a_column_and_a_level_compare_keeps_apart(tmp_path):
    """`--set lr=0.001` into a run makes new points beside the old ones: the export has an lr column and compare
    pairs latent dims within one lr (it counted 4 vs 4 seeds, mixing both learning rates)."""
    from ablate.analysis.compare import compare
    from ablate.analysis.results import load_results
    from ablate.service.records.plan import grid_points
    from ablate.service.specs.grids import load_grid

    points = []
    for lr in (None, 0.001):
        grid = load_grid("batch_vs_dim", "smoke")
        if lr is not None:
            grid.apply_settings({"lr": lr}, "--set", axes_win=False)
        points += grid_points(grid)
    run_dir = tmp_path / "run"
    hand_made_run(run_dir, grid, points, lambda i, p: [{"step": 10, "training_iteration": 1, "r2": 0.1 * (i + 1)}])
    df = load_results(run_dir)
    assert "lr" in df.attrs["axes"] and sorted(df["lr"].unique()) == [0.0001, 0.001]
    pairs = compare(df, by="latent_dim")
    assert len(pairs) == 4 and sorted(pairs["lr"].unique()) == [0.0001, 0.001]
    assert (pairs["n_a"] == 1).all() and (pairs["n_b"] == 1).all(), pairs


def test_a_line_that_is_json_but_not_an_object_is_skipped_as_a_torn_one_is_by_every_reader(tmp_path, caplog):
    """`null`, `[1, 2]`, `"x"` or `3` in a log gave a traceback in status, export, report, compare and --resume: the
    reader kept them as rows (issue 47). Each reader of the log says in one line what it skipped."""
    from ablate.analysis.results import load_results
    from ablate.analysis.status import run_status
    from ablate.service.records.reader import RunReader
    from ablate.service.records.rundir import RESULT_FILE, TRIAL_PREFIX

    run_dir = tmp_path / "run"
    ids = finished_smoke_run(run_dir)
    log = run_dir / f"{TRIAL_PREFIX}{ids[0]}" / RESULT_FILE
    first, second = log.read_text().splitlines()
    log.write_text("\n".join([first, "null", "[1, 2]", '"x"', "3", "{torn", second]) + "\n")
    with caplog.at_level(logging.WARNING, logger="ablate.service.records.trial_log"):
        assert RunReader(run_dir).logged_rows(log.parent.name) == [json.loads(first), json.loads(second)]
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith(f"{log}: skipped 5 line(s) that are not report rows") and "line 2: 'null'" in said, said
    assert read_rows(log) == [json.loads(first), json.loads(second)]
    (row,) = [r for r in run_status(run_dir)["trials"] if r["trial"] == ids[0]]
    export = load_results(run_dir)
    assert row["step"] == 10 and export[export["trial_id"] == ids[0]]["step"].tolist() == [5, 10]
