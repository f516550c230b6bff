"""One typed, validated configuration per run (`RunConfig`), shared by the CLI, Trainable and reports.

Defaults follow the public reference implementation (Zimmermann et al. 2021 / Rusak et al. 2024):
d = 10, batch 1000, Adam with lr 1e-4 (encoder) and 1e-3 (Λ̂), rejection threshold 0.1, a report every
250 steps, 4096 evaluation samples.

Λ ("concentration") can be given as
- a number: the same Λ in every dimension;
- a list of length ``latent_dim``;
- a named pattern: ``{"blocks": [5, 25]}`` (equal blocks, here 5 then 25), ``"5/25"`` (the same),
  or ``{"linspace": [5, 50]}`` (linearly spaced from 5 to 50).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ablate import plugins
from ablate.messages import QUOTE_LIMIT, ConfigError, describe_validation, did_you_mean, quote
from ablate.safe_yaml import YamlRefused, yaml_loader, yaml_refusal

__all__ = [
    "QUOTE_LIMIT",
    "did_you_mean",
    "quote",
    "unknown_setting",
    "ConfigError",
    "BUILTIN_PARTS",
    "LATER_FIELDS",
    "LOSS_NAMES",
    "REFERENCE_WIDTHS",
    "RESUME_MAY_CHANGE",
    "RunConfig",
    "TRAINING_FIELDS",
    "parse_assignments",
    "resolve_concentration",
]

#: The loss names a config may use (``RunConfig.loss``), defined here only: the loss registry
#: (:data:`ablate.core.losses.LOSSES`) holds one entry for each and checks that at import.
LOSS_NAMES = ("aninfonce", "infonce", "ensemble_aninfonce", "tricl")

#: The built-in names of each kind of part; any other name is a plugin's (:mod:`ablate.plugins`).
BUILTIN_PARTS = {
    "loss": LOSS_NAMES,
    "conditional": ("normal", "vmf"),
    "generator": ("invertible_mlp",),
    "encoder": ("mlp",),
}

#: Science fields added after runs existed (a part's name or a plugin's options; the sampler), with the value those
#: runs used: left out of :meth:`RunConfig.science` while they hold it, so the keys of earlier runs do not change.
LATER_FIELDS = {
    "loss_options": {},
    "conditional_options": {},
    "generator": "invertible_mlp",
    "generator_options": {},
    "encoder": "mlp",
    "encoder_options": {},
    "sampler": "adaptive",
}

#: Settings a run may change when it resumes from a checkpoint: its budget, how often and how finely it reports,
#: and where it runs. Every other field is a science field (:meth:`RunConfig.science_fields`).
RESUME_MAY_CHANGE = frozenset({"max_steps", "report_every", "target_r2", "device", "eval_samples", "prefetch"})

#: How a run trains (optimiser, schedule, batch, encoder width), as opposed to what it studies (the DGP, g, the
#: loss and its settings, the seeds). A preset sets only these and :data:`RESUME_MAY_CHANGE` (tests/service/specs/test_presets.py).
#: They are still science fields: a checkpoint resumes only with the values it was written with.
TRAINING_FIELDS = frozenset({"lr", "lr_lambda", "lr_schedule", "warmup_steps", "batch_size", "encoder_widths"})

#: Hidden widths of the reference encoder as multiples of the latent dim (d→10d→50d→50d→50d→50d→10d→d): the
#: default of ``RunConfig.encoder_widths`` and of :class:`ablate.core.encoder.Encoder`.
REFERENCE_WIDTHS: tuple[int, ...] = (10, 50, 50, 50, 50, 10)

ConcentrationSpec = float | list[float] | str | dict[str, list[float]]


def unknown_setting(key: str) -> str:
    """What to say about a key that is not a :class:`RunConfig` field: the closest field, then every one."""
    return f"unknown setting{did_you_mean(key, RunConfig.model_fields)}; allowed: {', '.join(sorted(RunConfig.model_fields))}"


def resolve_concentration(spec: ConcentrationSpec, d: int, field: str = "concentration") -> list[float]:
    """Expand a Λ spec (number, list, ``"a/b"``, ``{"blocks": [...]}``, ``{"linspace": [lo, hi]}``) to d values."""
    if isinstance(spec, bool):
        raise ConfigError(f"{field}: expected a number, a list of {d} numbers or a pattern, got {quote(spec)}")
    if isinstance(spec, int | float):
        values = [float(spec)] * d
    elif isinstance(spec, str):
        try:
            blocks = [float(p) for p in spec.split("/")]
        except ValueError:
            raise ConfigError(f"{field}: pattern {quote(spec)} is not of the form 'a/b[/c…]' (e.g. '5/25')") from None
        values = _blocks(blocks, d, field)
    elif isinstance(spec, list):
        if len(spec) != d:
            raise ConfigError(f"{field}: a list of Λ must have latent_dim={d} entries, got {len(spec)}")
        values = [float(v) for v in spec]
    elif isinstance(spec, dict):
        if set(spec) == {"blocks"}:
            values = _blocks([float(v) for v in spec["blocks"]], d, field)
        elif set(spec) == {"linspace"}:
            lo_hi = spec["linspace"]
            if len(lo_hi) != 2:
                raise ConfigError(f"{field}.linspace: expected [low, high], got {quote(lo_hi)}")
            lo, hi = float(lo_hi[0]), float(lo_hi[1])
            values = [lo + (hi - lo) * i / (d - 1) for i in range(d)]
        else:
            raise ConfigError(
                f"{field}: unknown pattern keys {quote(sorted(map(str, spec)))}; allowed: 'blocks' or 'linspace'"
            )
    else:
        raise ConfigError(f"{field}: expected a number, a list of {d} numbers or a pattern, got {quote(spec)}")
    bad = [v for v in values if not (v > 0 and math.isfinite(v))]
    if bad:
        raise ConfigError(f"{field}: Λ must be a finite number > 0 in every dimension, got {bad[0]:g}")
    return values


def _blocks(blocks: list[float], d: int, field: str) -> list[float]:
    if not blocks:
        raise ConfigError(f"{field}.blocks: needs at least one value")
    if d % len(blocks):
        raise ConfigError(f"{field}.blocks: latent_dim={d} does not split into {len(blocks)} equal blocks")
    size = d // len(blocks)
    return [v for v in blocks for _ in range(size)]


class RunConfig(BaseModel):
    """Everything that defines one synthetic training run. Every field has a documented default.

    Not Ray's ``ray.tune.RunConfig`` (where a Tune experiment is stored, its checkpoints and callbacks; only
    :mod:`ablate.service.execution.runner` builds one, always as ``tune.RunConfig``): this is ablate's config of one run,
    the same object for the CLI, the Trainable, the exported columns and the report.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    # --- randomness
    seed: int = Field(default=0, description="seed for encoder init, Λ̂ init, training data and evaluation")
    generator_seed: int | None = Field(
        default=None, description="seed of the generator g; None = use `seed`. Fix it to share one g across trials"
    )

    # --- data generating process
    latent_dim: int = Field(default=10, ge=2, description="latent dimension d (latents on S^(d-1))")
    concentration: ConcentrationSpec = Field(
        default="5/25",
        description="Λ of the positive conditional: number, list of d, 'a/b', {blocks: [...]}, {linspace: [lo, hi]}",
    )
    conditional: str = Field(
        default="normal",
        description="positive conditional: projected normal N(0, Λ⁻¹), von Mises–Fisher(κ) ('vmf'), or a plugin's",
    )
    conditional_options: dict[str, Any] = Field(
        default_factory=dict, description="keyword options of a plugin conditional's factory"
    )
    kappa: float = Field(default=1.0, gt=0, description="vMF concentration κ (conditional = 'vmf' only)")
    threshold: float | None = Field(
        default=0.1, gt=0, description="reject draws with |‖z+ε‖−1| ≥ threshold (reference: 0.1); null = none"
    )
    sampler: Literal["adaptive", "fixed"] = Field(
        default="adaptive", description="normal conditional's rejection sampler: the papers' 'adaptive' rounds, or "
        "'fixed' shapes (the same law, another data stream, one host read per batch: for GPUs)",
    )  # fmt: skip
    negative_concentration: ConcentrationSpec | None = Field(
        default=None, description="Λ⁻ of hard negatives (Cor. B.1); null = no hard negatives"
    )
    n_hard_negatives: int = Field(default=0, ge=0, description="hard negatives per sample (needs Λ⁻)")
    hard_negatives_from_step: int = Field(
        default=0, ge=0, description="use hard negatives only from this step on (fine-tuning, Fig. 10B)"
    )
    batch_negatives: bool = Field(
        default=True, description="with hard negatives, also use the other 2B−2 batch encodings as negatives"
    )
    ensemble: list[ConcentrationSpec] | None = Field(
        default=None, description="Λⁱ of k DGPs sharing g (Cor. B.2); needs loss 'ensemble_aninfonce'"
    )

    # --- generator g
    generator: str = Field(
        default="invertible_mlp", description="g: the papers' invertible MLP ('invertible_mlp'), or a plugin's"
    )
    generator_options: dict[str, Any] = Field(
        default_factory=dict, description="keyword options of a plugin generator's factory"
    )
    generator_layers: int = Field(default=3, ge=1, description="linear layers of g")
    generator_cond_quantile: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="each layer of g must have a condition number at most entry int(samples·quantile) of a sorted "
        "pool of random draws; 0 = the pool's minimum, the papers' setting (reference main_mlp.py: "
        "cond_thresh_ratio=0.0); larger values give a harder-to-invert g (an ablation)",
    )
    generator_cond_samples: int = Field(
        default=25_000, ge=10, description="random draws in that pool (papers: 25 000, n_iter_cond_thresh=25000)"
    )

    # --- encoder f
    encoder: str = Field(default="mlp", description="f: the reference MLP ('mlp'), or a plugin's")
    encoder_options: dict[str, Any] = Field(
        default_factory=dict, description="keyword options of a plugin encoder's factory"
    )
    encoder_widths: list[int] = Field(
        default=list(REFERENCE_WIDTHS),
        description=f"hidden widths as multiples of d (reference: {','.join(map(str, REFERENCE_WIDTHS))})",
    )
    normalize_output: bool = Field(default=True, description="L2-normalise the encoder output")

    # --- loss
    loss: str = Field(
        default="aninfonce",
        description=f"training loss: {', '.join(LOSS_NAMES)}, an installed plugin's name (entry point group "
        "ablate.losses), or a factory as 'package.module:attr'",
    )
    loss_options: dict[str, Any] = Field(default_factory=dict, description="keyword options of a plugin loss's factory")
    tau: float = Field(default=1.0, gt=0, description="InfoNCE temperature τ")
    infonce_layout: Literal["symmetric", "reference"] = Field(
        default="symmetric",
        description="InfoNCE batch layout: 'symmetric' (2B anchors, 2B−2 negatives each) or 'reference' (cl-ica's: "
        "B anchors of view 1, negatives = all of view 1 including the anchor itself, positive appended)",
    )
    fixed_lambda_hat: float | list[float] | None = Field(
        default=None, description="hold Λ̂ at this value instead of learning it (e.g. Fig. 10A sweeps)"
    )
    lambda_hat_init_std: float = Field(default=0.1, ge=0, description="θ₀ ~ N(0, std²), Λ̂ = softplus(θ)")
    tricl_decorrelation: float = Field(default=1.0, ge=0, description="weight of TriCL's decorrelation penalty")

    # --- optimisation
    batch_size: int = Field(default=1000, ge=2, description="samples per step (each gives two views)")
    lr: float = Field(default=1e-4, gt=0, description="Adam learning rate of the encoder")
    lr_lambda: float = Field(default=1e-3, gt=0, description="Adam learning rate of Λ̂ (and TriCL's S)")
    lr_schedule: Literal["constant", "cosine"] = Field(
        default="constant", description="learning-rate schedule over max_steps (both groups)"
    )
    warmup_steps: int = Field(default=0, ge=0, description="linear warm-up steps before the schedule")

    # --- budget and reporting
    max_steps: int = Field(default=10_000, ge=1, description="training steps of the run (the stop rule)")
    report_every: int = Field(default=250, ge=1, description="steps per report (one Ray Tune iteration)")
    eval_samples: int = Field(default=4096, ge=16, description="samples in each of the R² fit and score sets")
    target_r2: float | None = Field(default=None, gt=0, le=1, description="stop early once R² reaches this")

    # --- execution
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="'auto' = cuda when available")
    dtype: Literal["float32", "float64"] = Field(default="float32", description="training dtype")
    prefetch: bool = Field(
        default=True,
        description="on the CPU, draw the next batch in a second thread while a step runs (same numbers)",
    )

    @field_validator("concentration", "negative_concentration", mode="before")
    @classmethod
    def _numbers_are_floats(cls, v: Any) -> Any:
        return float(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("loss", "conditional", "generator", "encoder")
    @classmethod
    def _known_part(cls, name: str, info) -> str:
        """A built-in name, an installed plugin's (:mod:`ablate.plugins`), or ``package.module:attr``."""
        try:
            return plugins.check_name(info.field_name, name, BUILTIN_PARTS[info.field_name])
        except plugins.PluginError as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        d = self.latent_dim
        for kind, builtin in BUILTIN_PARTS.items():
            name = getattr(self, kind)
            options = getattr(self, f"{kind}_options")
            if name in builtin and options:
                raise ConfigError(
                    f"{kind}_options: the built-in {kind} {name!r} takes none (its settings are RunConfig's "
                    f"fields), got {sorted(options)}"
                )
        resolve_concentration(self.concentration, d, "concentration")
        if self.sampler != "adaptive" and self.conditional != "normal":
            raise ConfigError(
                f"sampler: {self.sampler!r} applies to the normal conditional only, got {self.conditional!r}"
            )
        if self.infonce_layout != "symmetric" and self.loss != "infonce":
            raise ConfigError(
                f"infonce_layout: {self.infonce_layout!r} applies to loss 'infonce' only, got {self.loss!r}"
            )
        if self.negative_concentration is not None:
            resolve_concentration(self.negative_concentration, d, "negative_concentration")
            if self.n_hard_negatives < 1:
                raise ConfigError("n_hard_negatives: must be >= 1 when negative_concentration is set")
            if self.loss != "aninfonce":
                raise ConfigError(f"loss: hard negatives need loss 'aninfonce', got {self.loss!r}")
        elif self.n_hard_negatives:
            raise ConfigError("negative_concentration: required when n_hard_negatives > 0")
        if self.loss == "ensemble_aninfonce":
            if not self.ensemble or len(self.ensemble) < 2:
                raise ConfigError("ensemble: loss 'ensemble_aninfonce' needs a list of at least 2 Λ specs")
            for i, spec in enumerate(self.ensemble):
                resolve_concentration(spec, d, f"ensemble[{i}]")
        elif self.ensemble is not None:
            raise ConfigError(f"ensemble: only used with loss 'ensemble_aninfonce', got loss {self.loss!r}")
        if self.fixed_lambda_hat is not None:
            if self.loss != "aninfonce":
                raise ConfigError("fixed_lambda_hat: only applies to loss 'aninfonce'")
            resolve_concentration(self.fixed_lambda_hat, d, "fixed_lambda_hat")
        if not self.encoder_widths or min(self.encoder_widths) < 1:
            raise ConfigError(f"encoder_widths: need positive multipliers, got {self.encoder_widths}")
        return self

    # --- derived values
    @property
    def lambda_true(self) -> list[float]:
        """Λ's diagonal (d values); for an ensemble, that of the first DGP."""
        if self.ensemble:
            return resolve_concentration(self.ensemble[0], self.latent_dim)
        return resolve_concentration(self.concentration, self.latent_dim)

    @property
    def lambda_ensemble(self) -> list[list[float]]:
        """Λⁱ of every DGP (one entry when there is no ensemble)."""
        if self.ensemble:
            return [resolve_concentration(s, self.latent_dim, f"ensemble[{i}]") for i, s in enumerate(self.ensemble)]
        return [self.lambda_true]

    @property
    def lambda_negative(self) -> list[float] | None:
        """Λ⁻'s diagonal, or None without hard negatives."""
        if self.negative_concentration is None:
            return None
        return resolve_concentration(self.negative_concentration, self.latent_dim, "negative_concentration")

    @property
    def lambda_optimum(self) -> list[float]:
        """The Λ̂ at which AnInfoNCE's loss is lowest: Λ⁺ − Λ⁻ with hard negatives (Cor. B.1), else Λ (for an
        ensemble, that of the first DGP). The one place this difference is computed."""
        neg = self.lambda_negative
        if neg is None:
            return self.lambda_true
        return [p - n for p, n in zip(self.lambda_true, neg)]

    @property
    def effective_generator_seed(self) -> int:
        """The seed g is built from."""
        return self.seed if self.generator_seed is None else self.generator_seed

    @classmethod
    def science_fields(cls) -> frozenset[str]:
        """The fields whose values must match for a run to resume from a checkpoint: every field but
        :data:`RESUME_MAY_CHANGE`.

        ``lr`` and ``batch_size`` are science fields too. The checkpoint holds Adam's moments built up at the rate
        it was trained with; continuing them at another rate is an optimisation that neither setting describes. Another batch size draws other samples from the same random
        stream from the first step after the resume on, so the run's data stream is neither run's. Either way the
        resumed run would no longer give the numbers of a run that never stopped, which is what resuming promises.
        """
        return frozenset(cls.model_fields) - RESUME_MAY_CHANGE

    def science(self) -> dict[str, Any]:
        """This config's values of :meth:`science_fields` (JSON-like), to compare with a checkpoint's; the
        :data:`LATER_FIELDS` that hold their earlier value are left out."""
        dump = self.model_dump(mode="json", include=set(self.science_fields()))
        return {k: v for k, v in dump.items() if k not in LATER_FIELDS or v != LATER_FIELDS[k]}

    @staticmethod
    def builtin_names(kind: str) -> tuple[str, ...]:
        """The built-in names of ``kind`` ('loss', 'conditional', 'generator', 'encoder')."""
        return BUILTIN_PARTS[kind]

    @classmethod
    def build(cls, values: dict[str, Any], source: str = "config") -> RunConfig:
        """Validate ``values``; any error becomes a :class:`ConfigError` naming ``source``, field and rule."""
        try:
            return cls(**values)
        except ValidationError as exc:
            raise ConfigError(f"{source}: " + describe_validation(exc, cls.model_fields)) from None
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None


def parse_assignments(items: list[str]) -> dict[str, Any]:
    """Parse ``key=value`` strings (values as YAML scalars/lists) into a dict for ``RunConfig``."""
    import yaml

    loader = yaml_loader()
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {quote(item)}: expected key=value")
        try:
            out[key.strip()] = yaml.load(raw, Loader=loader)  # noqa: S506 (a SafeLoader subclass)
        except (YamlRefused, RecursionError) as exc:
            raise ConfigError(f"--set {quote(key.strip())}: refused: {yaml_refusal(exc)}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {quote(key.strip())}: not a YAML value: {getattr(exc, 'problem', exc)}") from None
    return out
