"""A trial's params as Ray Tune hands them over: the grid's settings, the grid point (axes, variant, seed) or a
pack of points, and the keys ablate adds; turned back into the settings of each trial and its RunConfig."""

from __future__ import annotations

import json
from typing import Any

from ablate.config import RunConfig

__all__ = ["JSON_CHOICES", "META_KEYS", "PACK_KEY", "RECORD_KEY", "config_from_params", "flat_params", "pack_members"]

#: Param key listing the Optuna choices whose values are lists or mappings. Optuna stores only None, bool,
#: int, float and str choices, so such a value travels as its JSON text (what the study and optuna-dashboard
#: show, e.g. ``[10,50,10]``); :func:`flat_params` turns it back into the value.
JSON_CHOICES = "json_choices"
#: Param key of a pack trial's members (their grid points), and of a member's ``<pack trial id>:<index>`` label.
PACK_KEY = "pack"
#: Keys of a trial's param dict that are not RunConfig fields.
META_KEYS = ("grid", "scale", "variant", "point", "record", JSON_CHOICES, PACK_KEY)
#: Param key of where a trial's record lives in the run directory (ablate.service.records.plan): ``{"dir", "id", "keep"}``
#: (a pack's also ``members``, its members' ids).
RECORD_KEY = "record"


def flat_params(config: dict[str, Any]) -> dict[str, Any]:
    """A trial's settings with its grid point's values (axes, variant, seed) at the top level, as in params.json;
    Optuna choices that travelled as JSON text (:data:`JSON_CHOICES`) are values again."""
    point = config.get("point")
    flat = {**{k: v for k, v in config.items() if k != "point"}, **point} if isinstance(point, dict) else dict(config)
    for key in flat.pop(JSON_CHOICES, None) or []:
        if isinstance(flat.get(key), str):
            flat[key] = json.loads(flat[key])
    return flat


def pack_members(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Each member's settings (as :func:`flat_params` gives a solo trial's) from a pack trial's config (its pack at
    the top or in its unit under ``point``); ``[]`` for a config that is not a pack's."""
    config = flat_params(config)
    points = config.get(PACK_KEY)
    if not isinstance(points, list):
        return []
    shared = {k: v for k, v in config.items() if k != PACK_KEY}
    return [flat_params({**shared, "point": point}) for point in points]


def config_from_params(params: dict[str, Any], source: str = "trial") -> RunConfig:
    """Build a RunConfig from a trial's param dict (drops meta keys, merges the variant's overrides)."""
    params = flat_params(params)
    values = {k: v for k, v in params.items() if k not in META_KEYS}
    variant = params.get("variant")
    if isinstance(variant, dict):
        values.update({k: v for k, v in variant.items() if k != "name"})
    return RunConfig.build(values, source)
