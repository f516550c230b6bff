"""Each claim's threshold lives in one constant that both its criterion text and its verdict use, and the papers'
numbers a claim quotes come from its grid's ``paper_values``."""

from __future__ import annotations

from test_claims import _bimodal, _hard_negatives, ctx_for  # the hand-built tables of tests/analysis/test_claims.py

from ablate.analysis import claims
from ablate.analysis.claims import appendix, main_text
from ablate.analysis.run import RunContext


def test_a_threshold_moves_its_criterion_text_and_its_verdict_together(monkeypatch):
    df = _bimodal(content_first=True)  # final R² 0.997 (mean of the two blocks)
    first = claims.claim_bimodal(df, ctx_for(df, [])).checks[0]
    assert (first.criterion, first.passed) == ("final R² (mean over seeds) ≥ 0.99", True)
    monkeypatch.setattr(main_text, "BIMODAL_MIN_R2", 0.998)
    moved = claims.claim_bimodal(df, ctx_for(df, []))
    assert (moved.checks[0].criterion, moved.checks[0].passed) == ("final R² (mean over seeds) ≥ 0.998", False)
    assert moved.paper_value.startswith("R² → ≈ 1 (≥ 0.998)")
    monkeypatch.setattr(main_text, "FLOOR_GAP_MAX", 0.005)  # the tables' loss sits 1 % above its floor
    gap = claims.claim_bimodal(df, ctx_for(df, [])).checks[2]
    assert (gap.criterion, gap.passed) == ("(loss − floor) / floor ≤ 0.5 % at the end (mean over seeds)", False)


def test_claim6_tolerance_is_its_text_and_its_rule(monkeypatch):
    df, ctx = _hard_negatives(best_fixed=50, ft=0.7)
    assert "within 10 % of Λ⁺ − Λ⁻" in claims.claim_hard_negatives(df, ctx).checks[0].criterion
    monkeypatch.setattr(appendix, "OPTIMUM_TOLERANCE", 0.25)
    assert "within 25 % of Λ⁺ − Λ⁻" in claims.claim_hard_negatives(df, ctx).checks[0].criterion


def test_paper_numbers_come_from_the_grids_paper_values():
    df, ctx = _hard_negatives(best_fixed=50, ft=0.7)
    shipped = claims.claim_hard_negatives(df, ctx).paper_value  # the test context has none: the shipped grid's
    assert shipped.startswith("loss optimum at Λ̂ = Λ⁺ − Λ⁻ = 50 (Λ⁺ = 150, Λ⁻ = 100); fine-tuning with 3 hard")
    own = RunContext(
        ctx.grid, ctx.axes, ctx.configs, {"lambda_plus": 40, "lambda_minus": 10, "finetune_n_hard_negatives": 2}
    )
    assert claims.claim_hard_negatives(df, own).paper_value.startswith("loss optimum at Λ̂ = Λ⁺ − Λ⁻ = 30 (Λ⁺ = 40")
    linear = claims.claim_linear_lambda(df.iloc[0:0], RunContext("linear_lambda", [], {})).paper_value
    assert linear == (
        "AnInfoNCE R² 99.7 % (5→50) / 99.6 % (5→200), InfoNCE 77.4 % / 76.3 %; Λ̂ approaches Λ except Λ > 100"
    )
