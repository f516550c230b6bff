"""Reports: a run directory plus a dashboard spec → one self-contained, offline HTML file.

``dashboards/<grid>.yaml`` says which panels a grid's report holds::

    grid: batch_vs_dim                 # the grid this dashboard belongs to (= the file name)
    title: Batch size × latent dimension
    description: optional text shown under the title
    panels:
      - kind: final_heatmap            # one of ablate.reports.panels.PANELS
        figure: Rusak et al. 2024, Fig. 4A   # the paper figure the panel corresponds to (required)
        title: optional heading
        note: optional text under the heading
        where: {batch_size: max}       # optional filter: axis → value, list of values, min or max
        x: batch_size                  # the kind's own options (see ablate.reports.panels)
        y: latent_dim

A spec is validated like a grid: an unknown kind, key or axis is an error naming the file and the key.
The report reads the run through :func:`ablate.analysis.results.load_results` (JSON only) and never reaches back
into training. Each panel is computed as a DataFrame first (:func:`build_panels`), then drawn.
"""

from __future__ import annotations

import html
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ablate.analysis.results import axis_value as _axis_value
from ablate.analysis.results import load_results
from ablate.config import ConfigError, RunConfig, read_yaml_mapping
from ablate.reports.panels import PANELS, PanelSpec, RunContext, final_rows, panel_data, panel_figure
from ablate.rundir import RunError, RunReader
from ablate.service.grids import Grid, GridError, config_from_params, grid_from_text, load_grid
from ablate.shipped import DASHBOARDS, shipped_dir, shipped_files

__all__ = [
    "DASHBOARD_DIR",
    "Dashboard",
    "PanelResult",
    "Run",
    "SpecError",
    "build_panels",
    "default_dashboard",
    "known_dashboards",
    "load_dashboard",
    "load_run",
    "render_html",
    "run_finished",
    "watch_report",
    "write_report",
]

#: The dashboard specs shipped with ablate, one per grid.
DASHBOARD_DIR = shipped_dir(DASHBOARDS)
_TOP_KEYS = {"grid", "title", "description", "panels"}
_PANEL_KEYS = {"kind", "figure", "title", "note", "where"}
_FINISHED = {"TERMINATED", "ERROR"}


class SpecError(GridError):
    """A dashboard spec is invalid; the message names the file, the key and what is allowed."""


# ------------------------------------------------------------------------------------------ dashboard specs
@dataclass
class Dashboard:
    """A validated dashboard spec: which panels a grid's report holds."""

    grid: str
    path: Path | None
    title: str = ""
    description: str = ""
    panels: list[PanelSpec] = field(default_factory=list)


def known_dashboards() -> dict[str, Path]:
    """Grid name → dashboard spec for every spec shipped in dashboards/."""
    return shipped_files(DASHBOARDS)


