"""The run plan (:func:`ablate.service.records.plan.plan_run`) decided from trial folders the test writes, without Ray:
what running a grid into an existing run directory does to each point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ablate.service.records.plan import grid_points, plan_run
from ablate.service.records.rundir import PARAMS_FILE, RESULT_FILE, TRIAL_PREFIX, RunError
from ablate.service.specs.grids import load_grid


def _grid(max_steps: int | None = None):
    grid = load_grid("batch_vs_dim", "smoke")
    if max_steps is not None:
        grid.apply_settings({"max_steps": max_steps}, "--set", axes_win=False)
    return grid


def _finished_run(run_dir: Path, steps: int, report_every: int = 5) -> list[str]:
    """Trial folders of every point of the smoke grid, each with a log of reports up to ``steps``."""
    ids = []
    for point in grid_points(_grid()):
        folder = run_dir / f"{TRIAL_PREFIX}{point.trial_id}"
        folder.mkdir(parents=True)
        (folder / PARAMS_FILE).write_text(json.dumps(point.params, indent=2, sort_keys=True))
        rows = [
            {"step": s, "training_iteration": i + 1, "r2": 0.5}
            for i, s in enumerate(range(report_every, steps + 1, report_every))
        ]
        (folder / RESULT_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
        ids.append(point.trial_id)
    return ids


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_a_finished_run_is_reused_point_for_point(tmp_path):
    ids = _finished_run(tmp_path, 10)
    plan = plan_run(_grid(), tmp_path)
    assert sorted(plan.reused) == sorted(ids) and not plan.continued and not plan.started and not plan.units


def test_a_higher_max_steps_continues_every_finished_trial(tmp_path):
    ids = _finished_run(tmp_path, 10)
    plan = plan_run(_grid(20), tmp_path)
    assert sorted(plan.continued) == sorted(ids) and not plan.reused


def test_a_lower_max_steps_than_the_run_trained_is_refused_before_anything_is_written(tmp_path):
    """It used to say "4 reused" and leave the marker at the lower budget while each params.json kept the higher
    one, so status, export and the report left out every trial."""
    _finished_run(tmp_path, 10)
    before = _snapshot(tmp_path)
    with pytest.raises(RunError) as refused:
        plan_run(_grid(5), tmp_path)
    message = str(refused.value)
    assert message.startswith("max_steps 5: 4 trial(s) of this run trained past it (trial_"), message
    assert message.endswith(
        "to step 10); a run keeps what it trained: run it with max_steps >= 10, or start a new run with another --name"
    )
    assert _snapshot(tmp_path) == before


def test_set_seeds_extends_a_run_with_the_new_seeds_only(tmp_path):
    ids = _finished_run(tmp_path, 10)
    grid = _grid()
    grid.apply_settings({"seeds": [0, 1, 2]}, "--set", axes_win=False)
    plan = plan_run(grid, tmp_path)
    assert sorted(plan.reused) == sorted(ids) and len(plan.started) == 8 and not plan.continued
    assert {p.config.seed for p in plan.points if p.trial_id in plan.started} == {1, 2}


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("seed=7", "--set seed: a grid runs every point with each of its seeds ([0]), so one seed would be ignored; "
         "give the list: --set seeds=[0,1,2]"),
        ("seed=[1,2]", "--set seed: a grid runs every point with each of its seeds"),
        ("seeds=[0,0]", "--set seeds: expected a list of distinct whole numbers, e.g. [0, 1, 2], got [0, 0]"),
    ],
)  # fmt: skip
def test_set_seed_is_refused_for_the_seeds_list(tmp_path, capsys, setting, says):
    from ablate import cli

    code = cli.main(["run", "batch_vs_dim", "--scale", "smoke", "--storage", str(tmp_path), "--set", setting])
    err = capsys.readouterr().err
    assert code == 2 and says in err, err
    assert not any(tmp_path.iterdir())


def test_a_trial_folder_that_links_out_of_the_run_is_refused_before_anything_is_written(tmp_path, capsys):
    """It was written through without a word: logs cut and checkpoints dropped in a folder outside the storage."""
    from ablate import cli

    storage = tmp_path / "storage"
    ids = _finished_run(storage / "r", 10)
    (storage / "r" / "ablate_run.json").write_text(json.dumps({"grid": "batch_vs_dim", "scale": "smoke"}))
    outside = tmp_path / "elsewhere"
    (storage / "r" / f"{TRIAL_PREFIX}{ids[0]}").rename(outside)
    (storage / "r" / f"{TRIAL_PREFIX}{ids[0]}").symlink_to(outside)
    before = _snapshot(outside)
    code = cli.main(
        ["run", "batch_vs_dim", "--scale", "smoke", "--storage", str(storage), "--name", "r", "--set", "max_steps=20"]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"ablate: error: {storage / 'r' / f'{TRIAL_PREFIX}{ids[0]}'}: a trial folder that links to {outside}" in err
    assert _snapshot(outside) == before


def test_a_search_trial_killed_while_its_settings_were_drawn_is_closed_not_evaluated_again(tmp_path):
    """kill -9 can land while Optuna writes a new trial's settings one by one: that trial never ran, and asking
    Tune to evaluate its partial settings again failed the resume ("Dim of point ... and parameter_names")."""
    import optuna
    from conftest import optuna_journal

    from ablate.service.execution.search import finished_samples, unfinished_points

    grid = load_grid("tune_aninfonce", "smoke")
    study = optuna.create_study(study_name=grid.name, storage=optuna_journal(tmp_path), direction="maximize")
    full = {name: 1 for name in grid.optuna.space}
    for params in (full, {"report_every": 5}):
        trial = study.ask()
        for name, value in params.items():
            study._storage.set_trial_param(trial._trial_id, name, value, optuna.distributions.IntDistribution(0, 9))
    assert unfinished_points(grid, str(tmp_path)) == [full]
    states = [t.state for t in optuna.load_study(study_name=grid.name, storage=optuna_journal(tmp_path)).trials]
    assert states == [optuna.trial.TrialState.FAIL] * 2
    assert finished_samples(grid, str(tmp_path)) == 0  # closed as continued: neither counts against the budget


# ------------------------------------------------------------------ the plan as a decision (decide_run), then its writes


def _checkpoints(run_dir: Path, ids: list[str], steps: list[int]) -> None:
    from ablate.service.records.trial import write_checkpoint

    for tid in ids:
        for step in steps:
            write_checkpoint(run_dir / f"{TRIAL_PREFIX}{tid}", {"step": step}, keep=len(steps))


def _log_of(run_dir: Path, tid: str) -> list[int]:
    path = run_dir / f"{TRIAL_PREFIX}{tid}" / RESULT_FILE
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def _scenario(name: str, run_dir: Path):
    """A run made by the test, changed as a user changes it, and the grid run into it next."""
    ids = _finished_run(run_dir, 10)
    _checkpoints(run_dir, ids, [5, 10])
    grid = _grid()
    if name == "cut log":  # a kill tore the last line of one trial's log: it continues from step 5
        path = run_dir / f"{TRIAL_PREFIX}{ids[0]}" / RESULT_FILE
        path.write_text(path.read_text()[:-7])
    elif name == "damaged checkpoint":  # the newest checkpoint is garbage and the log was cut to step 5 by hand
        (run_dir / f"{TRIAL_PREFIX}{ids[0]}" / "checkpoint_000000010" / "state.pt").write_bytes(b"garbage")
        grid.apply_settings({"max_steps": 15}, "--set", axes_win=False)
    elif name == "more seeds":
        grid.apply_settings({"seeds": [0, 1]}, "--set", axes_win=False)
    elif name == "higher max_steps":
        grid.apply_settings({"max_steps": 20}, "--set", axes_win=False)
    elif name == "changed report_every":  # not a science setting: the same points, finished
        grid.apply_settings({"report_every": 2}, "--set", axes_win=False)
    elif name == "science --set":  # another lr: new points beside the old ones
        grid.apply_settings({"lr": 0.001}, "--set", axes_win=False)
    elif name == "tampered params.json":  # a finished trial stays as it ended, its params.json untouched
        path = run_dir / f"{TRIAL_PREFIX}{ids[0]}" / PARAMS_FILE
        path.write_text(path.read_text().replace('"seed": 0', '"seed": 0, "lr": 0.5'))
    elif name == "another grid in the run":
        grid = load_grid("tricl", "smoke")
    return ids, grid


#: scenario → (reused, continued, started) and, for the first trial, the step its log is cut back to (None: kept)
SCENARIOS = {
    "finished": ((4, 0, 0), None),
    "cut log": ((3, 1, 0), 5),
    "damaged checkpoint": ((0, 4, 0), 5),
    "more seeds": ((4, 0, 4), None),
    "higher max_steps": ((0, 4, 0), 10),
    "changed report_every": ((4, 0, 0), None),
    "science --set": ((0, 0, 4), None),
    "tampered params.json": ((4, 0, 0), None),
    "another grid in the run": (None, None),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_plan_is_decided_from_the_files_without_writing_then_applied(tmp_path, name):
    from ablate.service.records.plan import apply_plan, decide_run

    ids, grid = _scenario(name, tmp_path)
    before = _snapshot(tmp_path)
    plan = decide_run(grid, tmp_path)
    assert _snapshot(tmp_path) == before, "deciding wrote into the run"
    counts, cut = SCENARIOS[name]
    if counts is not None:
        assert (len(plan.reused), len(plan.continued), len(plan.started)) == counts
    else:  # another grid's points: all new, the first grid's trials not touched
        assert plan.started and not plan.reused and not set(plan.started) & set(ids)
    if cut is not None:
        assert plan.cuts[ids[0]] == cut and plan.drops[ids[0]] == cut
    apply_plan(plan, tmp_path)
    for p in plan.params:  # what apply writes: each trained point's params.json, the logs cut back
        assert json.loads((tmp_path / f"{TRIAL_PREFIX}{p.trial_id}" / PARAMS_FILE).read_text()) == p.params
    for tid, step in plan.cuts.items():
        assert (
            all(s <= step for s in _log_of(tmp_path, tid))
            if (tmp_path / f"{TRIAL_PREFIX}{tid}" / RESULT_FILE).exists()
            else True
        )
    untouched = [tid for tid in ids if tid in plan.reused] if counts is not None else ids
    for tid in untouched:
        prefix = f"{TRIAL_PREFIX}{tid}/"
        assert {k: v for k, v in _snapshot(tmp_path).items() if k.startswith(prefix)} == {
            k: v for k, v in before.items() if k.startswith(prefix)
        }, f"{tid}: a reused trial was written to"


def test_a_pack_plan_is_decided_without_writing_and_applied_with_its_pack_file(tmp_path):
    from ablate.service.records.plan import apply_plan, decide_run

    before = _snapshot(tmp_path)
    grid = load_grid("batch_vs_lambda", "smoke")
    plan = decide_run(grid, tmp_path, pack=4)
    assert _snapshot(tmp_path) == before and plan.new_packs
    apply_plan(plan, tmp_path)
    for pid, members in plan.new_packs.items():
        assert json.loads((tmp_path / f"{TRIAL_PREFIX}{pid}" / "pack.json").read_text()) == {"members": members}


def _write_logs(run_dir: Path, points, steps: int = 10) -> None:
    """Each point's folder with its params.json and a log of reports every 5 steps up to ``steps``."""
    for point in points:
        folder = run_dir / f"{TRIAL_PREFIX}{point.trial_id}"
        folder.mkdir(parents=True)
        (folder / PARAMS_FILE).write_text(json.dumps(point.params, indent=2, sort_keys=True))
        rows = [{"step": s, "training_iteration": i + 1, "r2": 0.5} for i, s in enumerate(range(5, steps + 1, 5))]
        (folder / RESULT_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_new_axis_value_starts_its_points_and_reuses_the_others(tmp_path):
    """The grid file gains batch_size 64 at smoke scale: its two new points start, the four finished ones are
    reused untouched."""
    from ablate.service.specs.grids import grid_from_text

    ids = _finished_run(tmp_path, 10)
    before = _snapshot(tmp_path)
    grid = _grid()
    text = grid.text.replace(
        "axes: {batch_size: [16, 32], latent_dim: [3, 6]}", "axes: {batch_size: [16, 32, 64], latent_dim: [3, 6]}"
    )
    assert text != grid.text
    wider = grid_from_text(text, "smoke", grid.path)
    plan = plan_run(wider, tmp_path)
    assert sorted(plan.reused) == sorted(ids) and not plan.continued and len(plan.started) == 2
    assert {p.config.batch_size for p in plan.points if p.trial_id in plan.started} == {64}
    after = _snapshot(tmp_path)
    assert {k: v for k, v in after.items() if k in before} == before, "the reused trials' files are untouched"


def test_another_variant_starts_its_points_and_reuses_the_variant_that_ran(tmp_path):
    """A run of one variant (`--variants aninfonce`), then the whole grid: the other variants' points start and the
    first variant's are reused."""
    grid = load_grid("anisotropy", "smoke")
    first = load_grid("anisotropy", "smoke")
    first.select_variants(["aninfonce"], "--variants")
    ran = grid_points(first)
    _write_logs(tmp_path, ran, steps=first.stop.max_steps)
    plan = plan_run(grid, tmp_path)
    assert sorted(plan.reused) == sorted(p.trial_id for p in ran) and not plan.continued
    started = [p for p in plan.points if p.trial_id in plan.started]
    others = {v.name for v in grid.variants} - {"aninfonce"}
    assert others and {p.params["variant"]["name"] for p in started} == others
