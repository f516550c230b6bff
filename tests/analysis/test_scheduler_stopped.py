"""Trials a search's scheduler (ASHA) stopped early (issue 36): ``ablate status`` counts them as finished, a search's
normal outcome; ``ablate compare``, the claims and the report leave them out of final values, as the one rule of
``ablate.analysis.finished`` says, and name each with why. On a search's run built by hand
(tests/unfinished_runs.py: two trials per lr_schedule reached their stop at step 10, one ASHA stopped at step 5)."""

from __future__ import annotations

import html
import re

import pandas as pd
import pytest
from unfinished_runs import (
    ERRORED,
    INTERRUPTED,
    SCHEDULER_STOPPED,
    SEARCH_LEFT_OUT,
    searched_run,
    unfinished_run,
)

from ablate import cli
from ablate.analysis import claims


@pytest.fixture
def run(tmp_path) -> str:
    return str(searched_run(tmp_path / "search"))


def test_status_counts_them_as_finished(run, capsys):
    assert cli.main(["status", run]) == 0
    out = capsys.readouterr().out
    assert "finished: 6  running: 0  interrupted: 0  errored: 0  pending: 0" in out


def test_compare_leaves_them_out_of_final_values_and_names_them(run, capsys):
    assert cli.main(["compare", run, "--by", "lr_schedule"]) == 0
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("left out:")]
    assert line.startswith("left out: 2 trial(s) that did not finish (")
    assert "c2 (stopped early by the scheduler at step 5); k2 (stopped early by the scheduler at step 5)" in line
    # at final: the two trials of each schedule that reached their stop (with c2 and k2: 0.48 vs 0.647)
    assert "2 vs 2" in out and "0.6200 vs 0.8200" in out and f"{0.62 - 0.82:+.4f}" in out

    assert cli.main(["compare", run, "--by", "lr_schedule", "--at", "5"]) == 0  # one step: every trial at it
    out = capsys.readouterr().out
    assert "left out" not in out and "3 vs 3" in out


def test_the_report_leaves_them_out_and_prints_the_pages_line(run, tmp_path, capsys):
    out_file = tmp_path / "report.html"
    assert cli.main(["report", run, "--out", str(out_file)]) == 0
    printed = [x for x in capsys.readouterr().out.splitlines() if x.startswith("left out:")]
    page = out_file.read_text()
    (note,) = re.findall(r"<p class='warn' id='left-out'>([^<]*)</p>", page)
    assert printed == [html.unescape(note)]
    for trial, why in SEARCH_LEFT_OUT.items():
        assert f"{trial} ({why})" in printed[0]
    points = page[page.index("grid points: final R²") : page.index("</details>", page.index("grid points: final R²"))]
    assert '<td>constant</td><td class="num">16</td><td class="num">2</td><td class="num">0.62</td>' in points
    assert '<td>cosine</td><td class="num">16</td><td class="num">2</td><td class="num">0.82</td>' in points
    assert page.count('<td class="TERMINATED">TERMINATED</td>') == 6  # the trials' table: each as it ended
    curves = re.search(r'<section class="panel" data-kind="r2_curves">(.*?)</section>', page, re.S).group(1)
    assert "✕ marks where one stopped before its end (2 trial(s) did not finish" in curves


def test_watching_the_report_ends_with_the_pages_line(run, tmp_path, capsys):
    assert cli.main(["report", run, "--watch", "1", "--out", str(tmp_path / "live.html")]) == 0
    lines = capsys.readouterr().out.splitlines()
    (line,) = [x for x in lines if x.startswith("left out:")]
    assert all(f"{trial} ({why})" in line for trial, why in SEARCH_LEFT_OUT.items())
    assert lines[-1] == f"no trial left to run; final report: {tmp_path / 'live.html'}"


def test_the_export_says_which_trials_the_scheduler_stopped(run, tmp_path):
    assert cli.main(["export", run, "--out", str(tmp_path / "r.csv")]) == 0
    table = pd.read_csv(tmp_path / "r.csv")
    assert list(table.columns[:3]) == ["trial_id", "status", "stopped_early"]
    stopped = table.groupby("trial_id")["stopped_early"].first()
    assert stopped.to_dict() == {t: t in SEARCH_LEFT_OUT for t in ["c0", "c1", "c2", "k0", "k1", "k2"]}


def test_claims_leave_them_out_and_name_them(tmp_path):
    (res,) = claims.evaluate_run(unfinished_run(tmp_path / "run", scheduler_stopped=True))
    assert res.left_out == {
        ERRORED: "errored at step 20",
        INTERRUPTED: "interrupted at step 10",
        SCHEDULER_STOPPED: "stopped early by the scheduler at step 10",
    }
    assert res.value.startswith("infonce 0.490 ± 0.026 (3 seeds) / ")  # its R² 0.1 at step 10 is not pooled
