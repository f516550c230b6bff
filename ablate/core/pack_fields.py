"""Which configs may train together as one pack (:mod:`ablate.core.pack`), and why.

Every :class:`~ablate.config.RunConfig` field is classified once, here: a *shape/path* field must be equal across
a pack's members (it sets a tensor's shape, a code path or the step/report schedule the members share), a
*member* field may differ (each member holds its own value: seeds, Λ, learning rates…). tests/core/test_pack.py
fails when a RunConfig field is in neither set, so a new field has to be classified before packs can use it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ablate.config import BUILTIN_PARTS, RunConfig

__all__ = ["MEMBER_FIELDS", "SHAPE_FIELDS", "can_pack", "check_packable", "pack_groups", "pack_signature"]

#: Fields that must be equal across a pack: shapes, code paths, the shared step and report schedule, execution.
SHAPE_FIELDS = frozenset(
    {
        "latent_dim",  # every tensor's width
        "conditional",  # which positive sampler runs
        "threshold",  # the rejection rule of the sampler
        "sampler",  # how the sampler draws (one code path for the pack)
        "n_hard_negatives",  # rows per batch
        "hard_negatives_from_step",  # the step at which the loss switches path
        "batch_negatives",  # the hard-negative loss's logits layout
        "ensemble",  # the number of DGPs (ensembles do not pack; see can_pack)
        "generator_layers",  # g's depth (stacked per layer)
        "encoder_widths",  # f's weight shapes
        "normalize_output",  # f's last operation
        "loss",  # the loss family
        "infonce_layout",  # InfoNCE's batch layout
        "batch_size",  # rows per batch
        "lr_schedule",  # one schedule factor for the whole pack
        "warmup_steps",
        "max_steps",  # the cosine schedule's span, and the stop every member shares
        "report_every",  # one report (Ray iteration) for the whole pack
        "eval_samples",  # evaluation shapes
        "device",
        "dtype",
        "prefetch",  # one sampler thread for the pack
        # a plugin's parts and their options (a run that names a plugin trains solo; see can_pack)
        "loss_options",
        "conditional_options",
        "generator",
        "generator_options",
        "encoder",
        "encoder_options",
    }
)

#: Fields each member holds for itself (its own numbers, no shape or path).
MEMBER_FIELDS = frozenset(
    {
        "seed",
        "generator_seed",
        "concentration",  # Λ
        "kappa",  # vMF κ (the vMF analogue of Λ; members draw their own data)
        "negative_concentration",  # Λ⁻ (whether it is set at all is part of the signature)
        "generator_cond_quantile",  # which g a member draws (each member builds its own g)
        "generator_cond_samples",
        "tau",
        "fixed_lambda_hat",  # its value (whether Λ̂ is fixed at all is part of the signature)
        "lambda_hat_init_std",
        "tricl_decorrelation",  # TriCL's weight (TriCL does not pack)
        "lr",
        "lr_lambda",
        "target_r2",  # each member stops on its own (PackedExperiment.freeze)
    }
)

#: Losses that have no packed form, with the reason.
_UNPACKABLE = {
    "tricl": "TriCL has no batched loss in ablate.core.batched (its runs train solo)",
    "ensemble_aninfonce": "ensemble AnInfoNCE (k DGPs, k Λ̂ per run) has no batched loss (its runs train solo)",
}


def _hashable(value: Any) -> Any:
    return json.dumps(value, sort_keys=True) if isinstance(value, list | dict) else value


def pack_signature(config: RunConfig) -> tuple:
    """What must be equal for configs to share a pack: every shape/path field, whether Λ̂ is learned and whether
    hard negatives are drawn. Hashable (lists and dicts are JSON strings)."""
    dump = config.model_dump(mode="json")
    items = [(name, _hashable(dump[name])) for name in sorted(SHAPE_FIELDS)]
    items.append(("learned_lambda_hat", config.fixed_lambda_hat is None))
    items.append(("hard_negatives", config.negative_concentration is not None))
    return tuple(items)


def can_pack(config: RunConfig) -> tuple[bool, str]:
    """``(True, "")`` when the config's loss has a packed form, else ``(False, why)``; a plugin's part (loss,
    conditional, generator, encoder) has none."""
    why = _UNPACKABLE.get(config.loss)
    if why:
        return False, why
    for kind, builtin in BUILTIN_PARTS.items():
        if getattr(config, kind) not in builtin:
            return False, f"{kind} {getattr(config, kind)!r} is a plugin's, with no packed form"
    return True, ""


def check_packable(configs: Sequence[RunConfig]) -> None:
    """Raise ValueError naming the member and the field when ``configs`` cannot train as one pack."""
    if not configs:
        raise ValueError("a pack needs at least one config")
    for i, config in enumerate(configs):
        ok, why = can_pack(config)
        if not ok:
            raise ValueError(f"pack member {i}: cannot pack loss {config.loss!r}: {why}")
    first = dict(pack_signature(configs[0]))
    for i, config in enumerate(configs[1:], start=1):
        sig = dict(pack_signature(config))
        for name, value in first.items():
            if sig[name] != value:
                raise ValueError(
                    f"pack member {i}: {name} is {sig[name]!r} but member 0 has {value!r}; members of a pack must "
                    f"agree on {', '.join(sorted(first))}"
                )


def pack_groups(configs: Sequence[RunConfig], max_size: int | None = None) -> list[list[int]]:
    """Indices of ``configs`` grouped into packs (equal signatures, in first-seen order, at most ``max_size``
    each); a config that cannot pack is a group of its own."""
    if max_size is not None and max_size < 1:
        raise ValueError(f"max_size must be >= 1, got {max_size}")
    open_groups: dict[tuple, list[int]] = {}
    groups: list[list[int]] = []
    for i, config in enumerate(configs):
        if not can_pack(config)[0]:
            groups.append([i])
            continue
        sig = pack_signature(config)
        group = open_groups.get(sig)
        if group is None or (max_size is not None and len(group) >= max_size):
            group = open_groups[sig] = []
            groups.append(group)
        group.append(i)
    return groups
