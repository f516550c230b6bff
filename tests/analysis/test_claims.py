"""The claims evaluator: each claim on hand-built tables with a known verdict, and one real smoke run."""

from __future__ import annotations

import pandas as pd
import pytest

from ablate import cli
from ablate.analysis import claims
from ablate.analysis.run import RunContext
from ablate.config import RunConfig


def table(trials: list[dict], grid: str = "") -> pd.DataFrame:
    """A results table like load_results': one row per trial per report.

    Each trial is ``{"id": ..., "axes": {...}, "seed": s, "reports": [{"step": .., metric: ..}, ...]}``.
    """
    rows = []
    for t in trials:
        for i, rep in enumerate(t["reports"], start=1):
            rows.append(
                {
                    "trial_id": t["id"],
                    "status": "TERMINATED",
                    **t.get("axes", {}),
                    "seed": t.get("seed", 0),
                    "training_iteration": i,
                    **rep,
                }
            )
    df = pd.DataFrame(rows)
    df.attrs.update({"grid": grid, "scale": "test"})
    return df


def ctx_for(df: pd.DataFrame, axes: list[str], configs: dict[str, RunConfig] | None = None) -> RunContext:
    return RunContext(grid=df.attrs["grid"], axes=axes, configs=configs or {})


def final(**metrics) -> list[dict]:
    """A single final report at step 100."""
    return [{"step": 100, **metrics}]


# --------------------------------------------------------------------------- result type
def test_verdict_combines_checks():
    ok, bad, unknown = (claims.Check("c", "v", "r", p) for p in (True, False, None))
    make = lambda checks: claims.ClaimResult(0, "t", "f", "p", "v", checks)  # noqa: E731
    assert make([ok, ok]).status == "PASS"
    assert make([ok, bad, unknown]).status == "FAIL"
    assert make([ok, unknown]).status == "NOT MEASURED"
    assert make([]).status == "NOT MEASURED"


def test_statistics_helpers():
    assert claims.fmt_ms([0.5]) == "0.500 (1 seed)"
    assert claims.fmt_ms([0.4, 0.6]) == "0.500 ± 0.141 (2 seeds)"
    assert claims.fmt_ms([]) == "n/a"
    assert claims.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert claims.spearman([1, 2, 3], [1, 1, 1]) != claims.spearman([1, 2, 3], [1, 1, 1])  # nan: undecidable
    assert claims.spearman([1, 2, 3], [1, float("inf"), float("inf")]) > 0  # never reached ranks highest


# --------------------------------------------------------------------------- claim 1
def _anisotropy(an_style: float) -> tuple[pd.DataFrame, RunContext]:
    trials, configs = [], {}
    for lam2, inf_style in ((5, 0.9), (50, 0.5), (200, 0.1)):
        for variant, style, content in (("infonce", inf_style, 0.95), ("aninfonce", an_style, 0.97)):
            tid = f"{variant}{lam2}"
            metrics = {"r2_lambda_5": style} if lam2 == 5 else {"r2_lambda_5": style, f"r2_lambda_{lam2}": content}
            trials.append(
                {
                    "id": tid,
                    "axes": {"concentration": f"5/{lam2}", "variant": variant},
                    "reports": final(r2=style, **metrics),
                }
            )
            configs[tid] = RunConfig(concentration=f"5/{lam2}", loss=variant)
    df = table(trials, "anisotropy")
    return df, ctx_for(df, ["concentration", "variant"], configs)


def test_claim1_passes_when_only_infonce_loses_the_style_block():
    res = claims.claim_anisotropy(*_anisotropy(an_style=0.96))
    assert res.status == "PASS", claims.text_report([res])
    assert "ρ=-1.00" in res.checks[0].value


def test_claim1_fails_when_aninfonce_loses_a_block():
    res = claims.claim_anisotropy(*_anisotropy(an_style=0.6))
    assert [c.passed for c in res.checks] == [True, False]


