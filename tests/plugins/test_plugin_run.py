"""The plugin example's grid through real Ray (examples/ablate-align-uniform, installed by `make setup`): run
packed with its plugin points solo, SIGTERM, resume, then export, report, compare and provenance, and SLURM."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import run_logged, sigterm_after

from ablate.analysis.results import load_results

pytest.importorskip("ablate_align_uniform", reason="make setup installs examples/ablate-align-uniform")

GRID = Path(__file__).resolve().parents[2] / "examples/ablate-align-uniform/grids/align_uniform_vs_batch.yaml"
EXTRA = ("--set", "max_steps=200", "--max-concurrent", "1", "--no-report", "--pack", "2", "--no-dashboard")


def _cmd(storage: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "ablate.cli", "run", str(GRID), "--scale", "smoke", "--storage", str(storage), *extra]


def _export(run_dir: Path) -> pd.DataFrame:
    df = load_results(run_dir)
    return (
        df.drop(columns=["time_total_s", "prefetch", "status"]).sort_values(["trial_id", "step"]).reset_index(drop=True)
    )


@pytest.mark.ray
def test_a_plugin_grid_runs_packed_resumes_and_reads_like_any_other(tmp_path, ray_session, ablate_cli):
    run = tmp_path / "p"
    sigterm_after(_cmd(tmp_path, "--name", "p", *EXTRA), run, 12, tmp_path / "first.log")
    solo = "2 point(s) train solo, not packed: loss 'align_uniform' is a plugin's, with no packed form (2)"
    assert solo in (tmp_path / "first.log").read_text()
    resumed = ablate_cli(*_cmd(tmp_path, "--name", "p", *EXTRA)[3:], "--resume")  # in this process, on the suite's Ray
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert ablate_cli(*_cmd(tmp_path, "--name", "clean", *EXTRA)[3:]).returncode == 0  # the uninterrupted run

    a, b = _export(run), _export(tmp_path / "clean")
    assert len(a) == 6 * 40 and set(a["loss_name"]) == {"align_uniform", "infonce", "aninfonce"}
    assert a.drop(columns=["trial_id"]).equals(b.drop(columns=["trial_id"])), "resumed = never stopped"
    members = a.groupby("pack")["trial_id"].nunique()  # a plugin's point trains alone, in a pack of its own
    plugin_packs = set(a[a["loss_name"] == "align_uniform"]["pack"])
    assert len(plugin_packs) == 2 and all(members[p] == 1 for p in plugin_packs)

    records = [json.loads(line) for line in (run / "ablate_provenance.jsonl").read_text().splitlines()]
    assert all(
        r["plugins"]
        == [{"kind": "loss", "name": "align_uniform", "distribution": "ablate-align-uniform", "version": "0.1.0"}]
        for r in records
    )

    code, text = run_logged([sys.executable, "-m", "ablate.cli", "report", str(run)], tmp_path / "report.log")
    assert code == 0 and (run / "report.html").stat().st_size > 10_000, text[-2000:]
    code, text = run_logged(
        [sys.executable, "-m", "ablate.cli", "compare", str(run), "--by", "loss"], tmp_path / "c.log"
    )
    assert code == 0 and "align_uniform" in text, text[-2000:]


def test_slurm_loads_the_plugin_before_it_writes_a_script(tmp_path, ablate_cli):
    """In this process (tests/conftest.py's ``ablate_cli``): `ablate slurm` writes a script and starts no Ray."""
    base = ["slurm", str(GRID), "--scale", "smoke", "--storage", str(tmp_path)]
    done = ablate_cli(*base, "--name", "ok")
    text = done.stdout + done.stderr
    assert done.returncode == 0 and "sbatch" in text, text[-2000:]
    assert not done.ray_started
    bad = GRID.read_text().replace("generator_seed: 0 ", "generator_seed: 0\n  loss_options: {bad_option: 1}\n ")
    bad = bad.replace("loss: [align_uniform, infonce, aninfonce]", "loss: [align_uniform]")
    (tmp_path / "bad.yaml").write_text(bad)
    base[1] = str(tmp_path / "bad.yaml")
    done = ablate_cli(*base, "--name", "bad")
    text = done.stdout + done.stderr
    lines = [line for line in text.splitlines() if line.strip()]
    assert done.returncode != 0 and len(lines) == 1, text
    assert not done.ray_started
    assert "loss 'align_uniform' (ablate-align-uniform 0.1.0)" in text and "bad_option" in text, text
    assert not list(tmp_path.glob("bad*.sbatch")) and not (tmp_path / "bad").exists()
