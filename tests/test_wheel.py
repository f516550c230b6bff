"""The wheel works without the checkout: grids, report specs and presets ship inside it as package data.

Builds the wheel from a copy of the sources, installs it (not editable) into a fresh virtualenv that reuses this
environment's already-installed dependencies (a ``.pth`` line pointing at their site-packages: nothing is
downloaded), then, from an empty folder, runs ``ablate list``, ``ablate run batch_vs_dim --scale smoke`` and
``ablate report`` on its run directory with that venv's ``ablate`` command.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import run_logged

REPO = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], cwd: Path | None = None, env: dict | None = None) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """A fresh venv with ablate installed from its wheel; returns its paths and a clean environment."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"  # build from a copy, so the checkout gets no build/ or egg-info folders
    src.mkdir()
    shutil.copytree(REPO / "ablate", src / "ablate", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    dist = root / "dist"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(dist),
            str(src),
        ]
    )
    wheel = next(dist.glob("ablate-*.whl"))
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py = venv / "bin" / "python"
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip())
    (site / "ablate_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # reuse installed deps
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q", str(wheel)])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    work = root / "empty"
    work.mkdir()
    return {
        "wheel": wheel,
        "venv": venv,
        "python": py,
        "ablate": venv / "bin" / "ablate",
        "env": env,
        "cwd": work,
        "site": site,
    }


def test_the_wheel_holds_the_grids_dashboards_and_presets(installed):
    import zipfile

    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    for kind in ("search_spaces", "dashboards", "presets"):
        shipped = {p.name for p in (REPO / "ablate" / kind).glob("*.yaml")}
        assert shipped and {f"ablate/{kind}/{n}" for n in shipped} <= names, kind


def test_installed_ablate_is_the_wheel_not_the_checkout(installed):
    out = _run(
        [
            str(installed["python"]),
            "-c",
            "import ablate, ablate.shipped as s; print(ablate.__file__); print(s.shipped_dir('search_spaces'))",
        ],
        cwd=installed["cwd"],
        env=installed["env"],
    )
    module, grids = out.split()
    assert Path(module).is_relative_to(installed["site"]) and not Path(module).is_relative_to(REPO), out
    assert Path(grids).is_relative_to(installed["site"]), out


@pytest.mark.ray
def test_list_run_and_report_from_an_empty_folder(installed):
    from ablate.service.specs.grids import known_grids

    cwd, env, ablate = installed["cwd"], installed["env"], str(installed["ablate"])
    listing = _run([ablate, "list"], cwd=cwd, env=env)
    for name in known_grids():
        assert name in listing, f"`ablate list` misses {name}:\n{listing}"
    code, out = run_logged(
        [ablate, "run", "batch_vs_dim", "--scale", "smoke", "--verbose", "0"], cwd / "run.log", env=env, cwd=cwd
    )
    assert code == 0, out[-3000:]
    run_dir = cwd / "runs" / "batch_vs_dim-smoke"
    assert len(list(run_dir.glob("trial_*/result.json"))) == 4, out[-3000:]
    report = _run([ablate, "report", str(run_dir)], cwd=cwd, env=env)
    page = (run_dir / "report.html").read_text()
    assert "report.html" in report and "Paper figure:" in page and "batch_vs_dim" in page
