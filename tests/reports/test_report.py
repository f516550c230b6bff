"""Reports: each panel's data from real smoke runs, every grid's report, export round trips, spec errors,
`ablate report --watch`, and the dashboard command's host and authentication rules (without starting Ray)."""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import runs_root, smoke_run

from ablate import cli
from ablate.analysis.results import load_results
from ablate.config import RunConfig
from ablate.core.metrics import iterations_to_target
from ablate.reports.panels import PANELS, RunContext, final_rows, panel_data, panel_spec
from ablate.reports.report import (
    DASHBOARD_DIR,
    SpecError,
    build_panels,
    known_dashboards,
    load_dashboard,
    load_run,
    study_views,
    watch_report,
    write_report,
)
from ablate.rundir import RUN_MARKER, RunError
from ablate.service.cluster import DashboardHandle, auth_lines, check_host, is_loopback
from ablate.service.grids import known_grids, load_grid
from ablate.service.specs import SCALES

#: The columns of each panel kind's data frame.
COLUMNS = {
    "r2_curves": ["facet", "color", "series", "metric", "x", "mean", "lo", "hi", "n_seeds"],
    "final_heatmap": ["facet", "x", "y", "value", "std", "n_seeds"],
    "r2_blocks_vs_lambda": ["color", "x", "block", "block_lambda", "mean", "lo", "hi", "n_seeds"],
    "lambda_hat_curves": ["facet", "trial_id", "member", "dim", "kind", "truth", "x", "value"],
    "loss_vs_floor": ["facet", "color", "series", "kind", "x", "mean", "lo", "hi", "n_seeds"],
    "iterations_to_target": ["x", "color", "target", "iterations", "lo", "hi", "n_reached", "n_seeds"],
    "loss_vs_fixed_lambda": ["color", "fixed_lambda", "mean", "lo", "hi", "n_seeds", "optimum", "optimum_label"],
    "similarity_histograms": ["facet", "kind", "bin_center", "density", "overlap", "n_seeds"],
    "ensemble_bars": ["facet", "x", "mean", "std", "n_seeds", "paper"],
}


@pytest.fixture(scope="module")
def bvd(ray_session, tmp_path_factory):
    """batch_vs_dim at smoke scale: 2 batch sizes × 2 latent dims, one seed, 2 reports per trial."""
    return load_run(smoke_run("batch_vs_dim", runs_root(tmp_path_factory)))


# ---------------------------------------------------------------------------------------- panel data
def test_run_with_report_flag_wrote_the_report(bvd):
    html = (Path(bvd.run_dir) / "report.html").read_text()
    assert "ablate report" in html and html.count("Paper figure:") == len(load_dashboard("batch_vs_dim").panels)


def test_batch_vs_dim_panels_hold_the_expected_data(bvd):
    df = bvd.df
    fin = final_rows(df)
    panels = {p.spec.kind: p for p in build_panels(bvd)}
    assert list(panels) == [p.kind for p in load_dashboard("batch_vs_dim").panels]
    for kind, p in panels.items():
        assert list(p.data.columns) == COLUMNS[kind], kind

    heat = panels["final_heatmap"].data
    assert len(heat) == 4 and set(heat["x"]) == {16, 32} and set(heat["y"]) == {3, 6}
    for _, r in heat.iterrows():
        want = fin[(fin["batch_size"] == r["x"]) & (fin["latent_dim"] == r["y"])]["r2"]
        assert r["value"] == pytest.approx(want.mean()) and r["n_seeds"] == 1

    curves = panels["r2_curves"].data
    assert len(curves) == len(df) == 8  # 4 grid points × 2 reports, one seed each
    assert set(curves["facet"]) == {"latent_dim=3", "latent_dim=6"}
    assert set(curves["color"]) == {"batch_size=16", "batch_size=32"}
    want = {(f"batch_size={r.batch_size}, latent_dim={r.latent_dim}", r.step): r.r2 for r in df.itertuples()}
    assert {(r.series, r.x): r.mean for r in curves.itertuples()} == pytest.approx(want)
    assert (curves["lo"] <= curves["mean"]).all() and (curves["mean"] <= curves["hi"]).all()

    itt = panels["iterations_to_target"].data  # where: batch_size = max → 32 only
    assert len(itt) == 2 * 4 and set(itt["x"]) == {3, 6} and set(itt["target"]) == {0.5, 0.7, 0.8, 0.9}
    for _, r in itt.iterrows():
        t = df[(df["batch_size"] == 32) & (df["latent_dim"] == r["x"])].sort_values("step")
        want = iterations_to_target(list(t["step"]), list(t["r2"]), [r["target"]])[r["target"]]
        assert (want is None and math.isnan(r["iterations"])) or r["iterations"] == want
        assert r["n_reached"] == (0 if want is None else 1)

    hist = panels["similarity_histograms"].data
    assert len(hist) == 2 * 2 * 40  # 2 latent dims (batch 32) × positive/negative × 40 bins
    sums = hist.groupby(["facet", "kind"])["density"].sum()
    assert np.allclose(sums, 1.0)
    assert hist["bin_center"].between(-1, 1).all()

    loss = panels["loss_vs_floor"].data
    assert len(loss) == 4 * 2 * 2 and set(loss["kind"]) == {"loss", "floor"}
    floor = loss[loss["kind"] == "floor"].sort_values(["series", "x"])["mean"].to_numpy()
    assert np.allclose(np.sort(floor), np.sort(df["loss_floor"].to_numpy()))


