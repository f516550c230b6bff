"""Grid files (``ablate.service.specs.grids``): a bad grid is refused before Ray starts with one line naming the file and
the key, unknown names list the known ones, and a grid's trials start costliest first."""

from __future__ import annotations

import pytest

from ablate import cli
from ablate.service.specs.grids import GridError, load_grid

BAD_GRIDS = {
    "unknown key": ("bogus: 1\n", "bogus: unknown key"),
    "wrong type": ("base: {batch_size: big}\n", "batch_size"),
    "empty axis": ("axes: {batch_size: []}\n", "axes.batch_size: empty axis"),
    "lambda <= 0": ("base: {concentration: -1}\n", "concentration"),
    "batch < 2": ("base: {batch_size: 1}\n", "batch_size"),
    "d < 2": ("base: {latent_dim: 1}\n", "latent_dim"),
    "lambda list length": ("base: {latent_dim: 3, concentration: [1, 2]}\n", "latent_dim=3"),
    "unknown setting": ("base: {learning_rate: 1}\n", "base.learning_rate: unknown setting"),
    "steps < 1": ("stop: {max_steps: 0}\n", "stop.max_steps: must be an integer >= 1"),
    "acceptance too low": ("base: {latent_dim: 64, concentration: 0.5}\n", "acceptance"),
    "reversed range": ("search: optuna\noptuna: {space: {lr: {uniform: [1, 0]}}}\n", "empty or reversed range"),
    "empty choice": ("search: optuna\noptuna: {space: {batch_size: {choice: []}}}\n", "non-empty list"),
    "unknown distribution": ("search: optuna\noptuna: {space: {lr: {normal: [0, 1]}}}\n", "optuna.space.lr"),
    "time budget <= 0": (
        "search: optuna\noptuna: {space: {lr: {uniform: [0, 1]}}, time_budget_s: 0}\n",
        "optuna.time_budget_s: must be a number of seconds > 0",
    ),
    "grace beyond the time budget": (
        "search: optuna\noptuna: {space: {lr: {uniform: [0, 1]}}, time_budget_s: 30, grace_period: 60}\n",
        "optuna.grace_period: with time_budget_s it is in seconds",
    ),
}


GOOD = """name: bad
scales: {smoke: {}, laptop: {}, paper: {}}
"""


@pytest.mark.parametrize("case", sorted(BAD_GRIDS))
def test_bad_grid_is_refused_before_ray_starts(case, tmp_path, monkeypatch, capsys):
    import ablate.service.execution.runner

    def no_ray(*a, **k):
        raise AssertionError("Ray was started for an invalid grid")

    monkeypatch.setattr(ablate.service.execution.runner, "init_ray", no_ray)
    extra, expected = BAD_GRIDS[case]
    path = tmp_path / "bad.yaml"
    stop = "" if extra.startswith("stop:") else "stop: {max_steps: 5}\n"
    path.write_text(GOOD + stop + extra)
    code = cli.main(["run", str(path), "--scale", "smoke", "--storage", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 2
    assert str(path) in err and expected in err, err
    assert "Traceback" not in err


def test_unknown_grid_name_lists_known_ones(capsys):
    assert cli.main(["run", "no_such_grid"]) == 2
    err = capsys.readouterr().err
    assert "unknown grid 'no_such_grid'" in err and "batch_vs_dim" in err


def test_malformed_yaml_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nbase: {batch_size: 3\nstop: {max_steps: 1}\n")
    with pytest.raises(GridError, match=r"line \d+"):
        load_grid(str(path), "smoke")


def test_param_space_starts_the_costliest_trials_first():
    """Ray nests several grid axes alphabetically (batch_size, the costliest, would vary fastest); ablate's one
    axis of whole grid points keeps a costliest-first order, every trial exactly once."""
    from ray.tune.search.variant_generator import generate_variants

    from ablate.service.specs.costs import trial_cost
    from ablate.service.specs.params import config_from_params

    grid = load_grid("batch_vs_dim", "laptop")
    configs = [config_from_params(c) for _, c in generate_variants(grid.param_space())]
    order = [(c.batch_size, c.latent_dim) for c in configs]
    assert order == [(1024, 16), (1024, 8), (1024, 4), (256, 16), (256, 8), (256, 4), (64, 16), (64, 8), (64, 4)]
    costs = [trial_cost(c) for c in configs]
    assert costs == sorted(costs, reverse=True)
    grid = load_grid("anisotropy", "laptop")  # variants travel whole; ties keep the grid's own order
    configs = [config_from_params(c) for _, c in generate_variants(grid.param_space())]
    assert sorted((c.seed, str(c.concentration), c.loss, c.tau) for c in configs) == sorted(
        (t.config.seed, str(t.config.concentration), t.config.loss, t.config.tau) for t in grid.trials
    )
    assert len(configs) == grid.n_trials
