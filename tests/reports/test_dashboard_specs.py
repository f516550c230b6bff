"""Dashboard specs (``ablate.reports.spec``, ``ablate/dashboards/<grid>.yaml``): every grid has a valid one at every
scale, and a bad spec is one error naming the file, the key and what is allowed."""

from __future__ import annotations

import pytest

from ablate.reports.report import SpecError, known_dashboards, load_dashboard
from ablate.service.specs.grid import SCALES
from ablate.service.specs.grids import known_grids, load_grid


def test_every_grid_has_a_valid_dashboard_at_every_scale():
    grids, dashboards = known_grids(), known_dashboards()
    assert set(dashboards) == set(grids), "one dashboards/<grid>.yaml per search_spaces/<grid>.yaml"
    for name in grids:
        for scale in SCALES:
            dash = load_dashboard(name, load_grid(name, scale))
            assert dash.panels and all(p.figure for p in dash.panels)


BAD_SPECS = {
    "unknown kind": ("panels:\n  - {kind: scatter3d, figure: Fig. 1}\n", "panels[0].kind", "unknown panel kind"),
    "unknown key": (
        "panels:\n  - {kind: r2_curves, figure: Fig. 1, colour: batch_size}\n",
        "colour",
        "unknown key for r2_curves",
    ),
    "missing figure": ("panels:\n  - {kind: r2_curves}\n", "figure", "required"),
    "not an axis": (
        "panels:\n  - {kind: final_heatmap, figure: F, x: batch_size, y: lambda}\n",
        ".y",
        "'lambda' is not an axis",
    ),
    "missing option": ("panels:\n  - {kind: final_heatmap, figure: F, x: batch_size}\n", ".y", "required"),
    "bad targets": (
        "panels:\n  - {kind: iterations_to_target, figure: F, x: latent_dim, targets: [0.5, 2]}\n",
        "targets",
        "(0, 1]",
    ),
    "bad choice": ("panels:\n  - {kind: r2_curves, figure: F, x: epoch}\n", ".x", "allowed: step"),
    "wrong type": (
        "panels:\n  - {kind: lambda_hat_curves, figure: F, max_facets: many}\n",
        "max_facets",
        "expected an integer",
    ),
    "same axis twice": (
        "panels:\n  - {kind: final_heatmap, figure: F, x: batch_size, y: batch_size}\n",
        ".y",
        "must differ from x",
    ),
    "bad where": ("panels:\n  - {kind: r2_curves, figure: F, where: {tau: 1}}\n", "where.tau", "not an axis"),
    "top-level key": ("panel: []\n", "panel:", "unknown key"),
    "no panels": ("panels: []\n", "panels", "non-empty list"),
    "malformed": ("panels: [\n", "malformed YAML", "line"),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_bad_dashboard_spec_names_the_file_and_key(case, tmp_path):
    body, key, message = BAD_SPECS[case]
    path = tmp_path / "batch_vs_dim.yaml"
    path.write_text(("grid: batch_vs_dim\n" if case != "malformed" else "") + body)
    with pytest.raises(SpecError) as err:
        load_dashboard(path, load_grid("batch_vs_dim", "smoke"))
    text = str(err.value)
    assert str(path) in text and key in text and message in text, text