def test_lambda_hat_and_block_panels_on_a_real_run(bvd):
    hat = panel_data(bvd.df, panel_spec("lambda_hat_curves", "Fig. 2D"), bvd.ctx)
    assert list(hat.columns) == COLUMNS["lambda_hat_curves"]
    learned, true = hat[hat["kind"] == "learned"], hat[hat["kind"] == "true"]
    # one facet per grid point; d learned curves of 2 reports each; the true Λ = 75 dashed
    assert learned.groupby("facet")["dim"].nunique().to_dict() == {
        "batch_size=16, latent_dim=3": 3,
        "batch_size=16, latent_dim=6": 6,
        "batch_size=32, latent_dim=3": 3,
        "batch_size=32, latent_dim=6": 6,
    }
    assert len(learned) == 2 * (3 + 6 + 3 + 6)
    assert set(true["value"]) == {75.0} and set(true["truth"]) == {"Λ"}

    blocks = panel_data(bvd.df, panel_spec("r2_blocks_vs_lambda", "Fig. 2A", color="latent_dim"), bvd.ctx)
    assert list(blocks.columns) == COLUMNS["r2_blocks_vs_lambda"]
    # isotropic Λ = 75: both "blocks" are the whole latent, at Λ₂ = 75
    assert set(blocks["x"]) == {75.0} and set(blocks["block"]) == {"Λ₁ block", "Λ₂ block"}
    assert len(blocks) == 2 * 2 and (blocks["n_seeds"] == 2).all()  # 2 batch sizes pooled per latent dim


def _synthetic(rows: list[dict], axes: list[str], configs: dict[str, dict]) -> tuple[pd.DataFrame, RunContext]:
    df = pd.DataFrame(rows)
    ctx = RunContext(
        grid="synthetic",
        axes=axes,
        configs={k: RunConfig(**v) for k, v in configs.items()},
        paper_values={"r2": {"infonce": 0.48, "aninfonce": 0.93, "ensemble": 0.98}},
    )
    return df, ctx


def test_fixed_lambda_panel_marks_lambda_plus_minus_lambda_minus():
    rows, configs = [], {}
    for i, (fixed, seed) in enumerate([(f, s) for f in (10.0, 50.0, 150.0) for s in (0, 1)]):
        tid = f"t{i}"
        configs[tid] = {
            "latent_dim": 4,
            "concentration": 150,
            "negative_concentration": 100,
            "n_hard_negatives": 3,
            "fixed_lambda_hat": fixed,
            "seed": seed,
        }
        for it in (1, 2):
            loss = abs(fixed - 50) / 10 + it + seed  # minimum at Λ⁺ − Λ⁻ = 50
            rows.append(
                {
                    "trial_id": tid,
                    "training_iteration": it,
                    "step": it * 5,
                    "seed": seed,
                    "fixed_lambda_hat": fixed,
                    "eval_loss": loss,
                }
            )
    df, ctx = _synthetic(rows, ["fixed_lambda_hat"], configs)
    data = panel_data(df, panel_spec("loss_vs_fixed_lambda", "Fig. 10A"), ctx)
    assert list(data.columns) == COLUMNS["loss_vs_fixed_lambda"]
    assert list(data["fixed_lambda"]) == [10.0, 50.0, 150.0]
    assert set(data["optimum"]) == {50.0} and set(data["optimum_label"]) == {"Λ⁺ − Λ⁻"}
    assert (data["n_seeds"] == 2).all()
    assert data.loc[data["mean"].idxmin(), "fixed_lambda"] == 50.0
    assert data.loc[data["fixed_lambda"] == 50.0, "mean"].item() == pytest.approx(2.5)  # last report, mean of seeds


