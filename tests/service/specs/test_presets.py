"""Named presets: validation, how they combine with grids and --set, and the CLI paths that use them."""

from __future__ import annotations

import pytest

from ablate.cli import main
from ablate.config import RESUME_MAY_CHANGE, TRAINING_FIELDS, RunConfig
from ablate.service.specs.grids import load_grid
from ablate.service.specs.params import config_from_params
from ablate.service.specs.presets import PresetError, known_presets, load_preset


def test_the_shipped_fast_preset_is_valid_and_changes_only_how_trials_train():
    assert "fast" in known_presets()
    preset = load_preset("fast")
    how = TRAINING_FIELDS | RESUME_MAY_CHANGE
    assert set(preset.settings) <= how, "a preset changes how a run trains, never what it studies"
    assert not how & {"latent_dim", "concentration", "loss", "tau", "seed", "generator_seed"}
    assert preset.measured.strip(), "the preset says what measurement backs it"
    config, defaults = RunConfig.build(preset.settings), RunConfig()
    assert {k: getattr(config, k) for k in preset.settings} == preset.settings, "each setting lands as written"
    changed = {k for k in RunConfig.model_fields if getattr(config, k) != getattr(defaults, k)}
    assert changed and changed <= set(preset.settings), f"only what the preset names moves off the defaults: {changed}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x\n", "settings: required"),
        ("name: x\nsettings: {learning_rate: 1}\n", "settings.learning_rate: unknown setting"),
        ("name: x\nsettings: {lr: -1}\n", "lr"),
        ("name: x\nsettings: {lr: 1}\nextra: 1\n", "extra: unknown key"),
        ("name: x\nsettings: [1, 2\n", "malformed YAML at line"),
    ],
)
def test_bad_presets_name_the_file_and_key(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(PresetError, match=message) as info:
        load_preset(str(path))
    assert str(path) in str(info.value)


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(PresetError, match="known presets: .*fast"):
        load_preset("fastest")


def test_grid_axes_win_over_a_preset_and_set_wins_over_both():
    grid = load_grid("batch_vs_dim", "laptop")
    kept = grid.apply_settings({"batch_size": 7, "lr": 0.01, "max_steps": 50}, "preset p:", axes_win=True)
    assert kept == ["batch_size"]
    assert sorted({t.config.batch_size for t in grid.trials}) == sorted(grid.axes["batch_size"])
    assert {t.config.lr for t in grid.trials} == {0.01} and grid.stop.max_steps == 50
    grid.apply_settings({"batch_size": 9}, "--set", axes_win=False)
    assert "batch_size" not in grid.axes and {t.config.batch_size for t in grid.trials} == {9}


def test_train_with_the_preset_and_set_on_top(capsys):
    code = main(
        [
            "train",
            "--preset",
            "fast",
            "--set",
            "latent_dim=2",
            "encoder_widths=[2,2]",
            "batch_size=16",
            "eval_samples=64",
            "report_every=2",
            "--steps",
            "2",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "batch=16" in out and "step=2" in out  # --set won over the preset's batch size


def test_run_with_an_unknown_preset_fails_before_ray(capsys):
    assert main(["run", "bimodal_dynamics", "--scale", "smoke", "--preset", "nope"]) == 2
    assert "unknown preset 'nope'" in capsys.readouterr().err


def test_run_with_a_preset_records_it_and_a_run_without_it_makes_new_points(ray_session, tmp_path, capsys):
    import json

    small = ["--set", "max_steps=10", "batch_size=16", "encoder_widths=[2,2]", "report_every=5"]
    base = ["run", "bimodal_dynamics", "--scale", "smoke", "--storage", str(tmp_path), "--verbose", "0"]
    assert main([*base, "--preset", "fast", *small]) == 0
    run_dir = tmp_path / "bimodal_dynamics-smoke-fast"
    assert json.loads((run_dir / "ablate_run.json").read_text())["preset"] == "fast"
    lr = load_preset("fast").settings["lr"]
    params = [json.loads(p.read_text()) for p in run_dir.glob("trial_*/params.json")]
    assert params and all(p["lr"] == lr and p["batch_size"] == 16 for p in params)
    capsys.readouterr()
    # the preset's settings are science: the same grid without it is other points, run beside the preset's
    assert main([*base, "--name", run_dir.name, "--resume", *small]) == 0
    assert f"{len(params)} points: 0 reused, 0 continued, {len(params)} started" in capsys.readouterr().out
    both = [json.loads(p.read_text()) for p in run_dir.glob("trial_*/params.json")]
    lrs = {config_from_params(p).lr for p in both}
    assert len(lrs) == 2 and lr in lrs and len(both) == 2 * len(params)
