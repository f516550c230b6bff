"""The report page: one self-contained HTML file (plotly.js inline, no CDN) of a run's settings, trials and panels.

It writes ``<div id="ablate-render-status" data-plots data-rendered data-errors>`` once its plots drew, so a
headless browser (tests/reports/test_browser.py) can check that every figure rendered without a JavaScript error.

Built in Python with ``html.escape`` rather than a Jinja2 template: the page is a list of sections that code
decides (panels, Optuna views, plotly fragments), and its fixed markup is about 30 lines, so a template would add
a file without removing the logic.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Sequence
from typing import Any

import pandas as pd

from ablate.analysis.compare import point_table
from ablate.analysis.finished import edited_line, left_out_line, unfinished_trials
from ablate.analysis.run import Run, generator_table, nothing_left_to_run, trial_table
from ablate.analysis.status import last_run
from ablate.reports.panels import PANELS, PanelResult
from ablate.reports.spec import Dashboard
from ablate.service.records.provenance import summary_line

__all__ = ["LEFT_OUT_WHY", "left_out_note", "render_html"]

_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 0 auto; max-width: 1400px;
       padding: 1em 2em; color: #222; }
h1 { margin-bottom: 0.1em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
.meta { color: #555; } .figure { color: #114; font-weight: 600; } .note { color: #555; font-style: italic; }
table { border-collapse: collapse; font-size: 0.88em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 0.2em 0.6em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.TERMINATED { color: #070; } .ERROR { color: #b00; font-weight: 600; } .RUNNING, .INTERRUPTED { color: #b60; }
.PENDING, .PAUSED { color: #777; } .warn { color: #b00; }
details { margin: 0.4em 0; } summary { cursor: pointer; color: #336; }
pre { background: #f7f7f7; padding: 0.6em; overflow-x: auto; font-size: 0.85em; }
"""

#: Collects JavaScript errors from the start, so the render check (and a reader) sees them.
_HEAD_JS = """
window.__ablateErrors = [];
window.addEventListener('error', function (e) { window.__ablateErrors.push(String(e.message || e)); });
window.addEventListener('unhandledrejection', function (e) {
  window.__ablateErrors.push('unhandled rejection: ' + String(e.reason)); });
"""

#: Writes <div id="ablate-render-status" data-plots=… data-rendered=… data-errors=…> once the plots drew.
_TAIL_JS = """
(function () {
  var tries = 0;
  function check() {
    var plots = document.querySelectorAll('.js-plotly-plot');
    var rendered = 0;
    plots.forEach(function (p) { if (p.querySelector('svg.main-svg')) { rendered++; } });
    if (rendered < %(expected)d && tries++ < 50) { setTimeout(check, 100); return; }
    var el = document.createElement('div');
    el.id = 'ablate-render-status';
    el.hidden = true;
    el.setAttribute('data-expected', '%(expected)d');
    el.setAttribute('data-plots', String(plots.length));
    el.setAttribute('data-rendered', String(rendered));
    el.setAttribute('data-errors', JSON.stringify(window.__ablateErrors));
    document.body.appendChild(el);
  }
  window.addEventListener('load', function () { setTimeout(check, 0); });
})();
"""


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return "<td></td>"
    if isinstance(v, float):
        return f'<td class="num">{v:.4g}</td>'
    if isinstance(v, int):
        return f'<td class="num">{v}</td>'
    return f"<td>{html.escape(str(v))}</td>"


def _html_table(df: pd.DataFrame, status_col: str | None = None, max_rows: int | None = None) -> str:
    if df.empty:
        return "<p class='meta'>(none yet)</p>"
    shown = df if max_rows is None else df.head(max_rows)
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in shown.columns)
    body = []
    for _, r in shown.iterrows():
        cells = []
        for c in shown.columns:
            v = r[c]
            if c == status_col:
                cells.append(f'<td class="{html.escape(str(v))}">{html.escape(str(v))}</td>')
            else:
                cells.append(_cell(v.item() if hasattr(v, "item") else v))
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = "" if max_rows is None or len(df) <= max_rows else f"<p class='meta'>… {len(df) - max_rows} more rows</p>"
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{more}"