def test_ensemble_bars_carry_the_paper_values():
    rows, configs = [], {}
    for i, (variant, seed, r2) in enumerate(
        [("infonce", 0, 0.4), ("infonce", 1, 0.5), ("aninfonce", 0, 0.9), ("ensemble", 0, 0.97)]
    ):
        configs[f"t{i}"] = {"latent_dim": 4, "seed": seed}
        rows.append(
            {"trial_id": f"t{i}", "training_iteration": 1, "step": 5, "seed": seed, "variant": variant, "r2": r2}
        )
    df, ctx = _synthetic(rows, ["variant"], configs)
    spec = panel_spec("ensemble_bars", "Fig. 11A", paper_key="r2", order=["infonce", "aninfonce", "ensemble"])
    data = panel_data(df, spec, ctx)
    assert list(data.columns) == COLUMNS["ensemble_bars"]
    assert list(data["x"]) == ["infonce", "aninfonce", "ensemble"]
    assert list(data["paper"]) == [0.48, 0.93, 0.98]
    assert data["mean"].tolist() == pytest.approx([0.45, 0.9, 0.97]) and data["n_seeds"].tolist() == [2, 1, 1]


def test_where_filter_picks_min_max_and_values():
    df = pd.DataFrame(
        {
            "trial_id": list("abcd"),
            "training_iteration": 1,
            "step": 5,
            "seed": 0,
            "batch_size": [16, 32, 64, 32],
            "latent_dim": [3, 3, 3, 6],
            "r2": [0.1, 0.2, 0.3, 0.4],
        }
    )
    ctx = RunContext(axes=["batch_size", "latent_dim"])
    spec = panel_spec("final_heatmap", "x", x="batch_size", y="latent_dim")
    for where, want in (
        ({"batch_size": "max"}, {64}),
        ({"batch_size": "min"}, {16}),
        ({"batch_size": [16, 64]}, {16, 64}),
    ):
        spec.where = where
        assert set(panel_data(df, spec, ctx)["x"]) == want


# ---------------------------------------------------------------------------------------- every grid
def test_every_grid_has_a_valid_dashboard_at_every_scale():
    grids, dashboards = known_grids(), known_dashboards()
    assert set(dashboards) == set(grids), "one dashboards/<grid>.yaml per search_spaces/<grid>.yaml"
    for name in grids:
        for scale in SCALES:
            dash = load_dashboard(name, load_grid(name, scale))
            assert dash.panels and all(p.figure for p in dash.panels)


@pytest.mark.slow
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


# ---------------------------------------------------------------------------------------- export, refusal, watch
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
    monkeypatch.setattr(report, "run_finished", lambda run: next(states))
    out = tmp_path / "live.html"
    pages, sleeps = [], []

    def sleep(s):
        sleeps.append(s)
        pages.append(out.read_text())

    path = watch_report(bvd.run_dir, out, every=7, log=lambda m: None, sleep=sleep)
    assert path == str(out) and sleeps == [7, 7]
    assert all('http-equiv="refresh" content="7"' in p for p in pages), "the page reloads itself while running"
    assert 'http-equiv="refresh"' not in out.read_text(), "the final page stops reloading"
    with pytest.raises(RunError, match="must be > 0"):
        watch_report(bvd.run_dir, out, every=0)


