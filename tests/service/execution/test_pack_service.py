"""Packs in the service (`ablate run --pack K`): one Ray trial trains several grid points as one batched model, and
everything downstream (trial folders, status, export, report, claims, resume) sees ordinary trials.

On the CPU a member of a pack makes its solo trial's own kernel calls (tests/core/test_pack.py shows the calls and the
bits), so the packed and unpacked runs are compared for exact equality, not within a tolerance, on any x86 CPU.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
from conftest import rows_by_point, runs_root, smoke_run

from ablate import cli
from ablate.analysis.claims.evaluate import evaluate_run
from ablate.analysis.results import load_results
from ablate.core.pack_fields import pack_groups
from ablate.service.execution.pack_trainable import PackTrainable
from ablate.service.records.trial_log import read_rows
from ablate.service.specs.grids import known_grids, load_grid
from ablate.service.specs.params import PACK_KEY


def _packable(name: str) -> bool:
    grid = load_grid(name, "smoke")
    return grid.search == "grid" and any(len(g) > 1 for g in pack_groups([t.config for t in grid.trials], 8))


PACKABLE = [n for n in sorted(known_grids()) if _packable(n)]


def test_every_grid_that_can_pack_has_a_pack_at_smoke_scale():
    assert {"anisotropy", "batch_vs_lambda"} <= set(PACKABLE), PACKABLE


@pytest.mark.parametrize("name", PACKABLE)
def test_a_packed_run_equals_the_unpacked_run_row_for_row(name, ray_session, tmp_path, tmp_path_factory):
    solo = load_results(smoke_run(name, runs_root(tmp_path_factory)))
    # the packed run sends each pack's reports to Ray in one result (--results-every 3600), the unpacked one as
    # the default says: the log's rows are the same either way
    run = ["run", name, "--scale", "smoke", "--storage", str(tmp_path), "--name", "packed", "--pack", "8"]
    assert cli.main([*run, "--results-every", "3600"]) == 0
    packed = load_results(tmp_path / "packed")
    assert sorted(packed.columns) == sorted(solo.columns)
    assert len(packed) == len(solo) and packed["trial_id"].nunique() == solo["trial_id"].nunique()
    assert packed["pack"].notna().all() and solo["pack"].isna().all()
    assert (packed["status"] == "TERMINATED").all()
    pd.testing.assert_frame_equal(rows_by_point(packed), rows_by_point(solo), check_dtype=False, check_exact=True)
    # one Ray trial per pack; every member has its own folder with params.json and result.json
    grid = load_grid(name, "smoke")
    n_packs = len(pack_groups([t.config for t in grid.trials], 8))
    assert len(list((tmp_path / "packed").glob("trial_*/pack.json"))) == n_packs
    members = [
        p for p in (tmp_path / "packed").glob("trial_*/params.json") if not p.parent.name.startswith("trial_pack-")
    ]
    assert len(members) == grid.n_trials
    for log in (tmp_path / "packed").glob("trial_*/result.json"):
        rows = read_rows(log)
        assert {r["iterations_since_restore"] for r in rows} == {1}, f"{log}: one Ray result carried every report"
        assert [r["training_iteration"] for r in rows] == list(range(1, len(rows) + 1))
    # the report and the claims read it as they read the unpacked run: the same verdicts on the same numbers
    assert (tmp_path / "packed" / "report.html").is_file()
    assert cli.main(["status", str(tmp_path / "packed")]) == 0
    claims = [evaluate_run(d) for d in (tmp_path / "packed", smoke_run(name, runs_root(tmp_path_factory)))]
    assert [(r.claim, r.status, r.value, [c.value for c in r.checks]) for r in claims[0]] == [
        (r.claim, r.status, r.value, [c.value for c in r.checks]) for r in claims[1]
    ]


def _pack_params(**member_overrides):
    grid = load_grid("batch_vs_lambda", "smoke")
    base = {
        "grid": grid.name,
        "scale": "smoke",
        **grid.base,
        **grid.stop.settings(),
        "max_steps": 60,
        "report_every": 20,
    }
    points = [{"seed": 0}, {"seed": 1, **member_overrides}, {"seed": 2}]
    return {**base, PACK_KEY: points}


def test_a_member_that_reaches_its_target_freezes_and_the_others_go_on():
    trainable = PackTrainable(config=_pack_params(target_r2=1e-6))  # member 1 is "done" at its first report (R² > 0)
    first = trainable.train()
    assert first["members"][1]["done"] and not first["done"]
    frozen = trainable.experiment.pack.member_state_dict(1)
    later = [trainable.train() for _ in range(2)]
    assert all(r["members"][1] is None for r in later), "a finished member reports once"
    assert [r["members"][0]["step"] for r in later] == [40, 60] and later[-1]["done"]
    after = trainable.experiment.pack.member_state_dict(1)
    assert after["step"] == frozen["step"] == 20
    for key in ("encoder", "loss"):
        for name, tensor in frozen[key].items():
            assert after[key][name].equal(tensor), f"{key}.{name} changed after the member froze"
    assert "AblatePack[batch_vs_lambda:3:" in repr(trainable) and "seed=0" in repr(trainable)
    trainable.stop()


def test_a_member_whose_loss_goes_non_finite_is_an_error_and_the_others_go_on():
    trainable = PackTrainable(config=_pack_params(lr=1e30, lr_lambda=1e30))
    rows = [trainable.train() for _ in range(3)]
    errors = [r["members"][1] for r in rows if r["members"][1] is not None and "member_error" in r["members"][1]]
    assert len(errors) == 1 and "non-finite" in errors[0]["member_error"]
    assert rows[-1]["done"] and rows[-1]["members"][0]["step"] == 60
    assert all(math.isfinite(r["members"][0]["r2"]) for r in rows)
    trainable.stop()


def test_a_pack_checkpoint_resumes_to_the_same_numbers(tmp_path):
    """A pack stopped after its first report (its members' rows in their logs, written by the driver's ResultLog)
    and built again continues from its own checkpoint to the numbers of a pack that never stopped."""
    from types import SimpleNamespace

    from ablate.service.execution.callbacks import ResultLog

    params = _pack_params()
    straight = PackTrainable(config=params)
    first = [straight.train() for _ in range(3)]
    record = {"dir": str(tmp_path), "id": "pack-p", "keep": 2, "members": ["a", "b", "c"]}
    recorded = {**params, "record": record}
    log, trial = ResultLog(), SimpleNamespace(config=recorded)
    log.on_trial_start(0, [], trial)
    interrupted = PackTrainable(config=recorded)
    log.on_trial_result(0, [], trial, interrupted.train())
    interrupted.stop()
    resumed = PackTrainable(config=recorded)
    assert resumed.experiment.step == 20, "continues from the pack's checkpoint at its first report"
    later = [resumed.train() for _ in range(2)]
    for a, b in zip(first[1:], later):
        for ma, mb in zip(a["members"], b["members"]):
            assert {k: ma[k] for k in ("step", "r2", "loss", "mcc")} == {
                k: mb[k] for k in ("step", "r2", "loss", "mcc")
            }
    for t in (straight, resumed):
        t.stop()


def test_pack_is_refused_for_a_search(tmp_path, capsys):
    code = cli.main(["run", "tune_aninfonce", "--scale", "smoke", "--storage", str(tmp_path), "--pack", "4"])
    assert code != 0
    assert "--pack 4: tune_aninfonce is an Optuna search" in capsys.readouterr().err
