"""Reports (``ablate.reports.report``, `ablate report`): every grid's report from a real smoke run, export round
trips, refusals, a bad dashboard spec at the CLI and `ablate report --watch`. Each panel's data is tested in
test_panels.py, the dashboard specs in test_dashboard_specs.py."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import runs_root, smoke_run
from test_panels import COLUMNS

from ablate import cli
from ablate.analysis.results import load_results
from ablate.reports.report import (
    build_panels,
    load_dashboard,
    load_run,
    study_views,
    watch_report,
    write_report,
)
from ablate.service.records.rundir import DRIVER_LOCK, RUN_MARKER, RunError
from ablate.service.records.store.flock import PidLock
from ablate.service.specs.grids import known_grids, load_grid


@pytest.fixture(scope="module")
def bvd(ray_session, tmp_path_factory):
    """batch_vs_dim at smoke scale: 2 batch sizes × 2 latent dims, one seed, 2 reports per trial."""
    return load_run(smoke_run("batch_vs_dim", runs_root(tmp_path_factory)))


def test_run_with_report_flag_wrote_the_report(bvd):
    html = (Path(bvd.run_dir) / "report.html").read_text()
    assert "ablate report" in html and html.count("Paper figure:") == len(load_dashboard("batch_vs_dim").panels)


# ---------------------------------------------------------------------------------------- every grid
@pytest.mark.parametrize("name", sorted(known_grids()))
def test_report_renders(name, ray_session, tmp_path_factory, tmp_path):
    run_dir = smoke_run(name, runs_root(tmp_path_factory))
    run = load_run(run_dir)
    for axis in run.ctx.axes:  # an axis is the trial's setting, never a metric reported under the same name
        assert (run.df.groupby("trial_id")[axis].nunique(dropna=False) == 1).all(), axis
    dash = load_dashboard(name)
    panels = build_panels(run)
    assert len(panels) == len(dash.panels)
    for p in panels:
        assert list(p.data.columns) == COLUMNS[p.spec.kind], p.spec.kind
        assert not p.data.empty, f"{name}: panel {p.spec.kind} ({p.spec.title}) has no data at smoke scale"
    out = Path(write_report(run, tmp_path / "report.html"))
    page = out.read_text()
    views = study_views(run)  # Optuna's views of an Optuna grid's study follow the panels
    assert bool(views) == (load_grid(name, "smoke").search == "optuna")
    for view in views:
        assert f'data-kind="{view.name}"' in page and (view.figure is not None or view.note)
    assert page.count("Plotly.newPlot(") == len(dash.panels) + sum(v.figure is not None for v in views)
    assert len(re.findall(r"plotly\.js v\d", page)) == 1, "plotly.js embedded once, inline"
    assert not re.search(r"<script[^>]*\ssrc=", page), "no external scripts: the report works offline"
    assert page.count("Paper figure:") == len(dash.panels)
    for spec in dash.panels:
        assert f"Paper figure: {html.escape(spec.figure)}" in page
    grid = load_grid(name, "smoke")
    n_trials = json.loads((run_dir / RUN_MARKER).read_text())["n_trials"]
    if grid.search == "grid":  # an Optuna grid's ASHA may stop trials early
        assert run.df["trial_id"].nunique() == grid.n_trials == n_trials
        assert page.count('<td class="TERMINATED">TERMINATED</td>') == n_trials


# ---------------------------------------------------------------------------------------- trials that did not finish
def test_report_shows_final_values_of_finished_trials_and_names_the_others(tmp_path, capsys):
    """issue 36: the grid-point table pooled an interrupted trial's last step with finished trials' final values.
    It holds the finished trials only; a note under it names the others with why, each final-value panel says it
    shows finished trials only, and a curve marks where an errored or interrupted trial stopped."""
    from unfinished_runs import ERRORED, INTERRUPTED, unfinished_run

    run_dir = unfinished_run(tmp_path / "run")
    assert cli.main(["report", str(run_dir), "--out", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text()
    points = page[page.index("grid points: final R²") : page.index("</details>", page.index("grid points: final R²"))]
    assert "of the trials that finished" in points
    assert '<td>aninfonce</td><td class="num">2</td><td class="num">0.92</td>' in points  # not 0.68 over 3
    assert '<td>ensemble</td><td class="num">1</td><td class="num">0.98</td><td>n=1: too few seeds</td>' in points
    (note,) = re.findall(r"<p class='warn' id='left-out'>([^<]*)</p>", page)
    note = html.unescape(note)
    assert note.startswith("left out: 2 trial(s) that did not finish (a last report before the end is not a final")
    assert f"{INTERRUPTED} (interrupted at step 10)" in note and f"{ERRORED} (errored at step 20)" in note
    # `ablate report` prints the page's line, word for word, under the report's path
    assert capsys.readouterr().out.splitlines() == [f"report: {tmp_path / 'report.html'}", note]
    # the trials' table keeps every trial, its status and how far it got
    assert '<td class="ERROR">ERROR</td>' in page and '<td class="INTERRUPTED">INTERRUPTED</td>' in page
    assert "<th>R² (last report)</th>" in page and "<td>10 / 20</td>" in page
    sections = {
        m.group(1): m.group(2)
        for m in re.finditer(r'<section class="panel" data-kind="([^"]+)">(.*?)</section>', page, re.S)
    }
    assert "final values of the trials that finished only (2 trial(s) did not finish" in sections["ensemble_bars"]
    for kind in ("r2_curves", "loss_vs_floor"):
        assert "✕ marks where one stopped before its end (2 trial(s) did not finish" in sections[kind]
        assert '"legendgroup":"ended"' in sections[kind] and "did not finish: its last report" in sections[kind]


def test_a_report_of_finished_trials_says_nothing_of_left_out_trials(tmp_path, capsys):
    import shutil

    from unfinished_runs import FINISHED, LEFT_OUT, unfinished_run

    from ablate.service.records.rundir import TRIAL_PREFIX

    run_dir = unfinished_run(tmp_path / "run")
    for trial in LEFT_OUT:  # the two that did not finish, gone
        shutil.rmtree(run_dir / f"{TRIAL_PREFIX}{trial}")
    assert cli.main(["report", str(run_dir), "--out", str(tmp_path / "report.html")]) == 0
    assert capsys.readouterr().out.splitlines() == [f"report: {tmp_path / 'report.html'}"]
    page = (tmp_path / "report.html").read_text()
    assert "left out" not in page and "did not finish" not in page and "✕" not in page
    assert sum(len(v) for v in FINISHED.values()) == page.count('<td class="TERMINATED">TERMINATED</td>')


def test_a_live_report_shows_running_trials_latest_values_beside_the_finished_means(tmp_path):
    """While a run goes (a live driver holds its lock), `ablate report --watch` showed an empty grid-point table until
    trials finished. Each point now shows its running trials' latest R², marked `running at step N`, beside the mean
    of its finished seeds and never in it; a point none of whose trials finished has a row without a mean."""
    from unfinished_runs import ERRORED, INTERRUPTED, unfinished_run

    run_dir = unfinished_run(tmp_path / "run", ensemble_finished=False)  # aninfonce_2 and ensemble_1 at step 10
    pages = []

    def stop_watching(seconds: float) -> None:  # the reader's Ctrl-C, after the first refresh
        pages.append((tmp_path / "live.html").read_text())
        raise KeyboardInterrupt

    with PidLock(run_dir / DRIVER_LOCK), pytest.raises(KeyboardInterrupt):  # the driver, alive
        watch_report(run_dir, tmp_path / "live.html", every=5, log=lambda m: None, sleep=stop_watching)
    (page,) = pages
    start = page.index("grid points: final R²")
    points = page[start : page.index("</details>", start)]
    assert "each trial still running with its latest R², not in the mean" in points
    assert "<th>still running: latest R² (not in the mean)</th>" in points
    row = '<td>aninfonce</td><td class="num">2</td><td class="num">0.92</td><td>[0.7929, 1.0471]</td>'
    assert row + f"<td>{0.2:.4f} (running at step 10)</td>" in points  # the mean of the 2 finished seeds only
    assert (
        f'<td>ensemble</td><td class="num">0</td><td></td><td></td><td>{0.49:.4f} (running at step 10)</td>' in points
    )
    assert '<td>infonce</td><td class="num">3</td><td class="num">0.49</td>' in points
    (note,) = re.findall(r"<p class='warn' id='left-out'>([^<]*)</p>", page)
    assert f"{INTERRUPTED} (still running at step 10)" in note and f"{ERRORED} (errored at step 20)" in note

    page = Path(write_report(run_dir, tmp_path / "after.html")).read_text()  # the driver gone: nothing runs
    assert "running at step" not in page and "not in the mean" not in page


# ---------------------------------------------------------------------------------------- export, refusal, spec, watch
@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_export_round_trips(bvd, tmp_path, suffix):
    out = tmp_path / f"results{suffix}"
    assert cli.main(["export", bvd.run_dir, "--out", str(out)]) == 0
    back = pd.read_csv(out) if suffix == ".csv" else pd.read_parquet(out)
    df = load_results(bvd.run_dir)
    assert back.shape == df.shape and list(back.columns) == list(df.columns)
    assert np.allclose(back["r2"].to_numpy(), df["r2"].to_numpy(), rtol=0, atol=1e-12)
    assert list(back["trial_id"]) == list(df["trial_id"])
    hist = back["sim_pos_hist"].iloc[0]
    assert list(json.loads(hist) if suffix == ".csv" else hist) == pytest.approx(df["sim_pos_hist"].iloc[0])


def test_report_refuses_a_directory_ablate_did_not_write(tmp_path, capsys):
    (tmp_path / "trial_x").mkdir()
    with pytest.raises(RunError, match="not an ablate run directory"):
        write_report(tmp_path)
    assert cli.main(["report", str(tmp_path)]) == 2
    assert "not an ablate run directory" in capsys.readouterr().err
    assert not (tmp_path / "report.html").exists()


def test_watch_rewrites_until_every_trial_finished(bvd, tmp_path, monkeypatch):
    import ablate.reports.report as report

    states = iter([False, False, True])
    monkeypatch.setattr(report, "nothing_left_to_run", lambda run: next(states))
    out = tmp_path / "live.html"
    pages, sleeps = [], []

    def sleep(s):
        sleeps.append(s)
        pages.append(out.read_text())

    with PidLock(Path(bvd.run_dir) / DRIVER_LOCK):  # a driver writes the run
        path = watch_report(bvd.run_dir, out, every=7, log=lambda m: None, sleep=sleep)
    assert path == str(out) and sleeps == [7, 7]
    assert all('http-equiv="refresh" content="7"' in p for p in pages), "the page reloads itself while running"
    assert 'http-equiv="refresh"' not in out.read_text(), "the final page stops reloading"
    with pytest.raises(RunError, match="must be > 0"):
        watch_report(bvd.run_dir, out, every=0)


def test_watching_an_interrupted_run_ends_once_no_driver_writes_it(tmp_path, capsys):
    """`ablate report --watch` on a run no `ablate run` writes (interrupted: its trials would never change) used to
    refresh forever. It ends after two refreshes without a live driver (the first may come before the driver took
    the run), saying so and how many trials are left, exit 0; the page stops reloading."""
    from unfinished_runs import unfinished_run

    run_dir = unfinished_run(tmp_path / "run")
    out = tmp_path / "live.html"
    sleeps = []
    lines = []
    path = watch_report(run_dir, out, every=3, log=lines.append, sleep=sleeps.append)
    assert path == str(out) and sleeps == [3], "two refreshes, one wait between them"
    assert lines[-1].startswith(f"no `ablate run` is writing {run_dir} (1 trial(s) left to run)"), lines
    assert lines[-1].endswith(f"{out}; resume the run to go on") and lines[-2].startswith("left out:"), lines
    assert 'http-equiv="refresh"' not in out.read_text()
    assert cli.main(["report", str(run_dir), "--watch", "1", "--out", str(out)]) == 0
    assert "no `ablate run` is writing" in capsys.readouterr().out.splitlines()[-1]


def test_cli_maps_a_bad_spec_to_exit_2(bvd, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("grid: batch_vs_dim\npanels:\n  - {kind: histogram, figure: F}\n")
    assert cli.main(["report", bvd.run_dir, "--dashboard", str(bad), "--out", str(tmp_path / "r.html")]) == 2
    assert "unknown panel kind 'histogram'" in capsys.readouterr().err


def test_the_header_says_how_the_run_ended():
    from ablate.reports.html import run_state

    assert run_state({"TERMINATED": 4}, finished=True, live=False) == "finished"
    assert run_state({"TERMINATED": 3, "ERROR": 1}, finished=True, live=False) == "ended with 1 error(s)"
    assert run_state({"TERMINATED": 3, "INTERRUPTED": 1}, finished=False, live=False) == "stopped"
    assert run_state({"TERMINATED": 3, "RUNNING": 1}, finished=False, live=True) == "in progress"


def test_trials_whose_params_json_was_edited_are_named_by_the_page_and_by_ablate_report(tmp_path, capsys):
    """A trial whose params.json disagrees with the run's record is left out; the page named it and `ablate report`
    said nothing. Both now give the same line."""
    from unfinished_runs import finished_smoke_run

    from ablate.service.records.rundir import PARAMS_FILE, TRIAL_PREFIX

    run_dir = tmp_path / "run"
    ids = finished_smoke_run(
        run_dir,
        lambda i, p: [
            {"step": s, "training_iteration": n + 1, "r2": s / 100, "loss": 1.0} for n, s in enumerate((5, 10))
        ],
    )
    edited = ids[0]
    params = json.loads((run_dir / f"{TRIAL_PREFIX}{edited}" / PARAMS_FILE).read_text())
    (run_dir / f"{TRIAL_PREFIX}{edited}" / PARAMS_FILE).write_text(json.dumps({**params, "lr": 0.5}))
    assert cli.main(["report", str(run_dir), "--out", str(tmp_path / "r.html")]) == 0
    printed = capsys.readouterr().out.splitlines()
    (line,) = [x for x in printed if "params.json disagrees" in x]
    assert line.startswith("1 trial(s) left out") and line.endswith(edited)
    page = (tmp_path / "r.html").read_text()
    assert f"<p class='warn'>{html.escape(line)}</p>" in page
    assert "run stopped: 3 of 4 trials known (3 terminated, 1 not started)" in page, "the edited trial is not counted"