def _settings_html(run: Run) -> str:
    grid, marker = run.grid, run.marker
    rows = [
        ("grid", run.name),
        ("scale", marker.get("scale")),
        ("run directory", run.run_dir),
        ("created", marker.get("created")),
        ("ablate version", marker.get("ablate_version")),
    ]
    for record in run.provenance:  # what produced the run: its start and each resume
        rows.append((f"{record.get('event', 'start')} {record.get('time', '')}", summary_line(record)))
    parts = []
    if grid is not None:
        rows += [
            ("figure", grid.figure),
            ("search", grid.search),
            ("trials", grid.n_trials),
            ("seeds", ", ".join(map(str, grid.seeds))),
            ("stop", json.dumps(grid.stop.settings())),
        ]
        if grid.axes:
            rows += [
                (f"axis {k}", ", ".join(json.dumps(v) if not isinstance(v, str) else v for v in vals))
                for k, vals in grid.axes.items()
            ]
        if grid.variants:
            rows.append(("variants", "; ".join(json.dumps(v.param()) for v in grid.variants)))
        if grid.optuna:
            rows.append(("optuna", json.dumps(grid.optuna_dict())))
        if grid.paper_values:
            rows.append(("paper values", json.dumps(grid.paper_values)))
    table = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    parts.append(f"<table>{table}</table>")
    if grid is not None:
        if grid.description:
            parts.append(f"<p>{html.escape(grid.description.strip())}</p>")
        base = "".join(
            f"<tr><th>{html.escape(k)}</th><td>{html.escape(json.dumps(v))}</td></tr>"
            for k, v in sorted(grid.base.items())
        )
        parts.append(
            f"<details open><summary>base settings (every trial; RunConfig defaults otherwise)</summary>"
            f"<table>{base}</table></details>"
        )
        if grid.chosen:
            chosen = pd.DataFrame(
                [
                    {
                        "key": c.key,
                        "value": json.dumps(c.value) if "value" in c.model_fields_set else "",
                        "why": c.why,
                    }
                    for c in grid.chosen
                ]
            )
            parts.append(
                "<details><summary>values the papers' text does not give (chosen)</summary>"
                f"{_html_table(chosen)}</details>"
            )
    gen = generator_table(run.df)
    if not gen.empty:
        parts.append(
            "<details open><summary>generator g: how hard the inversion is (condition numbers per layer, the "
            "threshold each layer had to beat, and the linear R² of z from g(z); 1 would be a linear g)</summary>"
            f"{_html_table(gen)}</details>"
        )
    if marker.get("grid_yaml"):
        parts.append(
            f"<details><summary>grid YAML as run</summary><pre>{html.escape(marker['grid_yaml'])}</pre></details>"
        )
    return "\n".join(parts)


#: Why the trials that did not finish are left out, as the report says it.
LEFT_OUT_WHY = (
    "a last report before the end is not a final value: the grid points and the final-value panels show the "
    "finished trials only; curves draw these up to their last report, ✕ where one stopped before its end"
)


def run_state(counts: dict[str, int], finished: bool, live: bool) -> str:
    """How the page's header names the run's state from its trials' status counts: ``finished`` (nothing left to
    run, none errored), ``ended with N error(s)``, ``in progress`` (an `ablate run` writes it) or ``stopped`` (trials
    are left and no `ablate run` writes it: ``--resume`` goes on)."""
    if finished:
        errors = counts.get("ERROR", 0)
        return f"ended with {errors} error(s)" if errors else "finished"
    return "in progress" if live else "stopped"


def edited_note(run: Run) -> str:
    """The report's line naming the trials left out because their params.json disagrees with the run's record
    (the same words on the page, from `ablate report` and from `ablate compare`,
    :func:`ablate.analysis.finished.edited_line`); "" when there are none."""
    return edited_line(run.left_out)


def left_out_note(run: Run) -> str:
    """The report's line naming the trials it leaves out of final values, each with why (the same words on the page
    and from `ablate report`, :func:`ablate.analysis.finished.left_out_line`); "" when every trial finished."""
    left_out = unfinished_trials(run.df)
    return left_out_line(left_out, LEFT_OUT_WHY) if left_out else ""


def _points_html(run: Run) -> str:
    """The trials grouped by grid point: final R² of the finished seeds as mean with its 95 % t interval and, while
    trials run, each running trial's latest R² marked ``running at step N`` beside it (no table if no point has two
    finished seeds and none runs), and under it the trials left out because they did not finish, each with why."""
    points = point_table(run.df, run.ctx.axes)
    note = left_out_note(run)
    live = "running" in points.columns
    parts = []
    if not points.empty and (points["seeds"].max() >= 2 or live):
        running = "; beside them, each trial still running with its latest R², not in the mean" if live else ""
        names = {"mean": "final R² (mean)", "ci": "95 % CI", "running": "still running: latest R² (not in the mean)"}
        parts.append(
            "<details open><summary>grid points: final R², mean over seeds with its 95 % confidence interval "
            "(Student's t; `ablate compare RUN --by AXIS` tests differences), of the trials that finished"
            f"{running}</summary>{_html_table(points.rename(columns=names))}</details>"
        )
    if note:
        parts.append(f"<p class='warn' id='left-out'>{html.escape(note)}</p>")
    return "\n".join(parts)


def _unfinished_note(finals: bool, data: pd.DataFrame, n_unfinished: int) -> str:
    """Under a panel's heading, while some trials did not finish (they are named under the trials' table): a
    final-value panel shows the finished ones only; a curve marks where one stopped before its end (errored,
    interrupted, or stopped early by its scheduler)."""
    if not n_unfinished:
        return ""
    if finals:
        what = "final values of the trials that finished only"
    elif "ended" in data.columns and (data["ended"] != "").any():
        what = "every trial is drawn up to its last report; ✕ marks where one stopped before its end"
    else:
        return ""
    return (
        f"<p class='warn'>{html.escape(what)} ({n_unfinished} trial(s) did not finish: "
        "<a href='#left-out'>which, and why</a>)</p>"
    )


