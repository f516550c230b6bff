"""A params.json edited by hand (issue 36): every reader leaves the trial out and says so, and ``ablate status``'s
hint says what the next ``--resume`` really does, as the plan decides it (``ablate.service.records.plan.decide_run``,
which writes nothing and needs no Ray). On batch_vs_dim at smoke scale built by hand
(tests/unfinished_runs.finished_smoke_run), one point per branch of the plan's decision."""

from __future__ import annotations

import json

from unfinished_runs import finished_smoke_run

from ablate import cli
from ablate.analysis.finished import edited_line
from ablate.service.records.plan import apply_plan, decide_run
from ablate.service.records.rundir import PARAMS_FILE, TRIAL_PREFIX
from ablate.service.records.trial import write_checkpoint
from ablate.service.records.trial_log import ERROR_KEY
from ablate.service.specs.grids import load_grid

_HEAD = "params.json disagrees with the run's record of its point: left out of export, report and compare"
_NAN = "NonFiniteLossError: loss became nan at step 7 (seed 0)"


def _rows(i: int, point) -> list[dict]:
    """Point 0 finished (steps 5, 10 of 10); 1 failed (its loss went non-finite at step 7); 2 was stopped at step 5
    (a checkpoint there); 3 never reported."""
    report = [{"step": s, "training_iteration": n + 1, "r2": s / 100} for n, s in enumerate((5, 10))]
    return [report, [report[0], {"step": 7, "training_iteration": 2, ERROR_KEY: _NAN}], report[:1], []][i]


def _edited_run(tmp_path):
    """The run, with every trial's params.json edited by hand (``lr`` 0.5); the trial ids in the grid's order."""
    run_dir = tmp_path / "batch_vs_dim-smoke"
    ids = finished_smoke_run(run_dir, _rows)
    write_checkpoint(run_dir / f"{TRIAL_PREFIX}{ids[2]}", {"step": 5}, keep=2)
    for tid in ids:
        path = run_dir / f"{TRIAL_PREFIX}{tid}" / PARAMS_FILE
        path.write_text(json.dumps({**json.loads(path.read_text()), "lr": 0.5}, indent=2, sort_keys=True))
    return run_dir, ids


def _printed_hints(run_dir, capsys) -> dict[str, str]:
    """trial id → the hint `ablate status` printed for it."""
    capsys.readouterr()
    assert cli.main(["status", str(run_dir)]) == 0
    lines = [x.removeprefix("trial ") for x in capsys.readouterr().out.splitlines() if _HEAD in x]
    return dict(line.split(": ", 1) for line in lines)


def test_the_status_hint_after_a_hand_edited_params_json_says_what_the_plan_decides(tmp_path, capsys):
    """Each hint names the plan's own decision for the trial: a finished or failed one is reused and its
    params.json left as it is (so it stays left out); one with reports continues from its newest checkpoint and one
    without starts, each with its params.json written again from the grid's point (so it counts again)."""
    run_dir, (done, failed, stopped, fresh) = _edited_run(tmp_path)
    hints = _printed_hints(run_dir, capsys)
    keep = "and leaves its params.json as it is, so it stays left out until its params.json holds the recorded"
    assert hints[done] == f"{_HEAD}; --resume reuses the trial as finished {keep} " + (
        "settings again (the trial's entry in the run marker's points)"
    )
    assert hints[failed].startswith(f"{_HEAD}; --resume reuses the trial as it ended (failed) {keep}")
    rewrite = f"{_HEAD} until --resume, which writes its params.json again from the grid's point and"
    assert hints[stopped] == f"{rewrite} continues the trial from its newest checkpoint"
    assert hints[fresh] == f"{rewrite} starts the trial"

    plan = decide_run(load_grid("batch_vs_dim", "smoke"), run_dir)  # what the next --resume does, nothing written
    assert sorted(plan.reused) == sorted([done, failed]) and plan.continued == [stopped] and plan.started == [fresh]
    assert {p.trial_id for p in plan.params} == {stopped, fresh}, "only these get their params.json written again"
    assert plan.cuts[stopped] == 5, "it continues from its checkpoint at step 5"

    apply_plan(plan, run_dir)  # the resume's writes, without Ray
    assert set(_printed_hints(run_dir, capsys)) == {done, failed}, "left out still: the two it reused"
    assert json.loads((run_dir / f"{TRIAL_PREFIX}{done}" / PARAMS_FILE).read_text())["lr"] == 0.5
    recorded = json.loads((run_dir / "ablate_run.json").read_text())["points"]
    for tid in (stopped, fresh):
        assert json.loads((run_dir / f"{TRIAL_PREFIX}{tid}" / PARAMS_FILE).read_text()) == recorded[tid]


def test_compare_and_export_say_which_trials_they_leave_out_for_a_hand_edited_params_json(tmp_path, capsys):
    """`ablate compare` and `ablate export` left a hand-edited trial out without a word (the status hint says "left
    out of export, report and compare"): each prints the report's line naming it (compare at ``final`` and at a
    step), and reads the other trials."""
    run_dir = tmp_path / "batch_vs_dim-smoke"
    ids = finished_smoke_run(run_dir, lambda i, p: [{"step": 10, "training_iteration": 1, "r2": 0.5 + i / 10}])
    path = run_dir / f"{TRIAL_PREFIX}{ids[0]}" / PARAMS_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), "lr": 0.5}))
    line = edited_line([ids[0]])
    assert line == (
        "1 trial(s) left out: their params.json disagrees with the run's record of their point (edited by hand?): "
        f"{ids[0]}"
    )
    for at in ("final", "10"):
        assert cli.main(["compare", str(run_dir), "--by", "batch_size", "--at", at]) == 0
        out = capsys.readouterr().out
        assert [x for x in out.splitlines() if "left out" in x] == [line]
        assert out.count("16 − 32") == 1 and "1 vs 1" in out  # latent_dim 3 only: its point at 6 lost a trial
    assert cli.main(["report", str(run_dir), "--out", str(tmp_path / "r.html")]) == 0
    assert line in capsys.readouterr().out.splitlines(), "the report's words, word for word"
    assert cli.main(["export", str(run_dir), "--out", str(tmp_path / "r.csv")]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [line], "export says it too"
    assert ids[0] not in (tmp_path / "r.csv").read_text()
