"""The options of each panel kind: one spec model per kind (a dashboard YAML's panel is validated against the
model of its ``kind``; the kind's data and draw functions read its fields). Registered with the kinds in
:mod:`.curves`, :mod:`.finals` and :mod:`.dynamics`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationInfo, model_validator

from ablate.reports.panels.base import AxisList, AxisName, Listed, PanelSpec, StrList, XColumn, grid_axes

__all__ = [
    "EnsembleBars",
    "FinalHeatmap",
    "IterationsToTarget",
    "LambdaHatCurves",
    "LossVsFixedLambda",
    "LossVsFloor",
    "R2BlocksVsLambda",
    "R2Curves",
    "SimilarityHistograms",
]


# --------------------------------------------------------------------------- curves during training
class R2Curves(PanelSpec):
    """r2_curves: a metric against iterations, one line per grid point (mean over seeds, with a band)."""

    kind: Literal["r2_curves"]
    y: StrList = Field(default=["r2"], description="metric column(s) or glob pattern(s), e.g. r2_lambda_*")
    x: XColumn = Field(default="step", description="x axis")
    color: AxisList = Field(default=[], description="axis (or axes) giving the line colour")
    facet: AxisList = Field(default=[], description="axis (or axes) giving one subplot per value")
    log_x: bool = Field(default=False, description="log-scale x axis")
    band: Literal["minmax", "ci95"] = Field(
        default="minmax", description="minmax: min–max over seeds; ci95: the mean's 95 % t interval (≥ 2 seeds)"
    )


class LambdaHatCurves(PanelSpec):
    """lambda_hat_curves: each learned Λ̂ᵢ against iterations, the true Λ dashed."""

    kind: Literal["lambda_hat_curves"]
    x: XColumn = Field(default="step", description="x axis")
    facet: AxisList = Field(default=[], description="axes giving one subplot per value (default: every axis)")
    max_facets: int = Field(default=9, ge=1, description="at most this many subplots")
    log_y: bool = Field(default=False, description="log-scale Λ̂ axis")


class LossVsFloor(PanelSpec):
    """loss_vs_floor: the loss on fresh batches against its floor."""

    kind: Literal["loss_vs_floor"]
    loss: Literal["eval_loss", "loss"] = Field(default="eval_loss", description="loss column")
    x: XColumn = Field(default="step", description="x axis")
    color: AxisList = Field(default=[], description="axis (or axes) giving the line colour")
    facet: AxisList = Field(default=[], description="axis (or axes) giving one subplot per value")
    log_y: bool = Field(default=False, description="log-scale loss axis")


# --------------------------------------------------------------------------- final values
class FinalHeatmap(PanelSpec):
    """final_heatmap: the final value of a metric over two grid axes."""

    kind: Literal["final_heatmap"]
    x: AxisName = Field(description="axis on x")
    y: AxisName = Field(description="axis on y")
    metric: str = Field(default="r2", description="metric column")
    facet: AxisList = Field(default=[], description="axis (or axes) giving one heatmap per value")

    @model_validator(mode="after")
    def _two_axes(self) -> FinalHeatmap:
        if self.x == self.y:
            raise ValueError(f".y: must differ from x ({self.x!r})")
        return self


class R2BlocksVsLambda(PanelSpec):
    """r2_blocks_vs_lambda: final R² of the fixed and the varied Λ block against Λ₂."""

    kind: Literal["r2_blocks_vs_lambda"]
    color: AxisList = Field(default=[], description="axis separating the losses (e.g. variant)")
    log_x: bool = Field(default=True, description="log-scale Λ₂ axis")


class LossVsFixedLambda(PanelSpec):
    """loss_vs_fixed_lambda: the final loss of runs with Λ̂ held fixed, against that Λ̂."""

    kind: Literal["loss_vs_fixed_lambda"]
    metric: Literal["eval_loss", "loss"] = Field(default="eval_loss", description="loss column")
    color: AxisList = Field(default=[], description="axis (or axes) giving one line per value")
    log_x: bool = Field(default=False, description="log-scale Λ̂ axis")


class EnsembleBars(PanelSpec):
    """ensemble_bars: final R² per variant (mean ± std over seeds) with the paper's values."""

    kind: Literal["ensemble_bars"]
    x: AxisName = Field(default="variant", description="axis giving the bars")
    metric: str = Field(default="r2", description="metric column")
    paper_key: str | None = Field(
        default=None, description="entry of the grid's paper_values holding the values per bar"
    )
    paper_scale: float = Field(default=1.0, description="factor on the paper's values (0.01 for percentages)")
    order: list[Any] = Field(default=[], description="order of the bars")
    facet: AxisList = Field(default=[], description="axis (or axes) giving one subplot per value")


# --------------------------------------------------------------------------- learning dynamics
def _axis_or_target(name: str, info: ValidationInfo) -> str:
    axes = grid_axes(info)
    if axes is not None and name not in [*axes, "target"]:
        raise ValueError(f"{name!r} is not an axis of the grid; allowed: {', '.join([*axes, 'target'])}")
    return name


class IterationsToTarget(PanelSpec):
    """iterations_to_target: the first iteration at which R² reached each target."""

    kind: Literal["iterations_to_target"]
    x: Annotated[str, AfterValidator(_axis_or_target)] = Field(description="axis on x, or 'target'")
    targets: Annotated[list[Annotated[float, Field(gt=0, le=1)]], Listed] = Field(
        min_length=1, description="target R² values in (0, 1]"
    )
    color: AxisList = Field(default=[], description="axis (or axes) giving one line per value")
    log_y: bool = Field(default=True, description="log-scale iterations axis")


class SimilarityHistograms(PanelSpec):
    """similarity_histograms: cosine similarities of positive and negative pairs at the last report."""

    kind: Literal["similarity_histograms"]
    facet: AxisList = Field(default=[], description="axes giving one subplot per value (default: every axis)")
    max_facets: int = Field(default=9, ge=1, description="at most this many subplots")
