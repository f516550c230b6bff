"""Reports: a run directory plus a dashboard spec → one self-contained, offline HTML file.

The report reads the run through :func:`ablate.analysis.run.load_run` (JSON only) and never reaches back into
training. Each panel is computed as a DataFrame first (:func:`build_panels`), then drawn; an Optuna grid's
report adds Optuna's own views of its study (:mod:`ablate.reports.optuna_views`) when the run holds a study.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from ablate.analysis.run import Run, load_run, nothing_left_to_run
from ablate.reports.html import edited_note, left_out_note, render_html
from ablate.reports.optuna_views import OptunaView, optuna_views
from ablate.reports.panels import PanelResult, compute_panels
from ablate.reports.spec import (
    DASHBOARD_DIR,
    Dashboard,
    SpecError,
    dashboard_for,
    default_dashboard,
    known_dashboards,
    load_dashboard,
)
from ablate.service.records.reader import RunReader
from ablate.service.records.rundir import REPORT_FILE, RunError, write_text
from ablate.service.records.store import output_location

__all__ = [
    "DASHBOARD_DIR",
    "Dashboard",
    "PanelResult",
    "Run",
    "SpecError",
    "build_panels",
    "default_dashboard",
    "known_dashboards",
    "edited_note",
    "left_out_note",
    "load_dashboard",
    "load_run",
    "render_html",
    "nothing_left_to_run",
    "study_views",
    "watch_report",
    "write_report",
]


def run_dashboard(run: Run, dashboard: str | Path | Dashboard | None = None) -> Dashboard:
    """The run's dashboard: the one given, else ablate/dashboards/<grid>.yaml, else the default panels."""
    return dashboard_for(run.name, run.grid, dashboard)


def build_panels(run: Run, dashboard: str | Path | Dashboard | None = None) -> list[PanelResult]:
    """Compute every panel's DataFrame, then its figure."""
    return compute_panels(run.df, run_dashboard(run, dashboard).panels, run.ctx)


def study_views(run: Run) -> list[OptunaView]:
    """Optuna's views of the run's study (an Optuna grid on local storage), else an empty list."""
    if run.marker.get("search") != "optuna":
        return []
    return optuna_views(run.run_dir, run.name)


def default_out(run_dir: str | Path, grid: str | None = None) -> str:
    """Where a report goes unless told: RUN_DIR/report.html (``report-<grid>.html`` for one grid of a run that holds
    several); for a run on object storage (``s3://``, ``gs://``), a file of that name prefixed with the run's name
    in the current folder: the report is read where it is asked for, not written back into the store."""
    return output_location(run_dir, f"report-{grid}.html" if grid else REPORT_FILE)


def write_report(
    run: Run | str | Path,
    out: str | Path | None = None,
    dashboard: str | Path | Dashboard | None = None,
    refresh: float | None = None,
    finished: bool | None = None,
    grid: str | None = None,
) -> str:
    """Write the report of ``run`` (a :class:`Run` or a run directory) to ``out`` (default RUN_DIR/report.html).

    Local files are replaced atomically, so a browser reloading the page never sees half a file.
    """
    if not isinstance(run, Run):
        run = load_run(run, grid)
    dash = run_dashboard(run, dashboard)
    target = str(out) if out is not None else default_out(run.run_dir, grid)
    page = render_html(
        run, build_panels(run, dash), dash, refresh=refresh, finished=finished, extra_views=study_views(run)
    )
    return write_text(target, page)


def watch_report(
    run_dir: str | Path,
    out: str | Path | None = None,
    every: float = 10.0,
    dashboard: str | Path | None = None,
    log: Callable[[str], None] = print,
    sleep: Callable[[float], None] = time.sleep,
    grid: str | None = None,
) -> str:
    """Rewrite the report every ``every`` seconds until the run has no trial left to run
    (:func:`nothing_left_to_run`; the page reloads itself until then), or until no `ablate run` has been writing it
    at two refreshes in a row (an interrupted run: nothing would change). After the last write, ``log`` gets the
    report's line naming the trials left out of final values (:func:`left_out_note`), if any, then why watching
    ended."""
    if every <= 0:
        raise RunError(f"--watch {every}: the interval must be > 0 seconds")
    idle = 0  # refreshes in a row without a live driver (the first may come before `ablate run` took the run)
    while True:
        run = load_run(run_dir, grid)
        done = nothing_left_to_run(run)
        idle = 0 if RunReader(run_dir).driver_live() else idle + 1
        last = done or idle >= 2
        target = write_report(run, out, dashboard, refresh=None if last else every, finished=done)
        statuses = pd.Series(list(run.statuses.values()), dtype=object).value_counts().to_dict()
        log(
            f"{time.strftime('%H:%M:%S')} wrote {target}: {len(run.df)} reports, "
            + (", ".join(f"{n} {s.lower()}" for s, n in sorted(statuses.items())) or "no trials yet")
        )
        if last:
            for note in (edited_note(run), left_out_note(run)):
                if note:
                    log(note)
            left = sum(s not in ("TERMINATED", "ERROR") for s in run.statuses.values())
            log(
                f"no trial left to run; final report: {target}"
                if done
                else f"no `ablate run` is writing {run_dir} ({left} trial(s) left to run): the report shows it as it "
                f"stands: {target}; resume the run to go on"
            )
            return target
        sleep(every)
