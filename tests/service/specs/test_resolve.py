"""A grid is resolved once (issue "The record with one owner", item 3): its scale, preset, ``--set`` and
``--variants`` are applied by one function (:func:`ablate.service.specs.resolve.resolve_grid`) that `ablate run`,
`ablate slurm` and :func:`ablate.run_grid` share (`ablate train` shares its preset and ``--set``), a bad value of
each is the same one line from all of them, before Ray starts, and the pack and memory checks run once per run.

Nothing here starts Ray: a run is stopped at its plan (``on_plan``), which comes before ``ray.init``.
"""

from __future__ import annotations

import importlib
import sys

import pytest

import ablate
from ablate.config import ConfigError
from ablate.service.execution.options import RunOptions
from ablate.service.records.reader import read_marker
from ablate.service.specs.grids import Grid, GridError, load_grid
from ablate.service.specs.presets import PresetError

#: Each call to start or join Ray in this module's tests (none may happen: every check comes before Ray).
_RAY_STARTS: list[tuple] = []


@pytest.fixture(autouse=True)
def _no_ray(monkeypatch):
    """Record any start of Ray by the runner instead of starting it (a Ray that an earlier test of the session
    left running in this process would make "is Ray running?" say nothing of these calls)."""
    import ablate.service.execution.runner as runner

    _RAY_STARTS.clear()

    def refuse(*args, **kwargs):
        _RAY_STARTS.append((args, kwargs))
        raise AssertionError("Ray was started")

    monkeypatch.setattr(runner, "init_ray", refuse)


def ray_started() -> bool:
    return bool(_RAY_STARTS)


class Stop(Exception):
    """Raised at the plan: the run goes no further (Ray never starts)."""


def _planned(tmp_path, grid, **fields):
    """The plan ``ablate.run_grid(grid, **fields)`` makes, the run stopped there, before Ray starts."""
    seen = {}

    def stop(plan):
        seen["plan"] = plan
        raise Stop

    with pytest.raises(Stop):
        ablate.run_grid(grid, storage=str(tmp_path), verbose=0, on_plan=stop, **fields)
    assert not ray_started()
    return seen["plan"]


# ---------------------------------------------------------------------- run_grid honours every grid option
@pytest.mark.parametrize("given", ["name", "grid"])
def test_run_grid_applies_the_preset_set_and_variants(tmp_path, given):
    grid = "anisotropy" if given == "name" else load_grid("anisotropy", "smoke")
    defaults = ablate.RunConfig()  # the preset moves lr_lambda off them
    plan = _planned(
        tmp_path,
        grid,
        scale="smoke",
        preset="fast",
        settings=["max_steps=30", "lr=0.01"],
        variants="infonce,aninfonce",
    )
    assert {p.params["variant"]["name"] for p in plan.points} == {"infonce", "aninfonce"}
    assert len(plan.points) == 2 * 2  # two Λ₂ at smoke scale × the two variants chosen
    for p in plan.points:
        config = p.config
        assert (config.max_steps, config.lr) == (30, 0.01), "--set wins over the preset"
        assert config.lr_lambda == 0.058 != defaults.lr_lambda and config.warmup_steps == 250, "the preset applies"
        assert config.latent_dim == 2 and p.params["scale"] == "smoke", "the smoke scale"
    marker = read_marker(str(tmp_path / "anisotropy-smoke-fast"))  # the preset names the run by default
    assert (marker["scale"], marker["preset"], marker["variants"]) == ("smoke", "fast", ["infonce", "aninfonce"])
    assert marker["runs"][-1]["settings"] == {"max_steps": 30, "lr": 0.01}
    if given == "grid":
        assert grid.preset is None and grid.stop.max_steps == 10, "the grid handed in is not changed"


def test_run_grid_loads_a_name_at_its_scale_and_a_grid_keeps_the_scale_it_was_loaded_at(tmp_path):
    plan = _planned(tmp_path / "a", "batch_vs_dim", scale="smoke")
    assert len(plan.points) == 4 and {p.params["scale"] for p in plan.points} == {"smoke"}
    plan = _planned(tmp_path / "b", load_grid("batch_vs_dim", "smoke"))  # no scale given: the grid's own
    assert len(plan.points) == 4 and {p.params["scale"] for p in plan.points} == {"smoke"}
    plan = _planned(tmp_path / "c", load_grid("batch_vs_dim", "smoke"), options=RunOptions(scale="smoke"))
    assert len(plan.points) == 4
    with pytest.raises(ConfigError) as info:  # it was silently run at smoke scale
        ablate.run_grid(load_grid("batch_vs_dim", "smoke"), storage=str(tmp_path / "d"), scale="laptop")
    assert str(info.value) == (
        "--scale laptop: grid batch_vs_dim was loaded at scale smoke; load it at laptop, or pass its name or file "
        "to resolve it at that scale"
    )
    assert not (tmp_path / "d").exists() and not ray_started()


