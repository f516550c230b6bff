"""Differences between an axis's levels (ablate.analysis.compare, `ablate compare`): Welch's and the bootstrap
interval against scipy and against hand-worked answers; too few seeds never read as a difference; the report's
ci95 band and grid-point table; the claims' interval text."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from ablate import cli
from ablate.analysis import claims
from ablate.analysis.compare import (
    CompareError,
    bootstrap_interval,
    compare,
    diff_text,
    difference,
    mean_interval,
    point_table,
    seed_ci,
    welch_interval,
)
from ablate.analysis.run import RunContext
from ablate.reports.panels import panel_data, panel_figure, panel_spec
from ablate.service.records.rundir import PARAMS_FILE, RESULT_FILE, TRIAL_PREFIX, write_marker


def table(cells: dict[tuple, list[float]], axes: list[str], steps: tuple[int, ...] = (100,)) -> pd.DataFrame:
    """A results table like load_results': grid point (values of ``axes``) → one final R² per seed. With several
    ``steps``, each trial reports at each step, R² = final value × step / last step."""
    rows = []
    for point, values in cells.items():
        for seed, value in enumerate(values):
            tid = "_".join(map(str, point)) + f"_s{seed}"
            for i, step in enumerate(steps, start=1):
                rows.append(
                    {
                        "trial_id": tid,
                        "status": "TERMINATED",
                        **dict(zip(axes, point)),
                        "seed": seed,
                        "training_iteration": i,
                        "step": step,
                        "r2": value * step / steps[-1],
                        "mcc": 1.0 - value,
                    }
                )
    df = pd.DataFrame(rows)
    df.attrs.update({"grid": "test", "axes": list(axes)})
    return df


SAMPLES = [
    ([0.91, 0.93, 0.95], [0.48, 0.52, 0.47]),
    ([0.1, 0.4, 0.2, 0.35, 0.3], [0.25, 0.2]),
    ([1.0, 2.0, 4.0, 8.0], [3.0, 3.5, 2.5]),
    ([0.5, 0.5], [0.4, 0.6]),  # one side without spread
]


# --------------------------------------------------------------------------- the intervals
@pytest.mark.parametrize("a, b", SAMPLES)
def test_welch_interval_equals_scipy(a, b):
    res = stats.ttest_ind(a, b, equal_var=False)
    ci = res.confidence_interval(0.95)
    lo, hi, dof, p = welch_interval(a, b)
    assert (lo, hi) == pytest.approx((ci.low, ci.high), rel=1e-12, abs=1e-12)
    assert dof == pytest.approx(res.df, rel=1e-12)
    assert p == pytest.approx(res.pvalue, rel=1e-10)
    assert difference(a, b)["diff"] == pytest.approx(np.mean(a) - np.mean(b))


@pytest.mark.parametrize("values", [[0.2, 0.4], [0.91, 0.93, 0.95, 0.9], [3.0, 1.0, 4.0, 1.0, 5.0]])
def test_mean_interval_equals_scipy(values):
    ci = stats.ttest_1samp(values, 0.0).confidence_interval(0.95)
    m, lo, hi, n = mean_interval(values)
    assert (m, n) == (pytest.approx(np.mean(values)), len(values))
    assert (lo, hi) == pytest.approx((ci.low, ci.high), rel=1e-12)


def test_bootstrap_hand_worked_answers():
    # a = {0, 1}: a resample's mean is 0, ½ or 1 with probability ¼, ½, ¼; b = {0, 0} never moves. The 2.5 %
    # and 97.5 % points of mean(a) − mean(b) are therefore 0 and 1.
    assert bootstrap_interval([0, 1], [0, 0]) == (0.0, 1.0)
    # both {0, 1}: the difference is −1 with probability 1/16 = 6.25 % > 2.5 %, so the interval is [−1, 1].
    assert bootstrap_interval([0, 1], [0, 1]) == (-1.0, 1.0)
    # a shift of one side shifts the interval by exactly that much (same seed, same resamples)
    a, b = [0.91, 0.93, 0.95, 0.97], [0.48, 0.52, 0.47]
    base, shifted = bootstrap_interval(a, b), bootstrap_interval([x + 0.25 for x in a], b)
    assert shifted == pytest.approx((base[0] + 0.25, base[1] + 0.25), abs=1e-12)
    # every resampled difference lies between the extreme ones
    assert min(a) - max(b) <= base[0] < base[1] <= max(a) - min(b)


@pytest.mark.parametrize("a, b", SAMPLES[:3])
def test_bootstrap_agrees_with_scipys_percentile_bootstrap(a, b):
    ref = stats.bootstrap(
        (a, b),
        lambda x, y, axis=-1: np.mean(x, axis=axis) - np.mean(y, axis=axis),
        method="percentile",
        n_resamples=40_000,
        random_state=np.random.default_rng(7),
    ).confidence_interval
    lo, hi = bootstrap_interval(a, b)
    # two Monte Carlo estimates of the same quantiles: within a small fraction of the difference's spread
    sd = math.sqrt(np.var(a, ddof=1) / len(a) + np.var(b, ddof=1) / len(b))
    assert abs(lo - ref.low) < 0.15 * sd and abs(hi - ref.high) < 0.15 * sd


def test_bootstrap_is_reproducible_and_seeded():
    a, b = [0.91, 0.93, 0.95], [0.48, 0.52, 0.47]
    assert bootstrap_interval(a, b) == bootstrap_interval(a, b)
    assert bootstrap_interval(a, b, seed=1) != bootstrap_interval(a, b, seed=0)


# --------------------------------------------------------------------------- too few seeds
@pytest.mark.parametrize("a, b", [([0.99], [0.1]), ([0.99], [0.1, 0.12]), ([0.5, 0.9, 0.7], [0.1])])
def test_one_seed_never_reads_as_a_difference(a, b):
    d = difference(a, b, "an", "inf")
    assert d["verdict"] == "n=1: too few seeds to tell"
    assert all(math.isnan(d[k]) for k in ("welch_lo", "welch_hi", "welch_p", "boot_lo", "boot_hi"))
    text = diff_text(a, b, "an", "inf")
    assert "too few seeds" in text and "CI" not in text and ">" not in text and "<" not in text


def test_no_spread_at_all_cannot_tell():
    assert difference([0.5, 0.5], [0.4, 0.4])["verdict"] == "no spread between seeds: cannot tell"


def test_verdicts_follow_welchs_interval():
    assert difference([0.91, 0.93, 0.95], [0.48, 0.52, 0.47], "an", "inf")["verdict"] == "an > inf"
    assert difference([0.48, 0.52, 0.47], [0.91, 0.93, 0.95], "inf", "an")["verdict"] == "inf < an"
    assert difference([0.5, 0.7, 0.6], [0.55, 0.65, 0.62])["verdict"] == "no clear difference"


# --------------------------------------------------------------------------- compare on a table
def _three_variants() -> pd.DataFrame:
    return table(
        {
            ("infonce", 5): [0.48, 0.52, 0.47],
            ("aninfonce", 5): [0.91, 0.93, 0.95],
            ("ensemble", 5): [0.97],
            ("infonce", 25): [0.30, 0.50],
            ("aninfonce", 25): [0.35, 0.45, 0.38],
            ("ensemble", 25): [0.99, 0.98],
        },
        ["variant", "concentration"],
    )


def test_compare_every_pair_at_every_other_point():
    out = compare(_three_variants(), "variant")
    assert list(out.columns[:3]) == ["concentration", "a", "b"]
    assert out[["concentration", "a", "b"]].values.tolist() == [
        [5, "aninfonce", "ensemble"],
        [5, "aninfonce", "infonce"],
        [5, "ensemble", "infonce"],
        [25, "aninfonce", "ensemble"],
        [25, "aninfonce", "infonce"],
        [25, "ensemble", "infonce"],
    ]
    by = {(r.concentration, r.a, r.b): r for r in out.itertuples()}
    r = by[(5, "aninfonce", "infonce")]
    ci = stats.ttest_ind([0.91, 0.93, 0.95], [0.48, 0.52, 0.47], equal_var=False).confidence_interval()
    assert (r.n_a, r.n_b, r.diff) == (3, 3, pytest.approx(0.93 - 0.49))
    assert (r.welch_lo, r.welch_hi) == pytest.approx((ci.low, ci.high))
    assert r.verdict == "aninfonce > infonce"
    assert by[(5, "aninfonce", "ensemble")].verdict == "n=1: too few seeds to tell"
    assert by[(25, "aninfonce", "infonce")].verdict == "no clear difference"
    assert out.attrs["by"] == "variant" and out.attrs["metric"] == "r2"


def test_compare_another_axis_another_metric_and_a_step():
    df = table({("an", 5): [0.9, 0.8], ("an", 25): [0.4, 0.5]}, ["variant", "concentration"], steps=(50, 100))
    final = compare(df, "concentration")
    assert final[["variant", "a", "b"]].values.tolist() == [["an", 5, 25]]
    assert final["diff"].iloc[0] == pytest.approx(0.85 - 0.45)
    half = compare(df, "concentration", at=50)  # R² at step 50 is half the final value
    assert half["diff"].iloc[0] == pytest.approx((0.85 - 0.45) / 2)
    assert compare(df, "concentration", metric="mcc")["diff"].iloc[0] == pytest.approx(-(0.85 - 0.45))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"by": "batch_size"}, r"--by batch_size: not an axis of the run; axes: variant, concentration"),
        ({"by": "variant", "metric": "r3"}, r"--metric r3: not a column .* numeric columns: .*r2"),
        ({"by": "variant", "at": 70}, r"--at 70: no trial reported at step 70; reported steps: 100"),
        ({"by": "variant", "at": "last"}, r"--at 'last': expected 'final' or a step"),
    ],
)
def test_compare_bad_input_names_what_is_allowed(kwargs, match):
    with pytest.raises(CompareError, match=match):
        compare(_three_variants(), **kwargs)


def test_seed_ci_and_point_table():
    df = _three_variants()
    ci = seed_ci(df, ["variant", "concentration"], "r2")
    row = ci[(ci["variant"] == "aninfonce") & (ci["concentration"] == 5)].iloc[0]
    assert (row["lo"], row["hi"]) == pytest.approx(mean_interval([0.91, 0.93, 0.95])[1:3])
    one = ci[(ci["variant"] == "ensemble") & (ci["concentration"] == 5)].iloc[0]
    assert one["n_seeds"] == 1 and math.isnan(one["lo"]) and math.isnan(one["hi"])
    points = point_table(df, ["variant", "concentration"])
    assert points["variant"].tolist() == ["aninfonce", "aninfonce", "ensemble", "ensemble", "infonce", "infonce"]
    assert points.loc[2, "ci"] == "n=1: too few seeds" and points.loc[2, "seeds"] == 1
    assert points.loc[0, "ci"].startswith("[0.8") and points.loc[0, "mean"] == pytest.approx(0.93)


# --------------------------------------------------------------------------- the report
def test_r2_curves_band_ci95_against_minmax():
    df = table({("an",): [0.5, 0.7, 0.9], ("inf",): [0.3]}, ["variant"], steps=(50, 100))
    ctx = RunContext(grid="test", axes=["variant"])
    minmax = panel_data(df, panel_spec("r2_curves", "F", color="variant"), ctx)
    spec = panel_spec("r2_curves", "F", color="variant", band="ci95")
    ci = panel_data(df, spec, ctx)
    an_final = ci[(ci["series"] == "variant=an") & (ci["x"] == 100)].iloc[0]
    assert (an_final["lo"], an_final["hi"]) == pytest.approx(mean_interval([0.5, 0.7, 0.9])[1:3])
    mm = minmax[(minmax["series"] == "variant=an") & (minmax["x"] == 100)].iloc[0]
    assert (mm["lo"], mm["hi"]) == (pytest.approx(0.5), pytest.approx(0.9))
    assert ci[ci["series"] == "variant=inf"][["lo", "hi"]].isna().all().all()  # one seed: no band
    fig = panel_figure(ci, spec, ctx)
    bands = [t for t in fig.data if t.fill == "toself"]
    assert len(bands) == 1 and "95 % CI" in fig.layout.yaxis.title.text


def test_band_option_is_validated():
    from ablate.reports.spec import SpecError, parse_panel

    with pytest.raises(SpecError, match=r"band: 'sd' is not allowed; allowed: minmax, ci95"):
        parse_panel({"kind": "r2_curves", "figure": "F", "band": "sd"})


# --------------------------------------------------------------------------- the claims
def test_claims_show_the_interval_and_keep_their_verdicts():
    df = _three_variants()
    df = df[df["concentration"] == 25].assign(step=1)
    df.attrs.update({"grid": "ensemble"})
    res = claims.claim_ensemble(df, RunContext(grid="ensemble", axes=["variant"]))
    assert res.status == "FAIL"  # AnInfoNCE 0.393 < InfoNCE 0.400: the ordering fails, as it did before
    value = res.checks[0].value
    assert "ensemble − aninfonce = +0.592, 95 % CI [" in value and "ensemble > aninfonce" in value
    assert "aninfonce − infonce = -0.007, 95 % CI [" in value and "no clear difference" in value
    one = _three_variants()
    one = one[one["concentration"] == 5]
    res = claims.claim_ensemble(one, RunContext(grid="ensemble", axes=["variant"]))
    assert res.status == "PASS" and "ensemble − aninfonce = +0.040 (n=1: too few seeds to tell)" in res.checks[0].value


# --------------------------------------------------------------------------- the CLI
def _run_dir(root, cells: dict[str, list[float]]) -> str:
    root.mkdir(exist_ok=True)
    write_marker(str(root), {"grid": "ensemble", "scale": "smoke", "axes": ["variant", "seed"]})
    for variant, values in cells.items():
        for seed, r2 in enumerate(values):
            trial = root / f"{TRIAL_PREFIX}{variant}_{seed}"
            trial.mkdir()
            (trial / PARAMS_FILE).write_text(json.dumps({"variant": variant, "seed": seed, "max_steps": 20}))
            rows = [{"training_iteration": i, "step": 10 * i, "r2": r2 * i / 2} for i in (1, 2)]
            (trial / RESULT_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(root)


def test_cli_compare_on_a_run_dir(tmp_path, capsys):
    run = _run_dir(tmp_path, {"infonce": [0.48, 0.52, 0.47], "aninfonce": [0.91, 0.93, 0.95], "ensemble": [0.98]})
    assert cli.main(["compare", run, "--by", "variant"]) == 0
    out = capsys.readouterr().out
    assert "aninfonce > infonce" in out
    assert out.count("n=1: too few seeds to tell") == 2
    ci = stats.ttest_ind([0.91, 0.93, 0.95], [0.48, 0.52, 0.47], equal_var=False).confidence_interval()
    assert f"[{ci.low:+.4f}, {ci.high:+.4f}]" in out
    assert cli.main(["compare", run, "--by", "variant", "--at", "10"]) == 0
    assert f"{(0.93 - 0.49) / 2:+.4f}" in capsys.readouterr().out
    assert cli.main(["compare", run, "--by", "batch_size"]) == 2
    assert "ablate: error: --by batch_size: not an axis of the run; axes: variant" in capsys.readouterr().err


def test_report_groups_trials_by_grid_point(tmp_path):
    from ablate.reports.report import write_report

    run = _run_dir(
        tmp_path / "run", {"infonce": [0.48, 0.52, 0.47], "aninfonce": [0.91, 0.93, 0.95], "ensemble": [0.98]}
    )
    page = open(write_report(run, tmp_path / "report.html")).read()
    lo, hi = mean_interval([0.91, 0.93, 0.95])[1:3]
    assert "grid points: final R², mean over seeds with its 95 % confidence interval" in page
    assert f'<td>aninfonce</td><td class="num">3</td><td class="num">0.93</td><td>[{lo:.4f}, {hi:.4f}]</td>' in page
    assert '<td>ensemble</td><td class="num">1</td><td class="num">0.98</td><td>n=1: too few seeds</td>' in page


def test_compare_leaves_out_trials_that_did_not_finish_and_says_which(tmp_path, capsys):
    """issue 36: compare pooled an errored trial's last step with the finished trials' without a word. At ``final``
    a trial that errored (Ray gave up on it, or its loss went non-finite) or was interrupted is left out, named in
    one line with why, and counted; at a step every trial that reported there is compared."""
    from ablate.service.records.rundir import ERROR_FILE

    run = _run_dir(tmp_path, {"infonce": [0.48, 0.52, 0.47, 0.5], "aninfonce": [0.91, 0.93, 0.95]})

    def log(trial: str, rows: list[dict]) -> None:
        (tmp_path / f"{TRIAL_PREFIX}{trial}" / RESULT_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))

    first = {"training_iteration": 1, "step": 10}
    log("aninfonce_2", [{**first, "r2": 0.1}])  # failed for good at step 10 of 20 (its error beside its log)
    (tmp_path / f"{TRIAL_PREFIX}aninfonce_2" / ERROR_FILE).write_text(json.dumps({"error": "worker died"}))
    nan = "NonFiniteLossError: loss became nan at step 13 (seed 0)"
    log("infonce_0", [{**first, "r2": 0.24}, {"training_iteration": 2, "step": 20, "member_error": nan}])
    log("infonce_3", [{**first, "r2": 0.3}])  # stopped by a kill at step 10: interrupted

    from ablate.analysis.run import load_run

    table = compare(load_run(run).df, "variant")
    assert table.attrs["left_out"] == {
        "aninfonce_2": "errored at step 10",
        "infonce_0": "errored at step 20",
        "infonce_3": "interrupted at step 10",
    }
    (row,) = table.to_dict("records")
    assert (row["a"], row["b"], row["n_a"], row["n_b"]) == ("aninfonce", "infonce", 2, 2)
    assert row["diff"] == pytest.approx((0.91 + 0.93) / 2 - (0.52 + 0.47) / 2)

    assert cli.main(["compare", run, "--by", "variant"]) == 0
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("left out:")]
    assert line.startswith("left out: 3 trial(s) that did not finish")
    for part in ("aninfonce_2 (errored at step 10)", "infonce_0 (errored at step 20)", "infonce_3 (interrupted at"):
        assert part in line
    assert "2 vs 2" in out and f"{(0.91 + 0.93) / 2 - (0.52 + 0.47) / 2:+.4f}" in out

    assert cli.main(["compare", run, "--by", "variant", "--at", "10"]) == 0  # one step: every trial at it
    out = capsys.readouterr().out
    assert "left out" not in out and "3 vs 4" in out