# --------------------------------------------------------------------------- claim 2
def _bimodal(content_first: bool, with_lambda: bool = True) -> pd.DataFrame:
    trials = []
    for seed in (0, 1):
        reports = []
        for step, (early, late) in zip((100, 200, 300), ((0.6, 0.3), (0.95, 0.8), (0.999, 0.995))):
            content, style = (early, late) if content_first else (late, early)
            rep = {
                "step": step,
                "r2": (content + style) / 2,
                "r2_lambda_5": style,
                "r2_lambda_25": content,
                "eval_loss": 3.03,
                "loss_floor": 3.0,
            }
            if with_lambda:
                rep["lambda_max_rel_error"] = 0.1
            reports.append(rep)
        trials.append({"id": f"s{seed}", "seed": seed, "reports": reports})
    return table(trials, "bimodal_dynamics")


def test_claim2_passes_on_a_converged_run_with_content_first():
    df = _bimodal(content_first=True)
    res = claims.claim_bimodal(df, ctx_for(df, []))
    assert res.status == "PASS", claims.text_report([res])


def test_claim2_fails_when_style_comes_first():
    df = _bimodal(content_first=False)
    res = claims.claim_bimodal(df, ctx_for(df, []))
    assert res.status == "FAIL"
    assert [c.name for c in res.checks if c.passed is False] == ["content block first"]


def test_claim2_missing_metric_is_not_measured_never_a_pass():
    df = _bimodal(content_first=True, with_lambda=False)
    res = claims.claim_bimodal(df, ctx_for(df, []))
    assert res.status == "NOT MEASURED"
    assert res.checks[-1].passed is None


# --------------------------------------------------------------------------- claim 3
def _linear(an: float, inf: float, rho: float | None = None) -> pd.DataFrame:
    lam = {f"r2_lambda_{v}": 0.5 for v in range(5, 51, 5)}
    extra = {} if rho is None else {"lambda_rank_corr": rho}
    trials = [
        {
            "id": v,
            "axes": {"concentration": "linspace 5..50", "variant": v},
            "reports": final(r2=r, **lam, **(extra if v == "aninfonce" else {})),
        }
        for v, r in (("aninfonce", an), ("infonce", inf))
    ]
    return table(trials, "linear_lambda")


def test_claim3_without_the_rank_metric_is_not_measured_and_the_gap_is():
    df = _linear(0.99, 0.77)
    res = claims.claim_linear_lambda(df, ctx_for(df, ["concentration", "variant"]))
    assert [c.passed for c in res.checks] == [None, True]
    assert res.status == "NOT MEASURED"


def test_claim3_matched_rank_correlation_decides():
    df = _linear(0.99, 0.77, rho=0.95)
    res = claims.claim_linear_lambda(df, ctx_for(df, ["concentration", "variant"]))
    assert [c.passed for c in res.checks] == [True, True] and res.status == "PASS"
    df = _linear(0.99, 0.77, rho=0.6)
    res = claims.claim_linear_lambda(df, ctx_for(df, ["concentration", "variant"]))
    assert res.checks[0].passed is False and res.status == "FAIL"
    df = _linear(0.80, 0.78)
    res = claims.claim_linear_lambda(df, ctx_for(df, ["concentration", "variant"]))
    assert res.status == "FAIL"


# --------------------------------------------------------------------------- claim 4
def _batch_vs_dim(trend: int) -> pd.DataFrame:
    trials = []
    for d in (4, 8, 16):
        for b in (64, 1024):
            top = 0.95 - trend * 0.02 * d + trend * 0.00002 * b
            curve = [
                {"step": s, "r2": top * f} for s, f in ((100, 0.5 + 0.02 * (16 - d) * trend), (200, 0.9), (300, 1.0))
            ]
            trials.append({"id": f"{d}-{b}", "axes": {"batch_size": b, "latent_dim": d}, "reports": curve})
    return table(trials, "batch_vs_dim")


def test_claim4_passes_with_the_papers_signs():
    df = _batch_vs_dim(+1)
    res = claims.claim_batch_vs_dim(df, ctx_for(df, ["batch_size", "latent_dim"]))
    assert res.status == "PASS", claims.text_report([res])


def test_claim4_fails_with_reversed_signs():
    df = _batch_vs_dim(-1)
    res = claims.claim_batch_vs_dim(df, ctx_for(df, ["batch_size", "latent_dim"]))
    assert res.checks[0].passed is False and res.checks[1].passed is False
    assert res.status == "FAIL"