def _where_text(v: Any) -> str:
    """A ``where`` value as a reader would say it."""
    if isinstance(v, list):
        return " or ".join(_where_text(x) for x in v)
    if v is None:
        return "null"
    return {"max": "its largest value", "min": "its smallest value"}.get(v, str(v)) if isinstance(v, str) else str(v)


def _section(
    css: str, kind: str, title: str, head: list[str], figure: Any, div_id: str, with_plotlyjs: bool, data: pd.DataFrame
) -> list[str]:
    """One panel's HTML: heading, its description lines, the figure (plotly.js inline once), and its data."""
    import plotly.io as pio

    fig_html = ""
    if figure is not None:
        fig_html = pio.to_html(
            figure,
            full_html=False,
            include_plotlyjs=with_plotlyjs,
            div_id=div_id,
            config={"displaylogo": False, "responsive": True},
        )
    return [
        f'<section class="{css}" data-kind="{html.escape(kind)}">',
        f"<h2>{html.escape(title)}</h2>",
        *head,
        fig_html,
        f"<details><summary>data ({len(data)} rows)</summary>{_html_table(data, max_rows=300)}</details>",
        "</section>",
    ]


def render_html(
    run: Run,
    panels: list[PanelResult],
    dashboard: Dashboard,
    refresh: float | None = None,
    finished: bool | None = None,
    extra_views: Sequence[Any] = (),
) -> str:
    """The report page: title, settings, trials, and each panel with its paper figure (plotly.js inline).

    ``extra_views`` (e.g. Optuna's views of the study) follow the panels: each has ``name``, ``title``,
    ``describe``, ``data``, ``figure`` (None when skipped) and ``note``.

    ``refresh`` (seconds) makes the page reload itself (``--watch``); ``finished`` (no trial left to run)
    defaults to :func:`ablate.analysis.run.nothing_left_to_run`.
    """

    table = trial_table(run)
    counts = table["status"].value_counts().to_dict() if not table.empty else {}
    expected = int(run.marker.get("n_trials") or len(table))
    not_started = max(expected - len(table), 0)
    finished = nothing_left_to_run(run) if finished is None else finished
    state = run_state(counts, finished, run.live)
    count_text = ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items()))
    if not_started:
        count_text += f", {not_started} not started"
    title = dashboard.title or run.name
    head_refresh = f'<meta http-equiv="refresh" content="{int(max(refresh, 1))}">' if refresh else ""
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        head_refresh,
        f"<title>ablate report: {html.escape(run.name)} ({html.escape(str(run.marker.get('scale')))})</title>",
        f"<style>{_CSS}</style><script>{_HEAD_JS}</script></head><body>",
        f"<h1>ablate report: {html.escape(title)}</h1>",
        f"<p class='meta'>grid <b>{html.escape(run.name)}</b> at scale <b>{html.escape(str(run.marker.get('scale')))}"
        f"</b> · run {state}: {len(table)} of {expected} trials known ({html.escape(count_text or 'none yet')}) · "
        f"{len(run.df)} reports · "
        + (f"last run: {html.escape(last)} · " if (last := last_run(run.marker)) else "")
        + f"written {time.strftime('%Y-%m-%d %H:%M:%S')}"
        + (f" · refreshes every {refresh:g} s" if refresh else "")
        + "</p>",
    ]
    if note := edited_note(run):
        out.append(f"<p class='warn'>{html.escape(note)}</p>")
    if dashboard.description:
        out.append(f"<p>{html.escape(dashboard.description.strip())}</p>")
    out += ["<h2>Settings</h2>", _settings_html(run), "<h2>Trials</h2>", _html_table(table, status_col="status")]
    out.append(_points_html(run))
    n_unfinished = len(unfinished_trials(run.df))
    for i, panel in enumerate(panels):
        spec = panel.spec
        kind = PANELS[spec.kind]
        where = "; ".join(f"{k} = {_where_text(v)}" for k, v in spec.where.items())
        head = [
            f"<p class='figure'>Paper figure: {html.escape(spec.figure)}</p>",
            f"<p class='meta'>{html.escape(kind.describe)}</p>",
            f"<p class='note'>{html.escape(spec.note)}</p>" if spec.note else "",
            f"<p class='meta'>shown: {html.escape(where)}</p>" if where else "",
            _unfinished_note(kind.finals, panel.data, n_unfinished),
        ]
        title = f"{i + 1}. {spec.title or kind.title}"
        out += _section("panel", spec.kind, title, head, panel.figure, f"panel-{i}", i == 0, panel.data)
    figures = len(panels)
    for view in extra_views:
        head = [
            f"<p class='meta'>{html.escape(view.describe)}</p>" if view.describe else "",
            f"<p class='note'>{html.escape(view.note)}</p>" if view.note else "",
        ]
        out += _section(
            "panel optuna-view", view.name, view.title, head, view.figure, f"view-{view.name}", figures == 0, view.data
        )
        figures += view.figure is not None
    out.append(f"<script>{_TAIL_JS % {'expected': figures}}</script>")
    out.append("</body></html>")
    return "\n".join(s for s in out if s)
