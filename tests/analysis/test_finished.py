"""Which trials finished (``ablate.analysis.finished``): the one rule compare, the claims and the report share (issue
36), on a run folder built by hand with finished, errored and interrupted trials (tests/unfinished_runs.py)."""

from __future__ import annotations

import pandas as pd
from unfinished_runs import ERRORED, INTERRUPTED, LEFT_OUT, unfinished_run

from ablate.analysis.claims import evaluate_run
from ablate.analysis.compare import compare, point_table
from ablate.analysis.finished import final_values, finished_only, left_out_line, unfinished_trials
from ablate.analysis.run import load_run


def test_the_rule_reads_each_trials_status():
    df = pd.DataFrame(
        {
            "trial_id": ["done", "done", "nan", "nan", "cut", "live", "odd"],
            "status": ["TERMINATED", "TERMINATED", "ERROR", "ERROR", "INTERRUPTED", "RUNNING", "UNKNOWN"],
            "training_iteration": [1, 2, 1, 2, 1, 1, 1],
            "step": [10, 20, 10, 20, 10, 10, float("nan")],
            "r2": [0.4, 0.8, 0.3, None, 0.2, 0.1, 0.5],
        }
    )
    df.attrs["grid"] = "g"
    assert unfinished_trials(df) == {
        "nan": "errored at step 20",
        "cut": "interrupted at step 10",
        "live": "still running at step 10",
        "odd": "unknown",
    }
    kept = finished_only(df)
    assert set(kept["trial_id"]) == {"done"} and len(kept) == 2 and kept.attrs["grid"] == "g"
    assert final_values(df)[["trial_id", "r2"]].to_dict("records") == [{"trial_id": "done", "r2": 0.8}]
    no_status = df.drop(columns="status")
    assert unfinished_trials(no_status) == {} and finished_only(no_status) is no_status


def test_the_line_names_ten_and_counts_the_rest():
    many = {f"t{i}": f"errored at step {i}" for i in range(12)}
    line = left_out_line(many, "why")
    assert line.startswith("left out: 12 trial(s) that did not finish (why): t0 (errored at step 0); t1 (")
    assert "t9 (errored at step 9); … and 2 more" in line and "t10" not in line


def test_compare_claims_and_the_report_leave_out_the_same_trials_with_the_same_words(tmp_path):
    run_dir = unfinished_run(tmp_path / "run")
    df = load_run(run_dir).df
    assert unfinished_trials(df) == LEFT_OUT
    assert compare(df, "variant").attrs["left_out"] == LEFT_OUT
    assert point_table(df, ["variant"]).attrs["left_out"] == LEFT_OUT
    (claim,) = evaluate_run(run_dir)
    assert claim.left_out == LEFT_OUT
    assert not {ERRORED, INTERRUPTED} & set(final_values(df)["trial_id"])


def test_a_trial_its_scheduler_stopped_early_has_no_final_value():
    """A search's trial that ASHA stopped before its stop settings is TERMINATED (``ablate status`` counts it as
    finished) but ended at another step than the trials that reached their stop: the rule leaves it out and says so."""
    df = pd.DataFrame(
        {
            "trial_id": ["done", "done", "asha"],
            "status": ["TERMINATED", "TERMINATED", "TERMINATED"],
            "stopped_early": [False, False, True],
            "training_iteration": [1, 2, 1],
            "step": [5, 10, 5],
            "r2": [0.4, 0.8, 0.3],
        }
    )
    assert unfinished_trials(df) == {"asha": "stopped early by the scheduler at step 5"}
    assert set(finished_only(df)["trial_id"]) == {"done"}
    assert final_values(df)[["trial_id", "r2"]].to_dict("records") == [{"trial_id": "done", "r2": 0.8}]


def test_nothing_left_to_run_is_not_every_trial_finished(tmp_path):
    """``nothing_left_to_run`` (``ablate report --watch`` stops there) holds once every trial ended, errored ones
    too; the trials without a final value are still named by the finished rule."""
    import shutil

    from unfinished_runs import SEARCH_LEFT_OUT, searched_run

    from ablate.analysis.run import nothing_left_to_run
    from ablate.service.records.reader import read_marker
    from ablate.service.records.rundir import TRIAL_PREFIX, write_marker

    run_dir = unfinished_run(tmp_path / "run")
    assert not nothing_left_to_run(load_run(run_dir))  # aninfonce_2 was interrupted: a --resume would run it
    shutil.rmtree(run_dir / f"{TRIAL_PREFIX}{INTERRUPTED}")
    run = load_run(run_dir)
    assert nothing_left_to_run(run) and unfinished_trials(run.df) == {ERRORED: "errored at step 20"}
    write_marker(str(run_dir), {**read_marker(run_dir), "n_trials": len(run.statuses) + 1})  # one not started yet
    assert not nothing_left_to_run(load_run(run_dir))

    searched = load_run(searched_run(tmp_path / "search"))  # ASHA stopped two: nothing left, two without a final
    assert nothing_left_to_run(searched) and unfinished_trials(searched.df) == SEARCH_LEFT_OUT


def _compared(out: str) -> dict[str, str]:
    """``a − b`` → its printed row, of each pair of levels `ablate compare` printed."""
    return {" ".join(line.split()[:3]): line for line in out.splitlines() if line.split()[1:2] == ["−"]}


def test_compare_at_final_reads_finished_trials_only_and_says_how_many_it_left_out(tmp_path, capsys):
    """issue 36: `ablate compare` compared an errored trial's last step with finished trials' final values without
    a word. The user's steps on a run folder built by hand: ``ablate compare RUN --by variant`` leaves out the
    errored, the interrupted and the scheduler-stopped trial, prints one line that counts and names them (the
    report's words, worded for compare), and its numbers are the finished trials' alone; ``--at 10`` compares
    every trial that reported at step 10, and leaves none out."""
    from scipy import stats
    from unfinished_runs import SCHEDULER_STOPPED

    from ablate import cli
    from ablate.cli.compare import LEFT_OUT_WHY

    run_dir = str(unfinished_run(tmp_path / "run", scheduler_stopped=True))
    assert cli.main(["compare", run_dir, "--by", "variant"]) == 0
    out = capsys.readouterr().out
    left_out = {**LEFT_OUT, SCHEDULER_STOPPED: "stopped early by the scheduler at step 10"}
    assert [x for x in out.splitlines() if "left out" in x] == [
        left_out_line(dict(sorted(left_out.items())), LEFT_OUT_WHY)
    ]
    assert "left out: 3 trial(s) that did not finish (" in out
    rows = _compared(out)
    ensemble = rows["aninfonce − ensemble"]  # ensemble_0 (errored; 0.3 at step 10) is not pooled with ensemble_1
    assert "2 vs 1" in ensemble and "0.9200 vs 0.9800" in ensemble and "n=1: too few seeds to tell" in ensemble
    infonce = rows["aninfonce − infonce"]  # infonce_3 (0.1 when ASHA stopped it) and aninfonce_2 (0.2) left out
    ci = stats.ttest_ind([0.91, 0.93], [0.48, 0.52, 0.47], equal_var=False).confidence_interval()
    assert "2 vs 3" in infonce and "0.9200 vs 0.4900" in infonce and f"[{ci.low:+.4f}, {ci.high:+.4f}]" in infonce

    assert cli.main(["compare", run_dir, "--by", "variant", "--at", "10"]) == 0  # one step: every trial at it
    out = capsys.readouterr().out
    assert "left out" not in out
    at_10 = _compared(out)
    assert "3 vs 4" in at_10["aninfonce − infonce"] and "3 vs 2" in at_10["aninfonce − ensemble"]
