"""A grid's scale can start from a named preset (``scales.<scale>.preset``): the preset's settings lie under
the scale's own base and stop, over the grid's top-level base, and what the grid varies keeps its values."""

from __future__ import annotations

import pytest

from ablate.cli import main
from ablate.service.specs.grids import GridError, load_grid
from ablate.service.specs.presets import load_preset

GRID = """
name: g
base: {latent_dim: 2, concentration: 5, generator_cond_samples: 20, eval_samples: 64, lr: 1.0e-4}
axes: {batch_size: [16, 32]}
variants:
  - {name: slow, lr: 1.0e-5}
  - {name: plain}
stop: {max_steps: 1000}
scales:
  smoke: {}
  laptop:
    preset: {preset}
    base: {report_every: 7}
    {stop}
  paper: {}
"""


def _grid(tmp_path, preset="fast", stop="stop: {max_steps: 40}"):
    path = tmp_path / "g.yaml"
    path.write_text(GRID.replace("{preset}", preset).replace("{stop}", stop))
    return path


def test_the_scales_preset_sits_under_its_base_and_what_the_grid_varies(tmp_path):
    fast = load_preset("fast").settings
    grid = load_grid(str(_grid(tmp_path)), "laptop")
    assert grid.scale_preset == "fast" and grid.preset is None
    for t in grid.trials:
        c = t.config
        assert (c.lr_lambda, c.lr_schedule, c.warmup_steps) == (fast["lr_lambda"], "cosine", fast["warmup_steps"])
        assert c.encoder_widths == fast["encoder_widths"]  # the preset over the grid's top-level base
        assert c.report_every == 7 and c.max_steps == 40  # the scale's own base and stop over the preset
        assert c.batch_size in (16, 32)  # an axis keeps its values
        assert c.lr == 1e-5 if t.variant == "slow" else c.lr == 1e-4  # a variant's setting: left to the grid
    assert load_grid(str(_grid(tmp_path)), "smoke").scale_preset is None


def test_a_scale_preset_resolves_as_the_preset_flag_does(tmp_path):
    # with no base or stop of its own, a scale that names the preset gives the trials `--preset` gives
    named = load_grid(str(_grid(tmp_path, stop="")), "laptop")
    path = tmp_path / "plain.yaml"
    path.write_text(_grid(tmp_path, stop="").read_text().replace("    preset: fast\n", ""))
    flag = load_grid(str(path), "laptop")
    flag.apply_settings(
        {k: v for k, v in load_preset("fast").settings.items() if k != "report_every"}, "p", axes_win=True
    )
    assert [t.config for t in named.trials] == [t.config for t in flag.trials]
    assert named.trials[0].config.max_steps == load_preset("fast").settings["max_steps"]


def test_an_unknown_scale_preset_names_the_file_and_key(tmp_path):
    path = _grid(tmp_path, preset="fsat")
    for scale in ("laptop", "smoke"):  # checked whichever scale is loaded
        with pytest.raises(
            GridError, match=r"g\.yaml: scales\.laptop\.preset: unknown preset 'fsat' \(did you mean 'fast'"
        ):
            load_grid(str(path), scale)


def test_show_says_which_preset_the_scale_starts_from(tmp_path, capsys):
    assert main(["show", str(_grid(tmp_path)), "--scale", "laptop", "--no-generator"]) == 0
    assert "preset: fast (the laptop scale starts from it" in capsys.readouterr().out
    assert main(["show", str(_grid(tmp_path)), "--scale", "smoke", "--no-generator"]) == 0
    assert "preset:" not in capsys.readouterr().out


def test_shipped_grids_name_the_fast_preset_instead_of_pasting_it():
    import yaml

    from ablate.service.specs.grids import known_grids

    fast = load_preset("fast").settings
    named = []
    for name, path in known_grids().items():
        for scale, over in yaml.safe_load(path.read_text())["scales"].items():
            over = over or {}
            pasted = sorted(k for k, v in (over.get("base") or {}).items() if fast.get(k) == v)
            assert len(pasted) < 2, f"{name} scales.{scale}.base repeats the fast preset's {pasted}: name it"
            if over.get("preset") == "fast":
                named.append(name)
    assert len(named) == 9 and "tune_aninfonce" not in named
