"""One synthetic training run: build from a `RunConfig`, `train(n_steps)`, `evaluate()`, save and resume.

The state (`state_dict`) holds the encoder, Λ̂, the optimiser, the step count and the training data's
random generator, so training 500 steps equals training 250, saving, loading and training 250 more,
to the last bit on the CPU. Evaluation draws its samples from a generator seeded by (seed, step), so
evaluating never disturbs training and the same checkpoint always evaluates to the same numbers.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Any

import torch
from torch import Tensor

from ablate.columns import lambda_hat_column, r2_block_column, r2_dim_column
from ablate.config import RunConfig
from ablate.core import dgp, metrics, parts
from ablate.core.adam import HostCountedAdam
from ablate.core.fixed_sampler import FixedShapeSampler, draw_ahead
from ablate.core.losses import ContrastiveLoss, build_loss, floor_loss
from ablate.core.prefetch import Prefetcher

__all__ = ["Experiment", "NonFiniteLossError", "build_loss", "generator_stats", "resolve_device"]

#: Fixed offsets so the data and evaluation streams never coincide with the init stream.
_DATA_STREAM = 1_000_003
_EVAL_STREAM = 2_000_003
#: Stream of the samples that measure how linear g alone is (seeded by g's own seed).
_GENERATOR_STREAM = 3_000_017
#: Anchors used for the similarity histograms (n² pairs).
_OVERLAP_SAMPLES = 1000


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite; the message names the step."""


