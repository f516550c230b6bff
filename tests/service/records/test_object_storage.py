"""A run read from object storage (issue "The run record on object storage", item 3): `ablate status`, `export`,
`report`, `compare` and `claims` read a run directory at an ``s3://`` URI as they read it on disk.

The store is a real S3 server (moto's standalone server, as Ray's own storage tests use) that the test starts on
127.0.0.1 (tests/s3_server.py), reached through pyarrow's S3 client with the endpoint in the URI, as a researcher
would name MinIO or a cloud bucket. Writing a run there (`ablate run --storage s3://…`) is not built yet and is
refused in one line.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from s3_server import s3_server
from unfinished_runs import finished_smoke_run

from ablate import cli
from ablate.analysis.results import load_results


@pytest.fixture(scope="module")
def s3_store(tmp_path_factory):
    """An S3 server on 127.0.0.1 with an empty bucket ``runs`` (:func:`s3_server.s3_server`); yields the URI query
    that reaches it."""
    with s3_server(tmp_path_factory.mktemp("moto")) as query:
        yield query


def _finished_run(run_dir: Path) -> Path:
    """batch_vs_dim at smoke scale, finished, written by hand, with R² that differ by d so compare has something
    to tell."""

    def rows(i, point):
        r2 = 0.9 - 0.1 * (point.params["latent_dim"] > 3) + 0.01 * i
        return [
            {"step": s, "training_iteration": n + 1, "r2": r2 * s / 10, "loss": 2.0 - s / 10, "time_total_s": s / 5}
            for n, s in enumerate((5, 10))
        ]

    finished_smoke_run(run_dir, rows)
    return run_dir


def _upload(local: Path, uri: str) -> None:
    import pyarrow.fs as pafs

    pafs.copy_files(str(local), uri)


def test_a_run_on_s3_reads_as_it_does_on_disk(s3_store, tmp_path, capsys, monkeypatch):
    local = _finished_run(tmp_path / "local" / "bvd")
    uri = f"s3://runs/lab/bvd?{s3_store}"
    _upload(local, uri)

    remote_df, local_df = load_results(uri), load_results(local)
    pd.testing.assert_frame_equal(remote_df, local_df, check_exact=True)  # the export, row for row

    assert cli.main(["status", uri]) == 0
    status = capsys.readouterr().out
    assert "finished: 4  running: 0  interrupted: 0" in status, status

    assert cli.main(["export", uri, "--out", str(tmp_path / "remote.csv")]) == 0
    assert cli.main(["export", str(local), "--out", str(tmp_path / "local.csv")]) == 0
    assert (tmp_path / "remote.csv").read_text() == (tmp_path / "local.csv").read_text()
    capsys.readouterr()

    monkeypatch.chdir(tmp_path)  # `ablate report s3://…/RUN` writes the page here, not back into the store
    assert cli.main(["report", uri]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "report: bvd-report.html"
    page = (tmp_path / "bvd-report.html").read_text()
    assert "run finished: 4 of 4 trials known (4 terminated)" in page and "<h2>Trials</h2>" in page

    assert cli.main(["compare", uri, "--by", "latent_dim"]) == 0
    remote_compare = capsys.readouterr().out
    assert cli.main(["compare", str(local), "--by", "latent_dim"]) == 0
    assert remote_compare == capsys.readouterr().out.replace(str(local), uri)

    assert cli.main(["claims", uri]) == 0
    remote_claims = capsys.readouterr().out
    assert cli.main(["claims", str(local)]) == 0
    assert remote_claims == capsys.readouterr().out.replace(str(local), uri)


def test_a_uri_that_holds_no_run_and_writing_a_run_there_are_refused_in_one_line(s3_store, tmp_path, capsys):
    assert cli.main(["status", f"s3://runs/lab/none?{s3_store}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not an ablate run directory" in err[0], err
    argv = ["run", "batch_vs_dim", "--scale", "smoke", "--storage", f"s3://runs/lab?{s3_store}"]
    done = subprocess.run([sys.executable, "-m", "ablate.cli", *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("ablate: error:")]
    assert "ablate keeps its run record" in line and "use a local folder" in line
