"""A run directory is the record: resume and extend a run from ablate's own files (real Ray, real files).

Each case counts trainings (a test-only Trainable logs every trial it builds), not folders: a run again with more
seeds trains only the new seed's points, a higher ``max_steps`` continues every trial with no step twice, and a
run whose every file Ray wrote at its root is deleted still resumes to the numbers of one never stopped.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import optuna_journal, run_logged, sigterm_after, smoke_cmd

from ablate.analysis.results import load_results
from ablate.service.execution.runner import run_grid
from ablate.service.specs.grids import load_grid
from tests.service.execution.faulty import counting

_TIMING = ["time_total_s", "prefetch", "status"]


def _trainings(log: Path) -> list[tuple[str, int]]:
    return [(line.split()[0], int(line.split()[1])) for line in log.read_text().splitlines()] if log.exists() else []


def _export(run_dir: Path):
    df = load_results(run_dir)
    return (
        df.drop(columns=[c for c in _TIMING if c in df.columns])
        .sort_values(["trial_id", "step"])
        .reset_index(drop=True)
    )


@pytest.mark.ray
def test_more_seeds_train_only_the_new_seed_and_a_finished_run_again_trains_nothing(tmp_path):
    log = tmp_path / "trainings.txt"
    first = run_grid(load_grid("batch_vs_dim", "smoke"), storage=str(tmp_path), verbose=0, trainable=counting(log))
    assert len(first.plan.started) == 4 and not first.failed
    before = {p.name: p.read_text() for p in first.run_dir.glob("trial_*/result.json")}
    grid = load_grid("batch_vs_dim", "smoke")
    grid.seeds = [0, 1]
    log.unlink()
    second = run_grid(grid, storage=str(tmp_path), verbose=0, trainable=counting(log))
    assert (len(second.plan.reused), len(second.plan.started)) == (4, 4) and not second.failed
    trained = _trainings(log)
    assert len(trained) == 4 and all("seed=1" in tid and step == 0 for tid, step in trained), trained
    assert {p.name: p.read_text() for p in first.run_dir.glob("trial_*/result.json") if p.name in before} == before
    assert len(second.trials) == 8 and {t.status for t in second.trials} == {"TERMINATED"}
    from ablate.analysis.status import run_status

    assert run_status(first.run_dir)["last_run"] == "8 points: 4 reused, 0 continued, 4 started"
    log.unlink()
    third = run_grid(grid, storage=str(tmp_path), verbose=0, trainable=counting(log))
    assert len(third.plan.reused) == 8 and not third.plan.units and not log.exists(), "nothing left: Ray not started"
    marker = json.loads((first.run_dir / "ablate_run.json").read_text())
    assert len(marker["points"]) == 8 and marker["n_trials"] == 8 and len(marker["runs"]) == 3


@pytest.mark.ray
def test_a_higher_max_steps_continues_every_finished_trial_as_one_curve(tmp_path):
    grid = load_grid("batch_vs_dim", "smoke")
    grid.stop.max_steps = 20
    straight = run_grid(grid, storage=str(tmp_path), name="straight", verbose=0)
    assert not straight.failed
    log = tmp_path / "trainings.txt"
    short = load_grid("batch_vs_dim", "smoke")  # max_steps 10
    run_grid(short, storage=str(tmp_path), name="extended", verbose=0)
    longer = load_grid("batch_vs_dim", "smoke")
    longer.stop.max_steps = 20
    outcome = run_grid(longer, storage=str(tmp_path), name="extended", verbose=0, trainable=counting(log))
    assert len(outcome.plan.continued) == 4 and not outcome.failed
    assert sorted(step for _, step in _trainings(log)) == [10] * 4, "each continued from its checkpoint at step 10"
    extended = load_results(outcome.run_dir)
    for _, trial in extended.groupby("trial_id"):
        assert trial["step"].tolist() == [5, 10, 15, 20] and trial["training_iteration"].tolist() == [1, 2, 3, 4]
        assert trial["time_total_s"].is_monotonic_increasing
    # the schedule (warm-up, cosine) reads max_steps: steps 15-20 match a run of 20 from the start only in shape,
    # so compare what both runs share exactly: the first 10 steps
    a, b = _export(outcome.run_dir), _export(straight.run_dir)
    assert a[a["step"] <= 10][["step", "r2", "loss"]].equals(b[b["step"] <= 10][["step", "r2", "loss"]])


def _delete_ray_files(run_dir: Path) -> list[str]:
    """Every file at the run's root that is not ablate's (Ray Tune's experiment states, tuner.pkl, searcher and
    variant states, if it wrote any there)."""
    ours = {"ablate_run.json", "ablate_provenance.jsonl", "ablate_environment.txt"}
    ours |= {"ablate_driver.lock", "ablate_interrupted.json", "optuna.journal", "report.html"}
    gone = [p.name for p in run_dir.iterdir() if p.is_file() and p.name not in ours]
    for name in gone:
        (run_dir / name).unlink()
    return gone


@pytest.mark.ray
def test_an_interrupted_grid_resumes_with_every_file_ray_wrote_deleted(tmp_path, ray_session, ablate_cli):
    extra = ("--set", "max_steps=400", "--max-concurrent", "1", "--no-report", "--no-dashboard")
    argv = smoke_cmd(tmp_path, "--name", "g", *extra)
    sigterm_after(argv, tmp_path / "g", 20, tmp_path / "first.log")
    gone = _delete_ray_files(tmp_path / "g")
    assert gone == [], f"Ray Tune keeps its own files outside the run directory: {gone}"
    assert not [p for p in (tmp_path / "g").rglob("*") if p.name in ("error.pkl", "error.txt", "params.pkl")]
    resumed = ablate_cli(*argv[3:], "--resume")  # in this process, on the suite's Ray, as the run never stopped:
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "reused" in resumed.stdout and "continued" in resumed.stdout, resumed.stdout
    assert ablate_cli(*smoke_cmd(tmp_path, "--name", "clean", *extra)[3:]).returncode == 0
    a, b = _export(tmp_path / "g"), _export(tmp_path / "clean")
    assert len(a) == 4 * 80
    assert a.drop(columns=["trial_id"]).equals(b.drop(columns=["trial_id"])) and a["trial_id"].equals(b["trial_id"])


@pytest.fixture(scope="module")
def smoke(ray_session, tmp_path_factory) -> Path:
    from conftest import runs_root, smoke_run

    return smoke_run("batch_vs_dim", runs_root(tmp_path_factory))


def test_a_tampered_params_json_is_flagged_and_left_out(smoke, tmp_path, capsys):
    from ablate import cli
    from ablate.analysis.status import run_status
    from ablate.reports.report import write_report

    run_dir = tmp_path / smoke.name
    shutil.copytree(smoke, run_dir)
    victim = sorted(p for p in run_dir.glob("trial_*") if p.is_dir())[0]
    params = json.loads((victim / "params.json").read_text())
    (victim / "params.json").write_text(json.dumps({**params, "concentration": 12345, "seed": "zero"}))
    tid = victim.name.removeprefix("trial_")
    info = run_status(run_dir)
    assert "disagrees with the run's record" in info["damaged"][tid]
    row = next(r for r in info["trials"] if r["trial"] == tid)
    assert row["seed"] == params["seed"], "status shows the record's values, never the edited ones"
    df = load_results(run_dir)
    assert tid not in set(df["trial_id"]) and df["trial_id"].nunique() == 3
    assert "12345" not in df.astype(str).to_string()
    page = Path(write_report(str(run_dir))).read_text()
    assert "1 trial(s) left out: their params.json disagrees" in page and tid in page
    capsys.readouterr()
    assert cli.main(["compare", str(run_dir), "--by", "batch_size"]) == 0
    assert "12345" not in capsys.readouterr().out


def test_the_hint_after_a_hand_edited_params_json_says_what_resume_does(smoke, tmp_path, capsys):
    """issue 36: status said `--resume` would run a hand-edited trial's reports again; it reused the finished
    trial and left it out as before. The hint now reads the plan's own decision; the resume then does just that: a
    finished trial stays left out, an unfinished one gets its params.json back and continues."""
    from ablate import cli
    from ablate.analysis.status import run_status

    run_dir = tmp_path / smoke.name
    shutil.copytree(smoke, run_dir)
    finished, unfinished = sorted(p for p in run_dir.glob("trial_*") if p.is_dir())[:2]
    for victim in (finished, unfinished):
        params = json.loads((victim / "params.json").read_text())
        (victim / "params.json").write_text(json.dumps({**params, "lr": 0.5}, indent=2, sort_keys=True))
    log = unfinished / "result.json"
    log.write_text(log.read_text().splitlines()[0] + "\n")  # its report at step 5 only: unfinished
    done, todo = (p.name.removeprefix("trial_") for p in (finished, unfinished))

    hints = run_status(run_dir)["damaged"]
    assert hints[done] == (
        "params.json disagrees with the run's record of its point: left out of export, report and compare; "
        "--resume reuses the trial as finished and leaves its params.json as it is, so it stays left out until its "
        "params.json holds the recorded settings again (the trial's entry in the run marker's points)"
    )
    assert hints[todo] == (
        "params.json disagrees with the run's record of its point: left out of export, report and compare until "
        "--resume, which writes its params.json again from the grid's point and continues the trial from its "
        "newest checkpoint"
    )
    capsys.readouterr()
    assert cli.main(["status", str(run_dir)]) == 0
    printed = capsys.readouterr().out
    assert f"trial {done}: {hints[done]}\n" in printed and f"trial {todo}: {hints[todo]}\n" in printed
    assert "runs the missing reports again" not in printed

    argv = ["run", "batch_vs_dim", "--scale", "smoke", "--storage", str(tmp_path), "--resume", "--no-report"]
    assert cli.main(argv) == 0
    assert "4 points: 3 reused, 1 continued, 0 started" in capsys.readouterr().out
    after = run_status(run_dir)
    assert after["damaged"] == {done: hints[done]}, "the finished trial stays left out, as the hint said"
    assert json.loads((finished / "params.json").read_text())["lr"] == 0.5
    recorded = json.loads((run_dir / "ablate_run.json").read_text())["points"][todo]
    assert json.loads((unfinished / "params.json").read_text()) == recorded, "written again from the grid's point"
    df = load_results(run_dir)
    assert done not in set(df["trial_id"]) and df[df["trial_id"] == todo]["step"].tolist() == [5, 10]
    assert after["counts"]["finished"] == 4


@pytest.mark.ray
def test_a_pack_member_s_cut_log_is_refilled_on_resume(tmp_path, ray_session, ablate_cli):
    """A packed run stopped mid-way, one member's result.json cut to 5 rows and half a row: --resume continues
    the pack from a checkpoint every member's log covers, and the member's export holds every step once."""
    extra = ("--set", "max_steps=600", "report_every=10", "--pack", "4", "--no-report", "--max-concurrent", "1")
    extra += ("--no-dashboard",)
    argv = smoke_cmd(tmp_path, "--name", "p", *extra)
    sigterm_after(argv, tmp_path / "p", 60, tmp_path / "first.log")
    states = [torch.load(c, weights_only=True) for c in (tmp_path / "p").glob("trial_pack-*/checkpoint_*/state.pt")]
    stacked = [state for state in states if "stacked" in state]
    assert stacked and all("members" not in state for state in stacked)  # a pack's checkpoint: each weight once
    logs = sorted(p for p in (tmp_path / "p").glob("trial_*/result.json"))
    victim = max(logs, key=lambda p: len(p.read_text().splitlines()))
    lines = victim.read_text().splitlines(keepends=True)
    assert len(lines) > 6
    victim.write_text("".join(lines[:5]) + lines[5][: len(lines[5]) // 2])
    resumed = ablate_cli(*argv[3:], "--resume")  # in this process, on the suite's Ray
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "0 continued" not in resumed.stdout, resumed.stdout  # the pack went on from its checkpoint, not from step 0
    df = load_results(tmp_path / "p")
    for _, trial in df.groupby("trial_id"):
        assert trial["step"].tolist() == list(range(10, 601, 10)), trial["step"].tolist()
    code, status = run_logged([sys.executable, "-m", "ablate.cli", "status", str(tmp_path / "p")], tmp_path / "s.log")
    assert "finished: 4" in status and "intact" not in status, status


@pytest.mark.ray
def test_a_search_stopped_twice_resumes_to_its_budget_with_its_study_and_the_folders_agreeing(
    tmp_path, ablate_cli, ray_session
):
    import optuna

    argv = [sys.executable, "-m", "ablate.cli", "run", "tune_aninfonce", "--scale", "smoke", "--storage", str(tmp_path)]
    argv += ["--name", "s", "--set", "max_steps=300", "--max-concurrent", "1", "--no-report", "--no-dashboard"]
    run_dir = tmp_path / "s"
    for i, rows in enumerate((8, 30)):
        sigterm_after([*argv, *(["--resume"] if i else [])], run_dir, rows, tmp_path / f"run{i}.log")
        stopped = (tmp_path / f"run{i}.log").read_text()
        assert "--resume" in stopped and "Tuner.restore" not in stopped, stopped[-3000:]  # ablate's hint, not Ray's
    final = ablate_cli(*argv[3:], "--resume")  # in this process, on the suite's Ray
    assert final.returncode == 0, final.stderr[-3000:]
    study = optuna.load_study(study_name="tune_aninfonce", storage=optuna_journal(run_dir))
    closed = set(study.user_attrs.get("ablate_continued", []))
    trials = study.get_trials(deepcopy=False)
    counted = [t for t in trials if t.number not in closed]
    assert len(counted) == 4 and all(t.state.is_finished() for t in trials), [(t.number, t.state) for t in trials]
    folders = {}
    for folder in run_dir.glob("trial_*"):
        if (folder / "params.json").is_file():
            folders[folder.name] = json.loads((folder / "params.json").read_text())
    space = ["lr", "lr_lambda", "lr_schedule", "batch_size", "encoder_widths", "report_every"]
    in_study = {
        json.dumps([t.params[k] if k != "encoder_widths" else json.loads(t.params[k]) for k in space]) for t in trials
    }
    in_folders = {json.dumps([p[k] for k in space]) for p in folders.values()}
    assert in_folders == in_study, (in_folders, in_study)
    from ablate.analysis.status import run_status

    info = run_status(run_dir)
    assert info["counts"]["interrupted"] == 0 and info["counts"]["running"] == 0, info["counts"]


@pytest.mark.ray
def test_two_grids_in_one_run_are_read_one_grid_at_a_time(tmp_path, capsys):
    """Another grid into the same run is normal; status, export, report and claims read the grid it ran last, or the
    one ``--grid`` names, with that grid's axes."""
    from ablate import cli
    from ablate.analysis.status import run_status
    from ablate.service.records.rundir import RunError

    first = run_grid(load_grid("batch_vs_dim", "smoke"), storage=str(tmp_path), name="both", verbose=0)
    second = run_grid(load_grid("zimmermann_sphere", "smoke"), storage=str(tmp_path), name="both", verbose=0)
    assert not first.failed and not second.failed and len(second.plan.started) == len(second.trials)
    run_dir = tmp_path / "both"
    assert set(load_results(run_dir)["trial_id"]) == {t.trial_id for t in second.trials}
    df = load_results(run_dir, grid="batch_vs_dim")
    assert set(df["trial_id"]) == {t.trial_id for t in first.trials} and {"batch_size", "latent_dim"} <= set(df)
    info = run_status(run_dir, "batch_vs_dim")
    assert info["grid"] == "batch_vs_dim" and info["counts"]["finished"] == 4 and info["counts"]["pending"] == 0
    assert cli.main(["report", str(run_dir), "--grid", "batch_vs_dim"]) == 0
    assert (run_dir / "report-batch_vs_dim.html").is_file()
    assert cli.main(["export", str(run_dir), "--grid", "batch_vs_dim"]) == 0
    assert len(pd.read_csv(run_dir / "results-batch_vs_dim.csv")) == len(df)
    with pytest.raises(RunError, match="holds no run of grid 'tricl'; its grids: batch_vs_dim, zimmermann_sphere"):
        load_results(run_dir, grid="tricl")