# --------------------------------------------------------------------------- claim 5
def _batch_vs_lambda(r2: dict[tuple[int, int], float]) -> pd.DataFrame:
    trials = [
        {"id": f"{b}-{lam}", "axes": {"batch_size": b, "concentration": lam}, "reports": final(r2=v)}
        for (b, lam), v in r2.items()
    ]
    return table(trials, "batch_vs_lambda")


def test_claim5_larger_lambda_needs_larger_batch():
    good = {(64, 25): 0.6, (1024, 25): 0.9, (64, 250): 0.4, (1024, 250): 0.75}
    df = _batch_vs_lambda(good)
    res = claims.claim_batch_vs_lambda(df, ctx_for(df, ["batch_size", "concentration"]))
    assert res.status == "PASS", claims.text_report([res])
    bad = {(64, 25): 0.4, (1024, 25): 0.75, (64, 250): 0.6, (1024, 250): 0.9}
    df = _batch_vs_lambda(bad)
    res = claims.claim_batch_vs_lambda(df, ctx_for(df, ["batch_size", "concentration"]))
    assert res.status == "FAIL"
    assert res.checks[2].passed is False


# --------------------------------------------------------------------------- claim 6
def _hard_negatives(best_fixed: float, ft: float) -> tuple[pd.DataFrame, RunContext]:
    trials, configs = [], {}
    base = {
        "loss": "aninfonce",
        "latent_dim": 20,
        "concentration": 150,
        "negative_concentration": 100,
        "n_hard_negatives": 3,
    }
    for fixed in (25.0, 50.0, 100.0, 150.0):
        tid = f"hn{fixed:g}"
        loss = 1.0 + abs(fixed - best_fixed) / 100
        trials.append(
            {
                "id": tid,
                "axes": {"fixed_lambda_hat": fixed, "variant": "hn_only"},
                "reports": final(r2=0.5, eval_loss=loss),
            }
        )
        configs[tid] = RunConfig(**base, fixed_lambda_hat=fixed, batch_negatives=False)
    for variant, r2 in (("finetune_hn", ft), ("continue_plain", 0.6)):
        trials.append(
            {
                "id": variant,
                "axes": {"fixed_lambda_hat": None, "variant": variant},
                "reports": final(r2=r2, eval_loss=1.0),
            }
        )
    df = table(trials, "hard_negatives")
    return df, ctx_for(df, ["fixed_lambda_hat", "variant"], configs)


def test_claim6_passes_with_the_optimum_at_the_difference_and_finetuning_ahead():
    res = claims.claim_hard_negatives(*_hard_negatives(best_fixed=50, ft=0.7))
    assert res.status == "PASS", claims.text_report([res])


def test_claim6_fails_with_the_optimum_at_lambda_plus():
    res = claims.claim_hard_negatives(*_hard_negatives(best_fixed=150, ft=0.5))
    assert [c.passed for c in res.checks] == [False, False]


# --------------------------------------------------------------------------- claims 7, 8, 9
def _variants(grid: str, values: dict, axis_values: dict | None = None) -> pd.DataFrame:
    trials = []
    for key, r2 in values.items():
        variant, extra = (key, {}) if isinstance(key, str) else (key[0], {"concentration": key[1]})
        trials.append({"id": f"{variant}{extra}", "axes": {"variant": variant, **extra}, "reports": [r2]})
    return table(trials, grid)


def test_claim7_ensemble_ordering():
    df = _variants(
        "ensemble", {v: {"step": 1, "r2": r} for v, r in (("infonce", 0.48), ("aninfonce", 0.93), ("ensemble", 0.98))}
    )
    assert claims.claim_ensemble(df, ctx_for(df, ["variant"])).status == "PASS"
    df = _variants(
        "ensemble", {v: {"step": 1, "r2": r} for v, r in (("infonce", 0.48), ("aninfonce", 0.98), ("ensemble", 0.93))}
    )
    assert claims.claim_ensemble(df, ctx_for(df, ["variant"])).status == "FAIL"


