"""Every shipped grid resolves, at every scale, to the trial configs pinned in tests/data/grid_trials.json.

The fixture was captured before the grids' laptop scales named the ``fast`` preset instead of pasting its
settings: moving a fact into one home must not change a single trial. Each trial is stored by its label with
the RunConfig fields that differ from the defaults (so a later change of a default does not fail this test,
while any setting a grid or preset gives does). Regenerate on purpose only, after checking the difference:
``.venv/bin/python tests/service/specs/test_grid_trials.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ablate.service.specs.grid import SCALES
from ablate.service.specs.grids import known_grids, load_grid

FIXTURE = Path(__file__).parents[2] / "data" / "grid_trials.json"


def resolved(name: str, scale: str) -> dict:
    """The grid ``name`` at ``scale``: its Optuna search and every trial's label → non-default settings."""
    grid = load_grid(name, scale)
    return {
        "optuna": grid.optuna_dict(),
        "trials": {t.label: t.config.model_dump(mode="json", exclude_defaults=True) for t in grid.trials},
    }


def test_fixture_covers_every_shipped_grid():
    assert sorted(json.loads(FIXTURE.read_text())) == sorted(known_grids())


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("name", sorted(known_grids()))
def test_grid_resolves_to_pinned_trials(name, scale):
    pinned = json.loads(FIXTURE.read_text())[name][scale]
    now = json.loads(json.dumps(resolved(name, scale)))
    assert list(now["trials"]) == list(pinned["trials"]), "the trials' labels or order changed"
    for label, config in pinned["trials"].items():
        assert now["trials"][label] == config, f"{name} @ {scale}: {label}"
    assert now["optuna"] == pinned["optuna"]


if __name__ == "__main__":
    data = {n: {s: resolved(n, s) for s in SCALES} for n in sorted(known_grids())}
    lines = ["{"]
    for i, (name, scales) in enumerate(data.items()):
        lines.append(f" {json.dumps(name)}: {{")
        for j, (scale, res) in enumerate(scales.items()):
            lines.append(
                f'  {json.dumps(scale)}: {{"optuna": {json.dumps(res["optuna"], sort_keys=True)}, "trials": {{'
            )
            items = list(res["trials"].items())
            for k, (label, config) in enumerate(items):
                comma = "," if k + 1 < len(items) else ""
                lines.append(f"   {json.dumps(label)}: {json.dumps(config, sort_keys=True)}{comma}")
            lines.append("  }}" + ("," if j + 1 < len(scales) else ""))
        lines.append(" }" + ("," if i + 1 < len(data) else ""))
    lines.append("}")
    FIXTURE.write_text("\n".join(lines) + "\n")
    print(f"wrote {FIXTURE}")
