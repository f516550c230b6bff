"""What a newcomer sees: numeric order of axis values, a report and the claims command at the end of a run, and
"did you mean" for misspelt names."""

from __future__ import annotations

import sys

import pytest
from conftest import run_logged

from ablate.config import ConfigError, RunConfig
from ablate.service.specs.grids import GridError, load_grid, natural_key

GRID = """name: order_check
description: two latent dims whose text order differs from their numeric order
figure: none
base: {loss: aninfonce, concentration: 75, encoder_widths: [2, 2], eval_samples: 256, report_every: 5,
       generator_cond_samples: 200, generator_seed: 0}
axes: {batch_size: [16], latent_dim: [16, 4]}
seeds: [0]
stop: {max_steps: 10}
scales: {smoke: {}, laptop: {}, paper: {}}
"""


def test_natural_order_of_axis_values():
    assert sorted([16, 4, 8], key=natural_key) == [4, 8, 16]
    assert sorted(["5/200", "5/25", "5/5"], key=natural_key) == ["5/5", "5/25", "5/200"]
    assert sorted(["latent_dim=16", "latent_dim=4"], key=natural_key) == ["latent_dim=4", "latent_dim=16"]
    assert sorted([{"linspace": [5, 50]}, {"linspace": [5, 25]}], key=natural_key) == [
        {"linspace": [5, 25]},
        {"linspace": [5, 50]},
    ]
    assert sorted([None, 2, "text"], key=natural_key) == [2, "text", None]


def test_misspelt_names_suggest_the_closest_known_one(tmp_path):
    from ablate.reports.spec import SpecError, load_dashboard

    with pytest.raises(GridError, match=r"did you mean 'batch_vs_dim'\?"):
        load_grid("batch_vs_dm", "smoke")
    with pytest.raises(ConfigError, match=r"did you mean 'batch_size'\?"):
        RunConfig.build({"batchsize": 5})
    with pytest.raises(GridError, match=r"--set batch_sise: unknown setting \(did you mean 'batch_size'\?\)"):
        load_grid("batch_vs_dim", "smoke").apply_settings({"batch_sise": 3}, "--set", axes_win=False)
    typo = tmp_path / "typo.yaml"
    typo.write_text("name: typo\nbase: {lattent_dim: 3}\nseeds: [0]\nscales: {smoke: {}, laptop: {}, paper: {}}\n")
    with pytest.raises(GridError, match=r"base.lattent_dim: unknown setting \(did you mean 'latent_dim'\?\)"):
        load_grid(str(typo), "smoke")
    spec = tmp_path / "d.yaml"
    spec.write_text("grid: order_check\npanels:\n  - {kind: r2_curve, figure: none}\n")
    with pytest.raises(SpecError) as info:
        load_dashboard(spec)
    assert str(info.value).startswith(
        f"{spec}: panels[0].kind: unknown panel kind 'r2_curve' (did you mean 'r2_curves'?); allowed: r2_curves, "
    ), str(info.value)


@pytest.mark.ray
def test_a_run_ends_with_a_report_the_claims_command_and_numeric_order(tmp_path):
    grid = tmp_path / "order_check.yaml"
    grid.write_text(GRID)
    cmd = [sys.executable, "-m", "ablate.cli", "run", str(grid), "--scale", "smoke", "--storage", str(tmp_path)]
    code, out = run_logged(cmd, tmp_path / "run.log")
    assert code == 0, out[-3000:]
    run_dir = tmp_path / "order_check-smoke"
    assert f"report: {run_dir}/report.html" in out and (run_dir / "report.html").is_file()
    summary = out[out.index("summary (") :].splitlines()
    dims = [line.split()[1] for line in summary[3:5]]
    assert dims == ["4", "16"], summary[:6]
    from ablate.analysis.status import run_status

    assert [r["latent_dim"] for r in run_status(run_dir)["trials"]] == [4, 16]
    from ablate.analysis.run import load_run, trial_table

    assert trial_table(load_run(run_dir))["latent_dim"].tolist() == [4, 16]
    # a grid that decides a claim names the command; --no-report skips the report
    code, out = run_logged([*cmd[:4], "batch_vs_dim", *cmd[5:], "--no-report"], tmp_path / "run2.log")
    assert code == 0, out[-3000:]
    assert f"claims: ablate claims {tmp_path}/batch_vs_dim-smoke" in out
    assert not (tmp_path / "batch_vs_dim-smoke" / "report.html").exists()


def test_variants_choose_a_subset_of_a_grid_and_travel_into_the_resume_command():
    import argparse

    from ablate.cli import resume_command

    grid = load_grid("anisotropy", "laptop")
    grid.select_variants(["aninfonce", "infonce"], "--variants")
    assert [v.name for v in grid.variants] == ["infonce", "aninfonce"]  # the grid's order
    assert grid.n_trials == len(grid.trials) == 6 * 2
    with pytest.raises(GridError, match=r"unknown variant 'aninfnce' .*did you mean 'aninfonce'\?.*allowed: infonce"):
        load_grid("anisotropy", "laptop").select_variants(["aninfnce"], "--variants")
    with pytest.raises(GridError, match="has no variants"):
        load_grid("batch_vs_dim", "laptop").select_variants(["x"], "--variants")
    args = argparse.Namespace(
        grid="anisotropy",
        scale="laptop",
        preset=None,
        settings=["max_steps=20000"],
        variants="infonce,aninfonce",
        storage="/r",
        name=None,
    )
    cmd = resume_command(args, "/r/anisotropy-laptop")
    assert "--set max_steps=20000 --variants infonce,aninfonce --storage /r --name anisotropy-laptop" in cmd