def test_claim8_tricl_gap_largest_when_anisotropic():
    def run(iso_gap: float, aniso_gap: float) -> claims.ClaimResult:
        df = _variants(
            "tricl",
            {
                ("aninfonce", "100"): {"step": 1, "r2": 0.6 + iso_gap, "r2_lambda_100": 0.6 + iso_gap},
                ("tricl", "100"): {"step": 1, "r2": 0.6, "r2_lambda_100": 0.6},
                ("aninfonce", "15/250"): {"step": 1, "r2": 0.5 + aniso_gap, "r2_lambda_15": 0.5, "r2_lambda_250": 0.9},
                ("tricl", "15/250"): {"step": 1, "r2": 0.5, "r2_lambda_15": 0.1, "r2_lambda_250": 0.9},
            },
        )
        return claims.claim_tricl(df, ctx_for(df, ["concentration", "variant"]))

    assert run(0.1, 0.4).status == "PASS"
    assert run(0.3, 0.1).status == "FAIL"
    assert run(-0.1, 0.4).checks[0].passed is False


def test_claim9_zimmermann_threshold_and_missing_row():
    df = _variants("zimmermann_sphere", {"vmf_kappa1": {"step": 1, "r2": 0.995}})
    assert claims.claim_zimmermann(df, ctx_for(df, ["variant"])).status == "PASS"
    df = _variants("zimmermann_sphere", {"vmf_kappa1": {"step": 1, "r2": 0.38}})
    assert claims.claim_zimmermann(df, ctx_for(df, ["variant"])).status == "FAIL"
    df = _variants("zimmermann_sphere", {"vmf_kappa10": {"step": 1, "r2": 0.999}})
    assert claims.claim_zimmermann(df, ctx_for(df, ["variant"])).status == "NOT MEASURED"


def test_markdown_row_names_the_command():
    df = _variants("zimmermann_sphere", {"vmf_kappa1": {"step": 1, "r2": 0.38}})
    df.attrs["scale"] = "laptop"
    res = claims.evaluate_frame(df, ctx_for(df, ["variant"]))
    text = claims.markdown_table(res)
    assert "`ablate run zimmermann_sphere --scale laptop && ablate report runs/zimmermann_sphere-laptop`" in text
    assert "**FAIL**" in text and text.count("\n") == 2


# --------------------------------------------------------------------------- a real run
def test_evaluate_run_on_a_real_smoke_run(ray_session, tmp_path, capsys):
    from ablate.service.execution.runner import run_grid
    from ablate.service.specs.grids import load_grid

    outcome = run_grid(load_grid("bimodal_dynamics", "smoke"), storage=str(tmp_path), verbose=0)
    assert not outcome.failed
    results = claims.evaluate_run(outcome.run_dir)
    assert [r.claim for r in results] == [2]
    res = results[0]
    assert res.grid == "bimodal_dynamics" and res.scale == "smoke"
    assert res.wall_s is not None and res.wall_s >= 0
    assert len(res.checks) == 4
    assert res.checks[0].passed is False  # 10 steps of a 2-d encoder cannot reach R² 0.99
    assert res.status == "FAIL", "one failed check makes the claim fail"
    assert cli.main(["claims", str(outcome.run_dir), "--markdown"]) == 0
    assert "| 2 | Bimodal" in capsys.readouterr().out


def test_the_command_of_a_preset_run_names_the_preset_and_its_run_directory():
    assert claims.command("bimodal_dynamics", "laptop") == (
        "ablate run bimodal_dynamics --scale laptop && ablate report runs/bimodal_dynamics-laptop"
    )
    assert claims.command("bimodal_dynamics", "laptop", "fast") == (
        "ablate run bimodal_dynamics --scale laptop --preset fast && ablate report runs/bimodal_dynamics-laptop-fast"
    )


