"""Each panel kind's data (``ablate.reports.panels``): from a real smoke run of batch_vs_dim and from hand-built
tables with known answers; every panel kind has its columns here and a shipped dashboard that draws it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from conftest import runs_root, smoke_run

from ablate.config import RunConfig
from ablate.core.metrics import iterations_to_target
from ablate.reports.panels import PANELS, RunContext, final_rows, panel_data, panel_spec
from ablate.reports.report import DASHBOARD_DIR, build_panels, load_dashboard, load_run


@pytest.fixture(scope="module")
def bvd(ray_session, tmp_path_factory):
    """batch_vs_dim at smoke scale: 2 batch sizes × 2 latent dims, one seed, 2 reports per trial (the run is
    shared with tests/reports/test_report.py in the same session)."""
    return load_run(smoke_run("batch_vs_dim", runs_root(tmp_path_factory)))


#: The columns of each panel kind's data frame.
COLUMNS = {
    "r2_curves": ["facet", "color", "series", "metric", "x", "mean", "lo", "hi", "n_seeds", "ended"],
    "final_heatmap": ["facet", "x", "y", "value", "std", "n_seeds"],
    "r2_blocks_vs_lambda": ["color", "x", "block", "block_lambda", "mean", "lo", "hi", "n_seeds"],
    "lambda_hat_curves": ["facet", "trial_id", "member", "dim", "kind", "truth", "x", "value"],
    "loss_vs_floor": ["facet", "color", "series", "kind", "x", "mean", "lo", "hi", "n_seeds", "ended"],
    "iterations_to_target": ["x", "color", "target", "iterations", "lo", "hi", "n_reached", "n_seeds"],
    "loss_vs_fixed_lambda": ["color", "fixed_lambda", "mean", "lo", "hi", "n_seeds", "optimum", "optimum_label"],
    "similarity_histograms": ["facet", "kind", "bin_center", "density", "overlap", "n_seeds"],
    "ensemble_bars": ["facet", "x", "mean", "std", "n_seeds", "paper"],
}


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


def test_final_values_are_the_finished_trials_and_curves_mark_where_the_others_stopped(tmp_path):
    """issue 36: a final-value panel pooled an interrupted trial's last step with finished trials' final values. It
    reads the finished trials only; a curve still draws every trial up to its last report, and marks with a row of
    ``ended`` where one that errored or was interrupted made its last report with a value."""
    from unfinished_runs import ERRORED, INTERRUPTED, unfinished_run

    run = load_run(unfinished_run(tmp_path / "run"))
    spec = panel_spec("ensemble_bars", "Fig. 11A", x="variant", order=["infonce", "aninfonce", "ensemble"])
    bars = panel_data(run.df, spec, run.ctx)
    assert bars["n_seeds"].tolist() == [3, 2, 1] and bars["mean"].tolist() == pytest.approx([0.49, 0.92, 0.98])
    heat = panel_data(run.df, panel_spec("final_heatmap", "x", x="variant", y="seed"), run.ctx)
    assert len(heat) == 6 and (heat["n_seeds"] == 1).all()  # 8 trials, 2 of which did not finish

    curves = panel_data(run.df, panel_spec("r2_curves", "x", color="variant"), run.ctx)
    assert list(curves.columns) == COLUMNS["r2_curves"]
    marks = curves[curves["ended"] != ""]
    assert marks[["series", "x", "mean", "n_seeds", "ended"]].to_dict("records") == [
        {
            "series": "variant=aninfonce",
            "x": 10,
            "mean": 0.2,
            "n_seeds": 1,
            "ended": f"{INTERRUPTED}: interrupted at step 10",
        },
        {"series": "variant=ensemble", "x": 10, "mean": 0.3, "n_seeds": 1, "ended": f"{ERRORED}: errored at step 20"},
    ]
    lines = curves[curves["ended"] == ""].set_index(["series", "x"])
    # drawn up to where they stopped: at step 10 the mean holds every trial, at step 20 the finished ones
    assert lines.loc[("variant=aninfonce", 10), "n_seeds"] == 3 and lines.loc[("variant=aninfonce", 20), "n_seeds"] == 2
    assert lines.loc[("variant=ensemble", 20), "mean"] == pytest.approx(0.98)
    loss = panel_data(run.df, panel_spec("loss_vs_floor", "x", color="variant"), run.ctx)
    assert sorted(loss.loc[loss["ended"] != "", "ended"]) == sorted(marks["ended"])
    assert set(loss.loc[loss["ended"] != "", "kind"]) == {"loss"}
    figure = PANELS["r2_curves"].draw(curves, panel_spec("r2_curves", "x", color="variant"), run.ctx)
    (drawn,) = [t for t in figure.data if t.legendgroup == "ended"]
    assert drawn.marker.symbol == "x" and list(drawn.hovertext) == list(marks["ended"])

    hat = panel_data(run.df, panel_spec("lambda_hat_curves", "x", facet="variant"), run.ctx)
    shown = hat.drop_duplicates("facet").set_index("facet")["trial_id"].to_dict()
    assert shown["variant=ensemble"] == "ensemble_1", "a seed that finished is shown before a lower one that errored"
    cut = load_run(unfinished_run(tmp_path / "cut", ensemble_finished=False))
    hat = panel_data(cut.df, panel_spec("lambda_hat_curves", "x", facet="variant"), cut.ctx)
    assert "variant=ensemble · ensemble_0 errored at step 20" in set(hat["facet"]), "no ensemble trial finished"


def test_every_panel_kind_is_covered():
    assert set(COLUMNS) == set(PANELS)
    used = {p.kind for path in DASHBOARD_DIR.glob("*.yaml") for p in load_dashboard(path).panels}
    assert used == set(PANELS), f"no shipped dashboard draws {sorted(set(PANELS) - used)}: no report test runs it"
