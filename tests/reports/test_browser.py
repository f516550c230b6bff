"""Every grid's smoke report in headless Chromium: no JavaScript errors, every panel drew, a screenshot.

The report writes ``<div id="ablate-render-status" data-plots data-rendered data-errors>`` once its plots
drew (errors are caught from the first script on); Chromium's ``--dump-dom`` shows the page after its
scripts ran. Skipped only where Chromium is missing outside CI; in CI (``CI`` set) a missing Chromium fails.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import runs_root, smoke_run

from ablate.reports.report import load_dashboard, load_run, study_views, write_report
from ablate.service.specs.grids import known_grids

pytestmark = pytest.mark.browser  # and ray: the reports are of smoke runs (ray_session)

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--virtual-time-budget=10000",
]


@pytest.fixture(scope="module")
def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None and Path("/usr/bin/chromium").exists():
        path = "/usr/bin/chromium"
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is required in CI (.ci/run installs Debian's chromium package)")
        pytest.skip("chromium not installed (apt-get install chromium)")
    return path


def _chromium(binary: str, tmp: Path, *args: str, timeout: float = 90) -> str:
    """Run headless Chromium in its own process group (killed whole on timeout); return stdout."""
    cmd = [binary, *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'chromium-profile'}", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"chromium did not finish within {timeout} s")
    assert proc.returncode == 0, err[-2000:]
    return out


def render_status(binary: str, page: Path, tmp: Path, png: Path | None = None) -> dict:
    """The page's render-status marker after its scripts ran, the plot divs in the DOM, and a screenshot."""
    shot = [f"--screenshot={png}", "--window-size=1400,3000"] if png else []
    dom = _chromium(binary, tmp, *shot, "--dump-dom", page.resolve().as_uri())
    m = re.search(r'<div id="ablate-render-status"([^>]*)>', dom)
    assert m, "the report's render check never ran (scripts failed before the end of the page?)"
    attrs = {k: html.unescape(v) for k, v in re.findall(r'data-([a-z]+)="([^"]*)"', m.group(1))}
    if png is not None:
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", "no screenshot written"
    return {
        "expected": int(attrs["expected"]),
        "plots": int(attrs["plots"]),
        "rendered": int(attrs["rendered"]),
        "errors": json.loads(attrs["errors"]),
        "dom_plots": len(re.findall(r'class="[^"]*js-plotly-plot', dom)),
        "dom_svgs": dom.count('class="main-svg"'),
    }


@pytest.mark.parametrize("name", sorted(known_grids()))
def test_report_renders_in_chromium(name, chromium, ray_session, tmp_path_factory, tmp_path):
    run_dir = smoke_run(name, runs_root(tmp_path_factory))
    page = Path(write_report(run_dir, tmp_path / "report.html"))
    n_panels = len(load_dashboard(name).panels)  # plus Optuna's drawable views of an Optuna grid's study
    n_panels += sum(v.figure is not None for v in study_views(load_run(run_dir)))
    png = tmp_path / f"report_{name}.png"
    status = render_status(chromium, page, tmp_path, png)
    assert status["errors"] == [], f"JavaScript errors: {status['errors']}"
    assert status["expected"] == n_panels
    assert status["plots"] == status["rendered"] == n_panels, status
    assert status["dom_plots"] == n_panels and status["dom_svgs"] >= n_panels, status
    assert png.stat().st_size > 20_000, "a blank page would compress to almost nothing"


def test_the_render_check_sees_javascript_errors(chromium, ray_session, tmp_path_factory, tmp_path):
    """Negative control: a page that throws, and one whose plotly.js is missing, fail the check."""
    run_dir = smoke_run("batch_vs_dim", runs_root(tmp_path_factory))
    text = Path(write_report(run_dir, tmp_path / "good.html")).read_text()
    broken = tmp_path / "throws.html"
    broken.write_text(text.replace("</body>", "<script>throw new Error('ablate-test-boom');</script></body>"))
    status = render_status(chromium, broken, tmp_path)
    assert any("ablate-test-boom" in e for e in status["errors"]), status
    start = text.index("/**\n* plotly.js v")  # the inline bundle's banner
    stripped = tmp_path / "no-plotly.html"
    stripped.write_text(text[:start] + "window.Plotly = undefined;" + text[text.index("</script>", start) :])
    status = render_status(chromium, stripped, tmp_path)
    assert status["errors"] and status["rendered"] == 0, status


def test_a_report_with_trials_that_did_not_finish_renders_in_chromium(chromium, tmp_path):
    """The ✕ marks of errored and interrupted trials and the notes under the tables draw without a JavaScript
    error (a run folder built by hand: tests/unfinished_runs.py; no Ray)."""
    from unfinished_runs import unfinished_run

    run_dir = unfinished_run(tmp_path / "run")
    page = Path(write_report(run_dir, tmp_path / "report.html"))
    n_panels = len(load_dashboard("ensemble").panels)
    status = render_status(chromium, page, tmp_path, tmp_path / "report_unfinished.png")
    assert status["errors"] == [], f"JavaScript errors: {status['errors']}"
    assert status["plots"] == status["rendered"] == status["expected"] == n_panels, status
