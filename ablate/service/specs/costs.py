"""What one trial costs, estimated from its settings alone (no torch, no Ray): training FLOPs (to order a grid's
trials) and peak memory (to refuse, before Ray starts, a trial that cannot fit the machine; ablate.service.execution.memory).

The memory estimate follows what :mod:`ablate.core` allocates (see :func:`peak_memory`) and is calibrated against
the measured peak resident memory (VmHWM) of real trials; it is meant to be an upper bound, not a forecast.
"""

from __future__ import annotations

from dataclasses import dataclass

from ablate.config import RunConfig

__all__ = ["MemoryEstimate", "costliest_first", "peak_memory", "trial_cost"]


def trial_cost(config: RunConfig) -> float:
    """A trial's estimated training cost in FLOP-equivalents, used only to order trials. Per step: the
    encoder's forward and backward on both views (and the hard negatives); the loss's (2B)² similarities,
    whose elementwise passes (exp, log-sum-exp, their gradients) cost about as much as 32 more latent
    dimensions; and ~1e8 for the step's fixed costs (sampling, optimiser, Python); an ensemble loss runs all of
    it once per member (one batch per DGP). Calibrated on the laptop batch_vs_dim run of 2026-11-26 (2 CPU
    cores): it orders that grid's 9 trials as their measured times do, batch size first."""
    d, b = config.latent_dim, config.batch_size
    widths = [d, *(int(m) * d for m in config.encoder_widths), d]
    encoder = 6 * sum(w0 * w1 for w0, w1 in zip(widths, widths[1:])) * b * (2 + config.n_hard_negatives)
    members = len(config.ensemble) if config.loss == "ensemble_aninfonce" and config.ensemble else 1
    return float(config.max_steps) * members * (encoder + 6 * (2 * b) ** 2 * (d + 32) + 1e8)


def costliest_first(configs: list[RunConfig]) -> list[int]:
    """Indices of ``configs`` by estimated cost, largest first (ties keep the grid's order): started in this
    order, the slots run a longest-first schedule, and the grid does not end on one long trial running alone
    while the other slots idle (docs/performance.md, "Ray overhead")."""
    return sorted(range(len(configs)), key=lambda i: -trial_cost(configs[i]))


# ------------------------------------------------------------------------------------------- memory
#: Resident memory of a Ray trial process before it allocates its tensors (Python, torch, Ray's worker).
PROCESS_BASE = 700 << 20
#: On a GPU: the CUDA context and cuBLAS workspaces on the card, and the CUDA libraries in the trial's RAM.
GPU_CONTEXT = 1 << 30
GPU_HOST_BASE = 3 << 30
#: Headroom on the tensors: allocator caching and fragmentation, temporaries not modelled term by term.
MARGIN = 1.3
#: Logits in one row block of the CPU's fused loss (ablate.core.losses.pair.BLOCK_ELEMENTS).
_BLOCK = 1 << 18
#: The GPU uses the plain (2B)² loss up to this many logits (ablate.core.losses.base.GPU_PLAIN_MAX_LOGITS).
_GPU_PLAIN = 1 << 28
#: Anchors of the similarity histograms (ablate.core.experiment._OVERLAP_SAMPLES) and candidate matrices per
#: batch of g's construction (ablate.core.generator._BATCH, float64).
_OVERLAP, _G_BATCH = 1000, 2048


@dataclass(frozen=True)
class MemoryEstimate:
    """A trial's estimated peak memory in bytes: ``host`` (RAM) and ``device`` (GPU memory, 0 on the CPU), the
    phase that peaks (``peak_phase``) and the settings that drive it (``settings``, for the message)."""

    host: int
    device: int
    peak_phase: str
    settings: tuple[str, ...]

    @property
    def total(self) -> int:
        """The memory the trial's tensors live in: the card's on a GPU, else RAM."""
        return self.device or self.host


def peak_memory(config: RunConfig, gpu: bool = False) -> MemoryEstimate:
    """Upper estimate of one trial's peak memory (bytes) from its settings, on the CPU or (``gpu``) a GPU.

    With ``n = 2B`` encodings per DGP (k DGPs for an ensemble), M hard negatives per sample and widths w of the
    encoder, in floats of the trial's dtype, the largest of:
    - the training step: the encoder's saved activations and their gradients, ``(kn + BM)·(2Σw + 2 max w)``,
      plus the loss: on the CPU one row block of the fused loss (``max(2¹⁸, n)`` logits) and ``n × d``
      factors; on a GPU (plain loss up to 2²⁸ logits) the ``n²`` logits, their log-softmax and gradients;
      with hard negatives and batch negatives always the plain ``n²`` logits (about 4 n²); TriCL's and
      InfoNCE's reference layout ``B²`` products (about n²);
    - evaluation (no gradients, the plain loss three times in turn): ``2 n²`` logits, plus the encodings of
      ``eval_samples`` anchors;
    - building g: 2048 candidate ``d × d`` float64 matrices and their eigen-decompositions.
    Plus the encoder's parameters five times (weights, gradients, Adam's two moments, a checkpoint being
    written), :data:`MARGIN` on all of it and :data:`PROCESS_BASE` (on a GPU: :data:`GPU_CONTEXT` on the card and
    :data:`GPU_HOST_BASE` in RAM).
    """
    c = config
    size = 8 if c.dtype == "float64" else 4
    d, b = c.latent_dim, c.batch_size
    n = 2 * b
    k = len(c.ensemble) if c.loss == "ensemble_aninfonce" and c.ensemble else 1
    m = c.n_hard_negatives if c.negative_concentration is not None else 0
    widths = [d, *(int(w) * d for w in c.encoder_widths), d]
    per_row = 2 * sum(widths) + 2 * max(widths)
    rows = k * n + b * m
    encoder = rows * per_row
    if m and c.batch_negatives:
        logits = 4 * n * n
    elif c.loss == "tricl" or (c.loss == "infonce" and c.infonce_layout == "reference"):
        logits = n * n
    elif gpu and n * n <= _GPU_PLAIN:
        logits = (k + 2) * n * n  # autograd keeps each member's logits and log-softmax until the backward pass
    else:
        logits = k * 2 * max(_BLOCK, n) + 12 * rows * d
    train = encoder + logits
    evaluation = (4 if m and c.batch_negatives else 2) * n * n + rows * 2 * max(widths)
    evaluation += c.eval_samples * (2 * max(widths) + 4 * d) + 4 * min(_OVERLAP, b) ** 2
    phases = {
        "training step": (size * train, ("batch_size", "encoder_widths", "latent_dim")),
        "evaluation": (size * evaluation, ("batch_size", "eval_samples")),
        "building g": (8 * 3 * _G_BATCH * d * d, ("latent_dim",)),
    }
    if m:
        phases["training step"] = (phases["training step"][0], ("batch_size", "n_hard_negatives", "encoder_widths"))
    phase, (peak, settings) = max(phases.items(), key=lambda item: item[1][0])
    params = sum(w0 * w1 + w1 for w0, w1 in zip(widths, widths[1:]))  # the encoder's weights and biases
    tensors = int(MARGIN * (peak + 5 * size * params))
    if gpu:
        return MemoryEstimate(GPU_HOST_BASE, GPU_CONTEXT + tensors, phase, settings)
    return MemoryEstimate(PROCESS_BASE + tensors, 0, phase, settings)