# ---------------------------------------------------------------------- a bad value: one line, everywhere
BAD = [
    (["--preset", "fsat"], {"preset": "fsat"}, "unknown preset 'fsat' (did you mean 'fast'?)"),
    (["--set", "no_such_key=1"], {"settings": ["no_such_key=1"]}, "--set no_such_key: unknown setting"),
    (["--set", "lr=-1"], {"settings": ["lr=-1"]}, "lr"),
    (["--set", "seed=3"], {"settings": ["seed=3"]}, "--set seed: a grid runs every point with each of its seeds"),
    (["--variants", "aninfnce"], {"variants": "aninfnce"}, "--variants: unknown variant 'aninfnce' of grid anisotropy"),
]


@pytest.mark.parametrize(("argv", "fields", "says"), BAD, ids=[" ".join(a) for a, _, _ in BAD])
def test_a_bad_preset_set_or_variant_is_one_line_from_run_slurm_and_run_grid(tmp_path, ablate_cli, argv, fields, says):
    storage = tmp_path / "runs"
    common = ["anisotropy", "--scale", "smoke", "--storage", str(storage), *argv]
    run = ablate_cli("run", *common).refusal()
    slurm = ablate_cli("slurm", *common).refusal()
    assert says in run, run
    for grid in ("anisotropy", load_grid("anisotropy", "smoke")):
        with pytest.raises((ConfigError, GridError, PresetError)) as info:
            ablate.run_grid(grid, storage=str(storage), scale="smoke", **fields)
        assert run == slurm == f"ablate: error: {info.value}"
    assert not storage.exists() and not ray_started()


def test_a_bad_scale_is_refused_by_run_slurm_and_run_grid_before_ray(tmp_path, ablate_cli):
    storage = tmp_path / "runs"
    for command in ("run", "slurm"):
        done = ablate_cli(command, "anisotropy", "--scale", "huge", "--storage", str(storage))
        assert done.returncode == 2 and not done.ray_started
        assert f"ablate {command}: error: argument --scale: invalid choice: 'huge'" in done.stderr, done.stderr
    with pytest.raises(ConfigError, match=r"^--scale 'huge': input should be 'smoke', 'laptop' or 'paper'"):
        ablate.run_grid("anisotropy", storage=str(storage), scale="huge")
    assert not storage.exists() and not ray_started()


def test_train_refuses_an_unknown_preset_in_the_words_of_run(ablate_cli):
    run = ablate_cli("run", "anisotropy", "--scale", "smoke", "--preset", "fsat").refusal()
    train = ablate_cli("train", "--preset", "fsat", "--steps", "1").refusal()
    assert train == run


# ---------------------------------------------------------------------- the checks run once
CHECKS = [
    ("ablate.service.execution.memory", "check_memory"),
    ("ablate.service.execution.packs", "resolve_pack"),
    ("ablate.service.execution.probes", "probe_plugins"),
    ("ablate.service.execution.probes", "probe_acceptance"),
]


def _count_calls(monkeypatch) -> dict[str, list]:
    """Each check of :data:`CHECKS`, counted wherever an ablate module holds it."""
    importlib.import_module("ablate.cli.run")
    importlib.import_module("ablate.service.execution.runner")
    calls: dict[str, list] = {}
    for module_name, name in CHECKS:
        original = getattr(importlib.import_module(module_name), name)
        calls[name] = []

        def counted(*args, _original=original, _calls=calls[name], **kwargs):
            _calls.append(next(a for a in (*args, *kwargs.values()) if isinstance(a, Grid)))
            return _original(*args, **kwargs)

        for module in list(sys.modules.values()):
            if getattr(module, "__name__", "").startswith("ablate") and getattr(module, name, None) is original:
                monkeypatch.setattr(module, name, counted)
    return calls


def test_ablate_run_checks_each_grid_once_before_the_first_starts(tmp_path, ablate_cli, monkeypatch):
    calls = _count_calls(monkeypatch)

    def stop(grid, plan):
        raise Stop

    monkeypatch.setattr("ablate.cli.run._print_plan", stop)
    with pytest.raises(Stop):
        ablate_cli("run", "batch_vs_dim", "tricl", "--scale", "smoke", "--storage", str(tmp_path))
    assert not ray_started()
    for name, seen in calls.items():  # both grids checked before the first starts, and not again
        assert [g.name for g in seen] == ["batch_vs_dim", "tricl"], (name, seen)


def test_run_grid_checks_once(tmp_path, monkeypatch):
    calls = _count_calls(monkeypatch)
    _planned(tmp_path, "batch_vs_dim", scale="smoke", preset="fast", settings=["batch_size=16"])
    for name, seen in calls.items():
        assert len(seen) == 1 and seen[0].preset == "fast", (name, seen)