# ---------------------------------------------------------------------------------------- dashboard specs
BAD_SPECS = {
    "unknown kind": ("panels:\n  - {kind: scatter3d, figure: Fig. 1}\n", "panels[0].kind", "unknown panel kind"),
    "unknown key": (
        "panels:\n  - {kind: r2_curves, figure: Fig. 1, colour: batch_size}\n",
        "colour",
        "unknown key for r2_curves",
    ),
    "missing figure": ("panels:\n  - {kind: r2_curves}\n", "figure", "required"),
    "not an axis": (
        "panels:\n  - {kind: final_heatmap, figure: F, x: batch_size, y: lambda}\n",
        ".y",
        "'lambda' is not an axis",
    ),
    "missing option": ("panels:\n  - {kind: final_heatmap, figure: F, x: batch_size}\n", ".y", "required"),
    "bad targets": (
        "panels:\n  - {kind: iterations_to_target, figure: F, x: latent_dim, targets: [0.5, 2]}\n",
        "targets",
        "(0, 1]",
    ),
    "bad choice": ("panels:\n  - {kind: r2_curves, figure: F, x: epoch}\n", ".x", "allowed: step"),
    "wrong type": (
        "panels:\n  - {kind: lambda_hat_curves, figure: F, max_facets: many}\n",
        "max_facets",
        "expected an integer",
    ),
    "same axis twice": (
        "panels:\n  - {kind: final_heatmap, figure: F, x: batch_size, y: batch_size}\n",
        ".y",
        "must differ from x",
    ),
    "bad where": ("panels:\n  - {kind: r2_curves, figure: F, where: {tau: 1}}\n", "where.tau", "not an axis"),
    "top-level key": ("panel: []\n", "panel:", "unknown key"),
    "no panels": ("panels: []\n", "panels", "non-empty list"),
    "malformed": ("panels: [\n", "malformed YAML", "line"),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_bad_dashboard_spec_names_the_file_and_key(case, tmp_path):
    body, key, message = BAD_SPECS[case]
    path = tmp_path / "batch_vs_dim.yaml"
    path.write_text(("grid: batch_vs_dim\n" if case != "malformed" else "") + body)
    with pytest.raises(SpecError) as err:
        load_dashboard(path, load_grid("batch_vs_dim", "smoke"))
    text = str(err.value)
    assert str(path) in text and key in text and message in text, text


def test_cli_maps_a_bad_spec_to_exit_2(bvd, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("grid: batch_vs_dim\npanels:\n  - {kind: histogram, figure: F}\n")
    assert cli.main(["report", bvd.run_dir, "--dashboard", str(bad), "--out", str(tmp_path / "r.html")]) == 2
    assert "unknown panel kind 'histogram'" in capsys.readouterr().err


def test_every_panel_kind_is_covered():
    assert set(COLUMNS) == set(PANELS)
    used = {p.kind for path in DASHBOARD_DIR.glob("*.yaml") for p in load_dashboard(path).panels}
    assert used <= set(PANELS)


# ---------------------------------------------------------------------------------------- ablate dashboard
def test_dashboard_host_defaults_to_loopback_without_warning():
    assert check_host(None, {}) == ("127.0.0.1", [])
    for host in ("127.0.0.1", "localhost", "::1", "127.0.1.1"):
        assert is_loopback(host) and check_host(host, {})[1] == []


def test_dashboard_warns_for_another_host_and_refuses_it_without_auth():
    host, warnings = check_host("0.0.0.0", {})
    assert host == "0.0.0.0" and len(warnings) == 1 and "ssh -L 8265:127.0.0.1:8265" in warnings[0]
    with pytest.raises(RunError, match="refusing to expose"):
        check_host("10.1.2.3", {"RAY_AUTH_MODE": "disabled"})
    host, warnings = check_host("127.0.0.1", {"RAY_AUTH_MODE": "disabled"})
    assert host == "127.0.0.1" and any("token authentication is off" in w for w in warnings)
    with pytest.raises(RunError, match="empty host"):
        check_host(" ", {})


def test_dashboard_prints_url_and_how_to_authenticate(monkeypatch, capsys, tmp_path):
    import ablate.service.cluster as dashboard

    closed = []
    handle = DashboardHandle(url="http://127.0.0.1:8265", started=True, shutdown=lambda: closed.append(True))
    monkeypatch.setattr(dashboard, "start_or_find", lambda host, port: handle)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    lines: list[str] = []
    assert dashboard.serve(None, 8265, out=lines.append, wait=lambda: None) == 0
    text = "\n".join(lines)
    assert "Ray dashboard: http://127.0.0.1:8265" in text
    assert "auth_token" in text and "ray get-auth-token" in text and "Ablate[" in text
    assert closed == [True]
    assert any("auth_token" in line for line in auth_lines({}, tmp_path / "auth_token"))
    assert cli.main(["dashboard", "--port", "70000"]) == 2
    assert "not a TCP port" in capsys.readouterr().err
