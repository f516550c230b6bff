"""Provenance: a run says what produced it (ablate's commit, the stack, the machine, the command), at start and at
every resume, in `ablate status` and the report; a resume on other science-relevant versions warns first."""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import run_logged, smoke_cmd

import ablate
from ablate.service.records.provenance import collect, distributions, record_provenance, science_changes, summary_line
from ablate.service.records.reader import RunReader
from ablate.service.records.rundir import ENVIRONMENT_FILE, PROVENANCE_FILE

ROOT = Path(ablate.__file__).resolve().parent.parent


def test_collect_names_the_code_the_stack_and_the_machine():
    record = collect(["ablate", "run", "x"], event="start")
    assert record["ablate"] == ablate.__version__ and record["command"] == ["ablate", "run", "x"]
    assert record["torch"] == torch.__version__.split("+")[0] or record["torch"] == torch.__version__
    assert record["python"] == platform.python_version() and record["cpu_count"] >= 1
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:  # a checkout (CI clones one): its commit, and whether the tree differs from it
        assert record["git_commit"] == head.stdout.strip() and isinstance(record["git_dirty"], bool)
    assert "ablate " in summary_line(record) and f"python {platform.python_version()}" in summary_line(record)


def test_distributions_are_a_pip_freeze():
    lines = distributions().splitlines()
    names = [line.split("==")[0].lower() for line in lines]
    assert "torch" in names and names == sorted(names) and all("==" in line for line in lines)


def test_science_changes_name_old_and_new():
    before, now = {"torch": "2.13.0", "ray": "2.60.0"}, {"torch": "2.14.1", "ray": "2.61.0"}
    assert science_changes(before, now) == ["torch: 2.13.0 -> 2.14.1"]  # ray does not change a trial's numbers
    assert science_changes(now, now) == []


def test_a_resume_on_another_torch_warns_naming_old_and_new(tmp_path, caplog):
    record_provenance(str(tmp_path), "start")
    first = RunReader(tmp_path).provenance()
    assert [r["event"] for r in first] == ["start"] and (tmp_path / ENVIRONMENT_FILE).read_text().strip()
    lines = (tmp_path / PROVENANCE_FILE).read_text().splitlines()
    (tmp_path / PROVENANCE_FILE).write_text(json.dumps({**json.loads(lines[0]), "torch": "1.0.0"}) + "\n")
    with caplog.at_level(logging.WARNING, logger="ablate.service.records.provenance"):
        changes = record_provenance(str(tmp_path), "resume")
    assert changes == [f"torch: 1.0.0 -> {first[0]['torch']}"]
    assert "torch: 1.0.0 -> " in caplog.text
    assert [r["event"] for r in RunReader(tmp_path).provenance()] == ["start", "resume"]


@pytest.mark.ray
def test_a_run_records_its_provenance_and_status_and_report_show_it(tmp_path):
    code, text = run_logged(smoke_cmd(tmp_path, "--name", "p"), tmp_path / "run.log")
    assert code == 0, text[-3000:]
    run_dir = tmp_path / "p"
    (record,) = RunReader(run_dir).provenance()
    assert record["event"] == "start" and record["command"][1:3] == ["run", "batch_vs_dim"]
    code, status = run_logged([*smoke_cmd(tmp_path)[:3], "status", str(run_dir)], tmp_path / "status.log")
    assert code == 0 and f"made by: {summary_line(record)}" in status
    assert summary_line(record) in (run_dir / "report.html").read_text()


def test_gpus_are_read_in_one_place_for_provenance_and_the_memory_check(tmp_path, monkeypatch):
    """A stand-in nvidia-smi (a real executable on PATH) answers as on an H200: provenance records the card, and the
    memory check sees its memory, both from ablate.service.records.provenance.query_gpus."""
    from ablate.service.execution.memory import local_machine
    from ablate.service.records.provenance import _gpus, query_gpus

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200, 143771, 580.159.04'\necho 'NVIDIA H200, 143771, 580.159.04'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert query_gpus() == [{"name": "NVIDIA H200", "memory_mib": 143771, "driver": "580.159.04"}] * 2
    assert _gpus()[0]["memory"] == "143771 MiB" and _gpus()[0]["name"] == "NVIDIA H200"
    assert local_machine().gpus == (143771 << 20, 143771 << 20)
    smi.write_text("#!/bin/sh\nexit 9\n")
    assert query_gpus() == [] and local_machine().gpus == ()