# --------------------------------------------------------------------------- trials that did not finish
def test_claims_leave_out_trials_that_did_not_finish_and_say_which(tmp_path, capsys):
    """issue 36: claims pooled an interrupted trial's last step with finished trials' final values, and dropped an
    errored one's (its last row holds only the error) without a word. A claim reads the finished trials only, its
    criterion unchanged; its text, its markdown row and its dict name the others with why."""
    from unfinished_runs import ERRORED, INTERRUPTED, LEFT_OUT, unfinished_run

    run = str(unfinished_run(tmp_path / "run"))
    (res,) = claims.evaluate_run(run)
    assert res.left_out == LEFT_OUT and res.to_dict()["left_out"] == LEFT_OUT
    assert res.criterion == "final R²: InfoNCE < AnInfoNCE < ensemble (means over seeds)"
    # aninfonce: the two finished seeds (pooled, the interrupted one's 0.2 at step 10 made it 0.680 ± 0.416)
    assert res.value == "infonce 0.490 ± 0.026 (3 seeds) / aninfonce 0.920 ± 0.014 (2 seeds) / ensemble 0.980 (1 seed)"
    assert res.status == "PASS"

    assert cli.main(["claims", run]) == 0
    out = capsys.readouterr().out
    (line,) = [x.strip() for x in out.splitlines() if "left out" in x]
    assert line.startswith("left out: 2 trial(s) that did not finish (a last report before the end is not a final")
    assert f"{INTERRUPTED} (interrupted at step 10)" in line and f"{ERRORED} (errored at step 20)" in line

    assert cli.main(["claims", run, "--markdown"]) == 0
    (row,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("| 7 |")]
    result = row.split(" | ")[6]
    assert result.startswith("**PASS**; left out: 2 trial(s) that did not finish")
    assert f"{INTERRUPTED} (interrupted at step 10)" in result and f"{ERRORED} (errored at step 20)" in result


def test_a_claim_whose_data_did_not_finish_is_not_measured_and_says_why(tmp_path):
    """With no ensemble trial finished the ordering lacks a variant: not measured, as for any missing variant (the
    interrupted ensemble seed's R² at step 10 made it a FAIL before), saying that trials were left out."""
    from unfinished_runs import unfinished_run

    (res,) = claims.evaluate_run(unfinished_run(tmp_path / "run", ensemble_finished=False))
    assert res.status == "NOT MEASURED"
    assert set(res.left_out) == {"aninfonce_2", "ensemble_0", "ensemble_1"}
    assert (
        res.checks[0].value == "not measured: needs the three variants (3 trial(s) that did not finish were left out)"
    )
    assert res.criterion == "final R²: InfoNCE < AnInfoNCE < ensemble (means over seeds)"


def test_each_claim_names_only_the_trials_it_reads_that_did_not_finish(tmp_path, capsys):
    """A linear_lambda run decides claim 3 on Λ 5 → 50 and its second row on 5 → 25. Each names only its own
    unfinished trial (AnInfoNCE at 5 → 50 interrupted; InfoNCE at 5 → 25 errored), never the other claim's, nor
    InfoNCE at τ = 0.2, which neither claim reads; each is decided on its own range's finished seeds."""
    from unfinished_runs import LINEAR_LEFT_OUT, linear_lambda_run

    run = str(linear_lambda_run(tmp_path / "run"))
    results = claims.evaluate_run(run)
    assert [r.title.split(":")[0] for r in results] == [
        "Λ linearly spaced 5 → 50",
        "Λ linearly spaced 5 → 25 (the public MLP run)",
    ]
    for top, res in zip((50, 25), results):
        assert res.left_out == LINEAR_LEFT_OUT[top], top
        assert res.status == "PASS", (top, res.checks)
    assert "AnInfoNCE 0.980 ± 0.014 (2 seeds) vs InfoNCE 0.770 ± 0.028 (2 seeds)" in results[0].checks[1].value
    assert "AnInfoNCE 0.970 ± 0.014 (2 seeds) vs InfoNCE 0.790 ± 0.014 (2 seeds)" in results[1].checks[1].value

    assert cli.main(["claims", run]) == 0
    blocks = capsys.readouterr().out.split("claim 3 [")[1:]
    assert len(blocks) == 2
    for top, block in zip((50, 25), blocks):
        (line,) = [x.strip() for x in block.splitlines() if "left out" in x]
        ((trial, why),) = LINEAR_LEFT_OUT[top].items()
        assert line.startswith("left out: 1 trial(s) that did not finish (") and line.endswith(f": {trial} ({why})")
