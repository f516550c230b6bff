"""Typed specs end to end: every level of a grid file and of a dashboard is a pydantic model that code reads by
attribute, YAML's own types are required, and each error is one line naming the file, the key path, what is
allowed and the closest allowed key."""

from __future__ import annotations

import pytest

from ablate.reports.spec import SpecError, parse_panel
from ablate.service.specs.grid import ChosenEntry, StopSpec, VariantSpec
from ablate.service.specs.grids import GridError, grid_from_text, load_grid
from ablate.service.specs.optuna import Choice, LogUniform, OptunaSpec, RandInt, Uniform

HEAD = "name: t\nstop: {max_steps: 5}\n"
SCALES = "scales: {smoke: {}, laptop: {}, paper: {}}\n"


def _error(text: str) -> str:
    with pytest.raises(GridError) as err:
        grid_from_text(text, "smoke", "t.yaml")
    return str(err.value)


def test_a_loaded_grid_is_typed_at_every_level():
    grid = load_grid("tune_aninfonce", "smoke")
    assert isinstance(grid.optuna, OptunaSpec) and isinstance(grid.stop, StopSpec)
    assert (grid.optuna.metric, grid.optuna.mode, grid.optuna.num_samples) == ("r2", "max", 4)
    assert isinstance(grid.optuna.space["lr"], LogUniform) and grid.optuna.space["lr"].loguniform == [1e-4, 1e-2]
    assert isinstance(grid.optuna.space["encoder_widths"], Choice)
    assert (grid.stop.max_steps, grid.stop.target_r2) == (10, 0.99)
    assert all(isinstance(c, ChosenEntry) and c.why for c in grid.chosen)
    ensemble = load_grid("ensemble", "smoke")
    assert all(isinstance(v, VariantSpec) for v in ensemble.variants) and ensemble.optuna is None
    assert ensemble.variants[0].param() == {"name": "infonce", "loss": "infonce", "tau": 1.0}
    assert ensemble.paper_values["r2"]["ensemble"] == 0.98


def test_each_distribution_gives_its_ray_domain():
    from ray.tune.search.sample import Categorical, Float, Integer

    lo, as_json = Uniform(uniform=[0.5, 2]).domain()
    assert isinstance(lo, Float) and (lo.lower, lo.upper) == (0.5, 2) and not as_json
    log, _ = LogUniform(loguniform=[1e-4, 1e-2]).domain()
    assert isinstance(log.sampler, Float._LogUniform)
    ints, _ = RandInt(randint=[1, 3]).domain()
    assert isinstance(ints, Integer) and (ints.lower, ints.upper) == (1, 4), "randint's high is included"
    lists, as_json = Choice(choice=[[2, 2], [2, 4, 2]]).domain()
    assert isinstance(lists, Categorical) and lists.categories == ["[2,2]", "[2,4,2]"] and as_json


@pytest.mark.parametrize(
    "extra, expected",
    [
        ("stpo: {max_steps: 5}\n", "stpo: unknown key (did you mean 'stop'?); allowed: axes, base, chosen,"),
        ("stop: {max_step: 5}\n", "stop.max_step: unknown key (did you mean 'max_steps'?); allowed: max_steps, target_r2"),
        ("search: random\n", "search: 'random' is not allowed; allowed: grid, optuna"),
        ("seeds: [0, 1.5]\n", "seeds[1]: expected an integer (the seeds every point runs with), got 1.5"),
        ("variants: [{name: a}, {name: a}]\n", "variants[1].name: duplicate variant name 'a'"),
        ("variants: [{name: a, lrr: 1}]\n", "variants[0].lrr: unknown setting (did you mean 'lr'?)"),
        ("paper_values: {r2: {a: x}}\n", "paper_values.r2.a: expected a number or a mapping"),
        ("optuna: {num_samples: 3}\n", "optuna: only used with search: optuna"),
        ("search: optuna\noptuna: {space: {lr: {uniform: [0, 1]}}, num_samples: '3'}\n", "optuna.num_samples: expected an integer"),
        ("search: optuna\noptuna: {space: {lr: {uniform: [0]}}}\n", "optuna.space.lr.uniform: takes at least 2 items ([low, high])"),
        ("search: optuna\noptuna: {space: {lr: {loguniform: [0, 1]}}}\n", "optuna.space.lr: loguniform needs low > 0"),
        ("search: optuna\noptuna: {space: {lr: {uniform: [0, 1]}}, mode: mim}\n", "optuna.mode: 'mim' is not allowed (did you mean 'min'?); allowed: max, min"),
    ],
)  # fmt: skip
def test_a_bad_value_is_one_line_with_the_key_path_and_what_is_allowed(extra, expected):
    stop = "" if extra.startswith(("stop:", "stpo:")) else "stop: {max_steps: 5}\n"
    message = _error("name: t\n" + stop + SCALES + extra)
    assert message.startswith("t.yaml: ") and expected in message, message


def test_a_scale_s_error_names_the_scale():
    text = HEAD + "scales: {smoke: {seed: [1]}, laptop: {optuna: {space: {lr: {normal: [0, 1]}}}}, paper: {}}\n"
    message = _error(text)
    assert "scales.smoke.seed: unknown key (did you mean 'seeds'?)" in message, message
    assert "scales.laptop.optuna.space.lr: expected one of {choice: [values]}, {loguniform: [low, high]}" in message


def test_yaml_types_are_strict_but_set_converts_as_runconfig_does():
    assert "stop.max_steps: expected an integer" in _error("name: t\nstop: {max_steps: true}\n" + SCALES)
    grid = load_grid("batch_vs_dim", "smoke")
    grid.apply_settings({"max_steps": 1e4}, "--set", axes_win=False)  # YAML 1.2 exponent: a float
    assert grid.stop.max_steps == 10_000 and isinstance(grid.stop.max_steps, int)
    with pytest.raises(GridError, match=r"--set max_steps: max_steps: must be an integer >= 1"):
        grid.apply_settings({"max_steps": 0}, "--set", axes_win=False)


def test_a_panel_is_its_kind_s_model():
    panel = parse_panel({"kind": "iterations_to_target", "figure": " Fig. 8B ", "x": "target", "targets": 0.9})
    assert type(panel).__name__ == "IterationsToTarget"
    assert (panel.figure, panel.targets, panel.color, panel.log_y) == ("Fig. 8B", [0.9], [], True)
    with pytest.raises(
        SpecError, match=r"panels\[0\] \(r2_curves\)\.colour: unknown key for r2_curves \(did you mean 'color'\?\)"
    ):
        parse_panel({"kind": "r2_curves", "figure": "F", "colour": "seed"})
    with pytest.raises(
        SpecError, match=r"panels\[0\]\.kind: unknown panel kind 'r2_curve' \(did you mean 'r2_curves'\?\)"
    ):
        parse_panel({"kind": "r2_curve", "figure": "F"})
    grid = load_grid("batch_vs_dim", "smoke")
    with pytest.raises(
        SpecError, match=r"\.color\[1\]: 'tau' is not an axis of the grid; allowed: batch_size, latent_dim"
    ):
        parse_panel({"kind": "r2_curves", "figure": "F", "color": ["batch_size", "tau"]}, grid)