def _type_ok(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in types
    if isinstance(value, int) and float in types:
        return True
    return isinstance(value, types)


def _type_names(types: tuple[type, ...]) -> str:
    names = {str: "a string", list: "a list", int: "an integer", float: "a number", bool: "true/false"}
    return " or ".join(names.get(t, t.__name__) for t in types)


def _check_panel(path: Path | str, i: int, raw: Any, axes: list[str] | None) -> PanelSpec:
    where = f"panels[{i}]"
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: {where}: expected a mapping with kind and figure, got {raw!r}")
    kind = raw.get("kind")
    if kind not in PANELS:
        raise SpecError(f"{path}: {where}.kind: unknown panel kind {kind!r}; allowed: {', '.join(PANELS)}")
    where = f"{where} ({kind})"
    options = PANELS[kind].options
    for key in raw:
        if key not in _PANEL_KEYS and key not in options:
            allowed = sorted(_PANEL_KEYS | set(options))
            raise SpecError(f"{path}: {where}.{key}: unknown key for {kind}; allowed: {', '.join(allowed)}")
    figure = raw.get("figure")
    if not isinstance(figure, str) or not figure.strip():
        raise SpecError(f"{path}: {where}.figure: required: the paper figure this panel corresponds to")
    for key in ("title", "note"):
        if key in raw and not isinstance(raw[key], str):
            raise SpecError(f"{path}: {where}.{key}: expected a string, got {raw[key]!r}")
    filt = raw.get("where") or {}
    if not isinstance(filt, dict):
        raise SpecError(f"{path}: {where}.where: expected a mapping axis → value, list of values, min or max")
    if axes is not None:
        for axis in filt:
            if axis not in axes:
                raise SpecError(f"{path}: {where}.where.{axis}: not an axis of the grid; axes: {', '.join(axes)}")
    values: dict[str, Any] = {}
    for key, opt in options.items():
        if key not in raw:
            if opt.required:
                raise SpecError(f"{path}: {where}.{key}: required ({opt.help})")
            continue
        value = raw[key]
        if value is None:
            values[key] = None
            continue
        if not _type_ok(value, opt.types):
            raise SpecError(f"{path}: {where}.{key}: expected {_type_names(opt.types)} ({opt.help}), got {value!r}")
        if opt.choices is not None and value not in opt.choices:
            raise SpecError(f"{path}: {where}.{key}: {value!r} is not allowed; allowed: "
                            f"{', '.join(map(str, opt.choices))}")
        if key == "targets":
            items = value if isinstance(value, list) else [value]
            if not items or not all(_type_ok(t, (float,)) and 0 < t <= 1 for t in items):
                raise SpecError(f"{path}: {where}.targets: expected numbers in (0, 1], got {value!r}")
        if opt.axis or (key == "x" and kind == "iterations_to_target"):
            names = value if isinstance(value, list) else [value]
            allowed = list(axes or []) + (["target"] if kind == "iterations_to_target" and key == "x" else [])
            for name in names:
                if not isinstance(name, str):
                    raise SpecError(f"{path}: {where}.{key}: expected axis names, got {value!r}")
                if axes is not None and name not in allowed:
                    raise SpecError(f"{path}: {where}.{key}: {name!r} is not an axis of the grid; "
                                    f"allowed: {', '.join(allowed) or '(the grid has no axes)'}")
        values[key] = value
    if kind == "final_heatmap" and values.get("x") == values.get("y"):
        raise SpecError(f"{path}: {where}.y: must differ from x ({values.get('x')!r})")
    return PanelSpec(kind=kind, figure=figure.strip(), title=str(raw.get("title", "")), note=str(raw.get("note", "")),
                     where=dict(filt), options=values)


def load_dashboard(name_or_path: str | Path, grid: Grid | None = None) -> Dashboard:
    """Load and validate a dashboard spec (a grid name or a path); with ``grid``, check axis names too."""
    p = Path(name_or_path)
    if p.suffix not in (".yaml", ".yml"):
        specs = known_dashboards()
        if str(name_or_path) not in specs:
            raise SpecError(f"no dashboard spec for grid {name_or_path!r}; known: {', '.join(specs)}")
        p = specs[str(name_or_path)]
    data = read_yaml_mapping(p, SpecError, _TOP_KEYS)
    name = data.get("grid")
    if not isinstance(name, str) or not name:
        raise SpecError(f"{p}: grid: required: the name of the grid this dashboard belongs to")
    if grid is not None and name != grid.name:
        raise SpecError(f"{p}: grid: the spec is for grid {name!r}, not {grid.name!r}")
    panels = data.get("panels")
    if not isinstance(panels, list) or not panels:
        raise SpecError(f"{p}: panels: required: a non-empty list of panels (kinds: {', '.join(PANELS)})")
    axes = [a for a in grid.axis_names() if a != "seed"] if grid is not None else None
    specs = [_check_panel(p, i, raw, axes) for i, raw in enumerate(panels)]
    return Dashboard(grid=name, path=p, title=str(data.get("title", "")), description=str(data.get("description", "")),
                     panels=specs)


def default_dashboard(grid_name: str) -> Dashboard:
    """The panels every grid can show, for a grid without its own spec."""
    specs = [
        PanelSpec("r2_curves", "(no paper figure: generic view)"),
        PanelSpec("loss_vs_floor", "(no paper figure: generic view)"),
        PanelSpec("similarity_histograms", "(no paper figure: generic view)"),
    ]
    return Dashboard(grid=grid_name, path=None, title=f"{grid_name} (default panels)", panels=specs)


# ------------------------------------------------------------------------------------------ the run
@dataclass
class Run:
    """Everything a report shows of one run directory."""

    run_dir: str
    df: pd.DataFrame
    marker: dict[str, Any]
    grid: Grid | None
    params: dict[str, dict[str, Any]]
    statuses: dict[str, str]
    ctx: RunContext

    @property
    def name(self) -> str:
        """The grid's name (from the run marker)."""
        return str(self.marker.get("grid", "?"))


def _grid_from_marker(marker: dict[str, Any]) -> Grid | None:
    """The run's grid at its scale, from the YAML text the run stored (so later edits do not matter)."""
    name, scale = marker.get("grid"), marker.get("scale", "laptop")
    text = marker.get("grid_yaml")
    try:
        if text:
            return grid_from_text(text, scale, marker.get("grid_file") or f"{name}.yaml")
        if marker.get("grid_file") and Path(marker["grid_file"]).is_file():
            return load_grid(marker["grid_file"], scale)
    except (GridError, ConfigError):
        return None
    return None


def load_run(run_dir: str | Path) -> Run:
    """Read a run directory (finished, running or interrupted); refuses a directory ablate did not write."""
    df = load_results(run_dir)
    marker = dict(df.attrs.get("marker") or {})
    reader = RunReader(run_dir)
    params: dict[str, dict[str, Any]] = {}
    for name in reader.list_dirs("trial_"):
        text = reader.read_text(name, "params.json")
        if text:
            try:
                params[name.removeprefix("trial_")] = json.loads(text)
            except json.JSONDecodeError:
                continue
    configs: dict[str, RunConfig] = {}
    for trial_id, p in params.items():
        try:
            configs[trial_id] = config_from_params(p, f"trial {trial_id}")
        except ConfigError:
            continue
    axes = list(df.attrs.get("axes") or [])
    # An axis is the trial's setting: a reported metric of the same name (e.g. the scheduled `lr`) must not
    # replace it (ablate.analysis.results lets the reported value win).
    for axis in axes:
        if axis in df.columns and params:
            setting = df["trial_id"].map(lambda t, a=axis: _axis_value(params[t].get(a)) if t in params else None)
            known = df["trial_id"].isin(list(params))
            if known.any():
                df[axis] = setting.where(known, df[axis])
    grid = _grid_from_marker(marker)
    ctx = RunContext(grid=str(marker.get("grid", "")), axes=axes, configs=configs,
                     paper_values=dict(grid.paper_values) if grid else {})
    return Run(run_dir=str(run_dir), df=df, marker=marker, grid=grid, params=params, statuses=reader.statuses(),
               ctx=ctx)


def run_finished(run: Run) -> bool:
    """True once every trial of the run has finished (or errored)."""
    expected = int(run.marker.get("n_trials") or 0)
    if not run.statuses or len(run.statuses) < expected:
        return False
    return all(s in _FINISHED for s in run.statuses.values())


def trial_table(run: Run) -> pd.DataFrame:
    """One row per trial: its axes, seed, status, steps and final R² (trials without reports included)."""
    axes = run.ctx.axes
    fin = final_rows(run.df).set_index("trial_id") if not run.df.empty else pd.DataFrame()
    rows = []
    for trial_id in sorted(set(run.params) | set(run.statuses)):
        p = run.params.get(trial_id, {})
        row: dict[str, Any] = {"trial": trial_id}
        for a in axes:
            v = _axis_value(p.get(a))
            row[a] = "null" if v is None and a in p else v
        row["seed"] = p.get("seed")
        row["status"] = run.statuses.get(trial_id, "PENDING")
        last = fin.loc[trial_id] if trial_id in fin.index else None
        cfg = run.ctx.configs.get(trial_id)
        step = None if last is None else last.get("step")
        row["steps"] = f"{int(step) if step is not None and pd.notna(step) else 0} / {cfg.max_steps if cfg else '?'}"
        for col, name in (("r2", "final R²"), ("mcc", "MCC"), ("time_total_s", "time (s)")):
            v = None if last is None else last.get(col)
            row[name] = None if v is None or pd.isna(v) else round(float(v), 4 if col != "time_total_s" else 2)
        rows.append(row)
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------ panels
@dataclass
class PanelResult:
    """One panel: its spec, its data and its figure."""

    spec: PanelSpec
    data: pd.DataFrame
    figure: Any


def dashboard_for(run: Run, dashboard: str | Path | Dashboard | None = None) -> Dashboard:
    """The run's dashboard: the one given, else dashboards/<grid>.yaml, else the default panels."""
    if isinstance(dashboard, Dashboard):
        return dashboard
    if dashboard is not None:
        return load_dashboard(dashboard, run.grid)
    if run.name in known_dashboards():
        return load_dashboard(run.name, run.grid)
    return default_dashboard(run.name)


def build_panels(run: Run, dashboard: str | Path | Dashboard | None = None) -> list[PanelResult]:
    """Compute every panel's DataFrame, then its figure."""
    dash = dashboard_for(run, dashboard)
    out = []
    for spec in dash.panels:
        data = panel_data(run.df, spec, run.ctx)
        out.append(PanelResult(spec, data, panel_figure(data, spec, run.ctx)))
    return out


# ------------------------------------------------------------------------------------------ HTML
_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 0 auto; max-width: 1400px;
       padding: 1em 2em; color: #222; }
h1 { margin-bottom: 0.1em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
.meta { color: #555; } .figure { color: #114; font-weight: 600; } .note { color: #555; font-style: italic; }
table { border-collapse: collapse; font-size: 0.88em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 0.2em 0.6em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.TERMINATED { color: #070; } .ERROR { color: #b00; font-weight: 600; } .RUNNING { color: #b60; }
.PENDING, .PAUSED { color: #777; }
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
    rows = [("grid", run.name), ("scale", marker.get("scale")), ("run directory", run.run_dir),
            ("created", marker.get("created")), ("ablate version", marker.get("ablate_version"))]
    parts = []
    if grid is not None:
        rows += [("figure", grid.figure), ("search", grid.search), ("trials", grid.n_trials),
                 ("seeds", ", ".join(map(str, grid.seeds))), ("stop", json.dumps(grid.stop))]
        if grid.axes:
            rows += [(f"axis {k}", ", ".join(json.dumps(v) if not isinstance(v, str) else v for v in vals))
                     for k, vals in grid.axes.items()]
        if grid.variants:
            rows.append(("variants", "; ".join(json.dumps(v) for v in grid.variants)))
        if grid.optuna:
            rows.append(("optuna", json.dumps(grid.optuna)))
        if grid.paper_values:
            rows.append(("paper values", json.dumps(grid.paper_values)))
    table = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    parts.append(f"<table>{table}</table>")
    if grid is not None:
        if grid.description:
            parts.append(f"<p>{html.escape(grid.description.strip())}</p>")
        base = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(json.dumps(v))}</td></tr>"
                       for k, v in sorted(grid.base.items()))
        parts.append(f"<details open><summary>base settings (every trial; RunConfig defaults otherwise)</summary>"
                     f"<table>{base}</table></details>")
        if grid.chosen:
            chosen = pd.DataFrame([{"key": c.get("key"), "value": json.dumps(c.get("value")) if "value" in c else "",
                                    "why": c.get("why")} for c in grid.chosen])
            parts.append("<details><summary>values the papers' text does not give (chosen)</summary>"
                         f"{_html_table(chosen)}</details>")
    gen = generator_table(run.df)
    if not gen.empty:
        parts.append("<details open><summary>generator g: how hard the inversion is (condition numbers per layer, the "
                     "threshold each layer had to beat, and the linear R² of z from g(z); 1 would be a linear g)</summary>"
                     f"{_html_table(gen)}</details>")
    if marker.get("grid_yaml"):
        parts.append(f"<details><summary>grid YAML as run</summary><pre>{html.escape(marker['grid_yaml'])}</pre>"
                     "</details>")
    return "\n".join(parts)


def generator_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct generator g of a run: its condition numbers, threshold, linear R², and trials."""
    cols = sorted(c for c in df.columns if c.startswith("g_cond_layer_")) + ["g_cond_threshold", "g_linear_r2"]
    if df.empty or "g_linear_r2" not in df.columns or "trial_id" not in df.columns:
        return pd.DataFrame()
    last = df.dropna(subset=["g_linear_r2"]).groupby("trial_id").tail(1)
    keys = [c for c in ("latent_dim", "generator_seed") if c in last.columns]
    table = last.groupby(keys + cols, dropna=False).size().reset_index(name="trials")
    return table.round({c: 3 for c in cols})


def _where_text(v: Any) -> str:
    """A ``where`` value as a reader would say it."""
    if isinstance(v, list):
        return " or ".join(_where_text(x) for x in v)
    if v is None:
        return "null"
    return {"max": "its largest value", "min": "its smallest value"}.get(v, str(v)) if isinstance(v, str) else str(v)


def render_html(run: Run, panels: list[PanelResult], dashboard: Dashboard, refresh: float | None = None,
                finished: bool | None = None) -> str:
    """The report page: title, settings, trials, and each panel with its paper figure (plotly.js inline).

    ``refresh`` (seconds) makes the page reload itself (``--watch``); ``finished`` defaults to :func:`run_finished`.
    """
    import plotly.io as pio

    table = trial_table(run)
    counts = table["status"].value_counts().to_dict() if not table.empty else {}
    expected = int(run.marker.get("n_trials") or len(table))
    not_started = max(expected - len(table), 0)
    finished = run_finished(run) if finished is None else finished
    state = "finished" if finished else "in progress"
    count_text = ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items()))
    if not_started:
        count_text += f", {not_started} not started"
    title = dashboard.title or run.name
    head_refresh = f'<meta http-equiv="refresh" content="{int(max(refresh, 1))}">' if refresh else ""
    out = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', head_refresh,
        f"<title>ablate report: {html.escape(run.name)} ({html.escape(str(run.marker.get('scale')))})</title>",
        f"<style>{_CSS}</style><script>{_HEAD_JS}</script></head><body>",
        f"<h1>ablate report: {html.escape(title)}</h1>",
        f"<p class='meta'>grid <b>{html.escape(run.name)}</b> at scale <b>{html.escape(str(run.marker.get('scale')))}"
        f"</b> · run {state}: {len(table)} of {expected} trials known ({html.escape(count_text or 'none yet')}) · "
        f"{len(run.df)} reports · written {time.strftime('%Y-%m-%d %H:%M:%S')}"
        + (f" · refreshes every {refresh:g} s" if refresh else "") + "</p>",
    ]
    if dashboard.description:
        out.append(f"<p>{html.escape(dashboard.description.strip())}</p>")
    out += ["<h2>Settings</h2>", _settings_html(run), "<h2>Trials</h2>", _html_table(table, status_col="status")]
    for i, panel in enumerate(panels):
        spec = panel.spec
        kind = PANELS[spec.kind]
        fig_html = pio.to_html(panel.figure, full_html=False, include_plotlyjs=(i == 0), div_id=f"panel-{i}",
                               config={"displaylogo": False, "responsive": True})
        where = ("<p class='meta'>shown: " + html.escape("; ".join(f"{k} = {_where_text(v)}" for k, v in
                                                                   spec.where.items())) + "</p>") if spec.where else ""
        out += [
            f'<section class="panel" data-kind="{spec.kind}">',
            f"<h2>{i + 1}. {html.escape(spec.title or kind.title)}</h2>",
            f"<p class='figure'>Paper figure: {html.escape(spec.figure)}</p>",
            f"<p class='meta'>{html.escape(kind.describe)}</p>",
            f"<p class='note'>{html.escape(spec.note)}</p>" if spec.note else "",
            where,
            fig_html,
            f"<details><summary>data ({len(panel.data)} rows)</summary>{_html_table(panel.data, max_rows=300)}"
            "</details>",
            "</section>",
        ]
    out.append(f"<script>{_TAIL_JS % {'expected': len(panels)}}</script>")
    out.append("</body></html>")
    return "\n".join(s for s in out if s)


def default_out(run_dir: str | Path) -> str:
    """RUN_DIR/report.html."""
    return str(run_dir).rstrip("/") + "/report.html"


def _write_text(target: str, text: str) -> None:
    if "://" in target and not target.startswith("file://"):
        import pyarrow.fs as pafs

        fs, path = pafs.FileSystem.from_uri(target)
        with fs.open_output_stream(path) as f:
            f.write(text.encode())
        return
    path = Path(target.removeprefix("file://"))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)  # a browser reloading the page never sees half a file


def write_report(run: Run | str | Path, out: str | Path | None = None,
                 dashboard: str | Path | Dashboard | None = None, refresh: float | None = None,
                 finished: bool | None = None) -> str:
    """Write the report of ``run`` (a :class:`Run` or a run directory) to ``out`` (default RUN_DIR/report.html)."""
    if not isinstance(run, Run):
        run = load_run(run)
    dash = dashboard_for(run, dashboard)
    target = str(out) if out is not None else default_out(run.run_dir)
    _write_text(target, render_html(run, build_panels(run, dash), dash, refresh=refresh, finished=finished))
    return target


def watch_report(run_dir: str | Path, out: str | Path | None = None, every: float = 10.0,
                 dashboard: str | Path | None = None, log: Callable[[str], None] = print,
                 sleep: Callable[[float], None] = time.sleep) -> str:
    """Rewrite the report every ``every`` seconds until all the run's trials finished (the page reloads itself)."""
    if every <= 0:
        raise RunError(f"--watch {every}: the interval must be > 0 seconds")
    while True:
        run = load_run(run_dir)
        done = run_finished(run)
        target = write_report(run, out, dashboard, refresh=None if done else every, finished=done)
        statuses = pd.Series(list(run.statuses.values()), dtype=object).value_counts().to_dict()
        log(f"{time.strftime('%H:%M:%S')} wrote {target}: {len(run.df)} reports, "
            + (", ".join(f"{n} {s.lower()}" for s, n in sorted(statuses.items())) or "no trials yet"))
        if done:
            return target
        sleep(every)