def resolve_device(name: str) -> torch.device:
    """'auto' → cuda when available, else cpu; 'cuda' without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but torch.cuda.is_available() is False")
    return torch.device(name)


def _build_generator(config: RunConfig):
    return parts.build_g(config)


@torch.no_grad()
def generator_stats(config: RunConfig, generator: torch.nn.Module | None = None) -> dict[str, float]:
    """How hard g is to invert: the condition-number threshold (``g_cond_threshold``), each layer's condition
    number (``g_cond_layer_i``) and the linear R² of z from x = g(z) (``g_linear_r2``; 1 = g is linear), the
    latter on ``eval_samples`` samples seeded by g's own seed. Builds g from ``config`` unless given."""
    g = _build_generator(config) if generator is None else generator
    param = next(g.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = param.dtype if param is not None else torch.float32
    info = getattr(g, "info", None)  # the papers' g only (a plugin's g has no condition numbers)
    out: dict[str, float] = {}
    if info is not None:
        out = {"g_cond_threshold": info.threshold, "g_cond_pools": float(info.pools)}
        for i, c in enumerate(info.layer_conditions):
            out[f"g_cond_layer_{i}"] = c
    d, n = config.latent_dim, config.eval_samples
    rng = torch.Generator(device=device).manual_seed(config.effective_generator_seed + _GENERATOR_STREAM)
    z_fit = dgp.sample_uniform(n, d, generator=rng, device=device, dtype=dtype)
    z_eval = dgp.sample_uniform(n, d, generator=rng, device=device, dtype=dtype)
    out["g_linear_r2"] = metrics.linear_r2(g(z_fit), z_fit, g(z_eval), z_eval)["r2"]
    return out


class Experiment:
    """One run of the synthetic DGP → encoder → contrastive loss pipeline.

    Attributes:
        config: the validated run configuration.
        generator: the frozen generator g.
        encoder: the trained encoder f.
        loss: the loss module (holds Λ̂ as an nn.Parameter where it is learned).
        step: training steps done.
    """

    def __init__(self, config: RunConfig):
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = getattr(torch, config.dtype)
        init_rng = torch.Generator().manual_seed(config.seed)
        self.generator = _build_generator(config).to(self.device, self.dtype)
        self.generator_stats = generator_stats(config, self.generator)
        self.encoder = parts.build_encoder(config, init_rng)
        self.encoder.to(self.device, self.dtype)
        self.loss = build_loss(config, init_rng).to(self.device, self.dtype)
        groups = [{"params": list(self.encoder.parameters()), "lr": config.lr, "base_lr": config.lr}]
        loss_params = [p for p in self.loss.parameters() if p.requires_grad]
        if loss_params:
            groups.append({"params": loss_params, "lr": config.lr_lambda, "base_lr": config.lr_lambda})
        self.optimizer = HostCountedAdam(groups)  # torch.optim.Adam's numbers, with no value read per step
        self.data_rng = torch.Generator(device=self.device).manual_seed(config.seed + _DATA_STREAM)
        self._conditional = parts.build_conditional(config)
        self.step = 0
        self.prefetch = True
        self._lambdas = [torch.tensor(lam, device=self.device, dtype=self.dtype) for lam in config.lambda_ensemble]
        neg = config.lambda_negative
        self._lambda_neg = None if neg is None else torch.tensor(neg, device=self.device, dtype=self.dtype)
        self.fixed_samplers = self._fixed_samplers() if config.sampler == "fixed" else None

    # ------------------------------------------------------------------ data
    def _positive(self, z: Tensor, lam: Tensor, rng: torch.Generator) -> Tensor:
        return self._conditional(z, lam, rng)

    def _fixed_samplers(self) -> list[FixedShapeSampler]:
        """``sampler: fixed``: one fixed-shape sampler per DGP (the first one also draws the hard negatives)."""
        cfg = self.config
        return [
            FixedShapeSampler(
                lam.unsqueeze(0),
                self._lambda_neg.unsqueeze(0) if i == 0 and self._lambda_neg is not None else None,
                batch_size=cfg.batch_size,
                n_negatives=cfg.n_hard_negatives,
                threshold=cfg.threshold,
            )  # fmt: skip
            for i, lam in enumerate(self._lambdas)
        ]

    def sample_latents(self, n: int, rng: torch.Generator, *, hard_negatives: bool) -> dict[str, Any]:
        """Draw one batch of latents: anchors and positives per DGP, and hard negatives if asked.

        Returns ``{"pairs": [(z, z⁺), …], "negatives": (n, M, d) or None}``.
        """
        if self.fixed_samplers is not None:
            pairs, negatives = [], None
            for i, sampler in enumerate(self.fixed_samplers):
                z, z_pos, neg = sampler.draw([rng], n, hard_negatives=hard_negatives and i == 0)
                pairs.append((z[0], z_pos[0]))
                negatives = neg[0] if neg is not None else negatives
            return {"pairs": pairs, "negatives": negatives}
        d = self.config.latent_dim
        pairs = []
        for lam in self._lambdas:
            z = dgp.sample_uniform(n, d, generator=rng, device=self.device, dtype=self.dtype)
            pairs.append((z, self._positive(z, lam, rng)))
        negatives = None
        if hard_negatives and self._lambda_neg is not None:
            negatives = dgp.sample_hard_negatives(
                pairs[0][0],
                self._lambda_neg,
                self.config.n_hard_negatives,
                threshold=self.config.threshold,
                generator=rng,
            )
        return {"pairs": pairs, "negatives": negatives}

    def _hard_negatives_active(self, step: int) -> bool:
        return self._lambda_neg is not None and step >= self.config.hard_negatives_from_step

    def encode(self, z: Tensor) -> Tensor:
        """ẑ = f(g(z)). Shape: ``(..., d) -> (..., d)``."""
        return self.encoder(self.generator(z))

    def compute_loss(self, latents: dict[str, Any], loss: ContrastiveLoss | None = None) -> Tensor:
        """The loss of one batch of latents, encoding every view in one pass through f∘g."""
        loss = self.loss if loss is None else loss
        pairs, negatives = latents["pairs"], latents["negatives"]
        n, d = pairs[0][0].shape
        chunks = [t for pair in pairs for t in pair]
        if negatives is not None:
            chunks.append(negatives.reshape(-1, d))
        h = self.encode(torch.cat(chunks))
        views = list(h[: 2 * n * len(pairs)].split(n))
        view_pairs = [(views[2 * i], views[2 * i + 1]) for i in range(len(pairs))]
        h_neg = h[2 * n * len(pairs) :].view(n, -1, d) if negatives is not None else None
        return loss.batch_loss(view_pairs, h_neg)

    # -------------------------------------------------------------- training
    def _lr_factor(self, step: int) -> float:
        cfg = self.config
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_schedule == "cosine":
            span = max(cfg.max_steps - cfg.warmup_steps, 1)
            progress = min((step - cfg.warmup_steps) / span, 1.0)
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0

    @property
    def prefetch(self) -> bool:
        """Whether :meth:`train` draws the next batch in a second thread while a step runs.

        It never changes the numbers, only the time: it pays where the thread gets an idle core, and costs where
        every core is busy (a Ray trial switches it with `ablate.service.execution.spare_cores`). Setting it True takes
        effect only on the CPU and when ``config.prefetch`` allows it (on a GPU the sampler is not the cost).
        """
        return self._prefetch

    @prefetch.setter
    def prefetch(self, enabled: bool) -> None:
        self._prefetch = bool(enabled) and self.config.prefetch and self.device.type == "cpu"

    def _training_batch(self, step: int) -> dict[str, Any]:
        """The batch of training step ``step``, drawn from the data stream (it must be drawn in step order)."""
        return self.sample_latents(
            self.config.batch_size, self.data_rng, hard_negatives=self._hard_negatives_active(step)
        )

    def _batches(self, steps: range):
        """The batches of ``steps`` in order (a context manager): from the prefetch thread when it is on; else with
        ``sampler: fixed`` and one DGP drawn ahead, one host read per chunk of batches
        (:func:`.fixed_sampler.draw_ahead`, the same batches bit for bit); else one by one."""
        if self.fixed_samplers is None or len(self.fixed_samplers) > 1 or self._prefetch:
            return Prefetcher(self._training_batch, steps, enabled=self._prefetch)
        rng, n = self.data_rng, self.config.batch_size
        drawn = draw_ahead(self.fixed_samplers[0], [rng], n, steps, hard=self._hard_negatives_active)

        def batches():
            for (z, z_pos, neg), (after,) in drawn:
                yield {"pairs": [(z[0], z_pos[0])], "negatives": None if neg is None else neg[0]}
                rng.set_state(after)  # as after this batch: a stop between batches leaves the stream there

        return nullcontext(batches())

    def train(self, n_steps: int) -> dict[str, float]:
        """Run ``n_steps`` optimisation steps; return the mean training loss and the step count.

        Raises:
            NonFiniteLossError: the loss became NaN/inf (the message names the first such step).
        """
        self.encoder.train()
        losses = torch.empty(n_steps, device=self.device, dtype=self.dtype)
        steps = range(self.step, self.step + n_steps)
        with self._batches(steps) as batches:
            for i, latents in enumerate(batches):
                factor = self._lr_factor(self.step)
                for group in self.optimizer.param_groups:
                    group["lr"] = group["base_lr"] * factor
                loss = self.compute_loss(latents)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
                losses[i] = loss.detach()
                self.step += 1
        finite = torch.isfinite(losses)
        if not bool(finite.all()):
            bad = int((~finite).nonzero()[0, 0])
            first_step = self.step - n_steps + bad + 1
            raise NonFiniteLossError(
                f"loss became {float(losses[bad])} at step {first_step} "
                f"(seed {self.config.seed}); lower the learning rates or check Λ"
            )
        return {
            "step": self.step,
            "samples_seen": self.step * self.config.batch_size,
            "loss": float(losses.mean()) if n_steps else float("nan"),
            "lr_now": self.optimizer.param_groups[0]["lr"],
        }

    # ------------------------------------------------------------ evaluation
    def lambda_hat(self) -> Tensor | None:
        """The current Λ̂ (``(d,)``; ``(k, d)`` for an ensemble; TriCL's S), or None for InfoNCE."""
        lam = getattr(self.loss, "lambda_hat", None)
        return None if lam is None else lam.detach()

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """Metrics on fresh samples: R² (overall, per dim, per Λ block), MCC, Λ̂, loss vs floor, overlap; and g's
        difficulty (``g_cond_threshold``, ``g_cond_layer_i``, ``g_linear_r2``), the same at every report."""
        cfg = self.config
        self.encoder.eval()
        d = cfg.latent_dim
        rng = torch.Generator(device=self.device).manual_seed(cfg.seed * 7919 + _EVAL_STREAM + self.step)
        n = cfg.eval_samples
        z_fit = dgp.sample_uniform(n, d, generator=rng, device=self.device, dtype=self.dtype)
        z_eval = dgp.sample_uniform(n, d, generator=rng, device=self.device, dtype=self.dtype)
        h_fit, h_eval = self.encode(z_fit), self.encode(z_eval)
        out: dict[str, Any] = {}
        r2 = metrics.linear_r2(h_fit, z_fit, h_eval, z_eval)
        out["r2"] = r2["r2"]
        for i, v in enumerate(r2["r2_per_dim"]):
            out[r2_dim_column(i)] = v
        for lam, v in metrics.r2_per_block(r2["r2_per_dim"], cfg.lambda_true).items():
            out[r2_block_column(lam)] = v
        matching = metrics.match_dimensions(h_eval, z_eval)
        out["mcc"] = metrics.mcc(h_eval, z_eval, matching)

        latents = self.sample_latents(cfg.batch_size, rng, hard_negatives=self._hard_negatives_active(self.step))
        out["eval_loss"] = float(self.compute_loss(latents))
        if cfg.loss != "tricl":  # the loss with the current Λ̂ on the true latents (ẑ = z): Fig. 10A's curve
            out["true_latent_loss"] = float(self._loss_on_true_latents(latents, self.loss))
        floor = floor_loss(cfg, self._hard_negatives_active(self.step))
        if floor is not None:
            floor = floor.to(self.device, self.dtype)
            out["loss_floor"] = float(self._loss_on_true_latents(latents, floor))
            out["loss_gap"] = out["eval_loss"] - out["loss_floor"]

        lam_hat = self.lambda_hat()
        if lam_hat is not None:
            flat = lam_hat.reshape(-1, d)
            for k, row in enumerate(flat):
                member = None if flat.shape[0] == 1 else k
                for i, v in enumerate(row.tolist()):
                    out[lambda_hat_column(i, member)] = v
            if cfg.loss != "tricl":
                truth = cfg.lambda_optimum
                rec = metrics.lambda_recovery(flat[0], truth)
                out["lambda_max_rel_error"] = rec["max_rel_error"]
                matched = metrics.matched_lambda(h_eval, z_eval, flat[0], truth, matching)
                out["lambda_rank_corr"] = matched["rank_corr"]

        z_pos_pairs = latents["pairs"][0]
        m = min(_OVERLAP_SAMPLES, cfg.batch_size)
        sim = metrics.similarity_overlap(self.encode(z_pos_pairs[0][:m]), self.encode(z_pos_pairs[1][:m]), bins=40)
        out["sim_pos_mean"] = sim["pos_mean"]
        out["sim_neg_mean"] = sim["neg_mean"]
        out["sim_overlap"] = sim["overlap"]
        out["nn_is_positive"] = sim["nn_is_positive"]
        out["sim_pos_hist"] = sim["pos_hist"]
        out["sim_neg_hist"] = sim["neg_hist"]
        out.update(self.generator_stats)
        self.encoder.train()
        return out

    def _loss_on_true_latents(self, latents: dict[str, Any], loss: ContrastiveLoss) -> Tensor:
        """``loss`` with ẑ = z: the true latents in place of the encodings."""
        return loss.batch_loss(latents["pairs"], latents["negatives"])

    # ----------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit-identically: model, Λ̂, optimiser, step, RNG, config."""
        return {
            "step": self.step,
            "encoder": self.encoder.state_dict(),
            "loss": self.loss.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "data_rng": self.data_rng.get_state(),
            "config": self.config.model_dump(mode="json"),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` (loadable with ``torch.load(..., weights_only=True)``)."""
        # checkpoints of earlier versions also hold the test-only `fault` setting, no longer a RunConfig field
        saved = RunConfig.model_validate({k: v for k, v in state["config"].items() if k not in _RETIRED_FIELDS})
        if _science_fields(saved) != _science_fields(self.config):
            raise ValueError("checkpoint was written by a run with a different configuration")
        self.encoder.load_state_dict(state["encoder"])
        self.loss.load_state_dict(state["loss"])
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:  # base_lr follows the current config
            group["base_lr"] = self.config.lr if group is self.optimizer.param_groups[0] else self.config.lr_lambda
        self.data_rng.set_state(state["data_rng"].cpu())
        self.step = int(state["step"])


#: Fields that older checkpoints hold and RunConfig no longer has.
_RETIRED_FIELDS = {"fault"}


def _science_fields(config: RunConfig) -> dict[str, Any]:
    """The values a checkpoint and the run loading it must share (:meth:`RunConfig.science_fields`)."""
    return config.science()
