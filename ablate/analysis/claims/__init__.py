"""The papers' claims checked against ablate's runs (docs/reproduction.md): see :mod:`.evaluate`."""

from ablate.analysis.claims.appendix import claim_ensemble, claim_hard_negatives, claim_tricl, claim_zimmermann
from ablate.analysis.claims.base import ITT_TARGETS, Check, ClaimResult
from ablate.analysis.claims.evaluate import (
    CLAIMS,
    command,
    evaluate_frame,
    evaluate_run,
    markdown_table,
    run_wall_s,
    text_report,
)
from ablate.analysis.claims.linear_lambda import claim_linear_lambda, claim_linear_lambda_public_run
from ablate.analysis.claims.main_text import (
    claim_anisotropy,
    claim_batch_vs_dim,
    claim_batch_vs_lambda,
    claim_bimodal,
)
from ablate.analysis.stats import fmt_ms, mean_sd, spearman

__all__ = [
    "CLAIMS",
    "ITT_TARGETS",
    "Check",
    "ClaimResult",
    "claim_anisotropy",
    "claim_batch_vs_dim",
    "claim_batch_vs_lambda",
    "claim_bimodal",
    "claim_ensemble",
    "claim_hard_negatives",
    "claim_linear_lambda",
    "claim_linear_lambda_public_run",
    "claim_tricl",
    "claim_zimmermann",
    "command",
    "evaluate_frame",
    "evaluate_run",
    "fmt_ms",
    "markdown_table",
    "mean_sd",
    "run_wall_s",
    "spearman",
    "text_report",
]
