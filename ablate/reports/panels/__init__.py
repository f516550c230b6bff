"""Report panels, one module per family of kinds; each kind computes a tidy DataFrame first, then draws it.

Kinds (each one's options: its spec model in :mod:`.options`): r2_curves, lambda_hat_curves, loss_vs_floor (:mod:`.curves`);
final_heatmap, r2_blocks_vs_lambda, loss_vs_fixed_lambda, ensemble_bars (:mod:`.finals`);
iterations_to_target, similarity_histograms (:mod:`.dynamics`).
"""

from ablate.analysis.run import RunContext, final_rows
from ablate.reports.panels import curves, dynamics, finals  # noqa: F401 - registers the kinds
from ablate.reports.panels.base import (
    PANELS,
    X_COLUMNS,
    PanelKind,
    PanelResult,
    PanelSpec,
    apply_where,
    compute_panels,
    panel_data,
    panel_figure,
    panel_spec,
)

__all__ = [
    "PANELS",
    "X_COLUMNS",
    "PanelKind",
    "PanelResult",
    "PanelSpec",
    "RunContext",
    "apply_where",
    "compute_panels",
    "final_rows",
    "panel_data",
    "panel_figure",
    "panel_spec",
]
