"""Shared fixtures: one real local Ray session for the whole suite, helpers that run `ablate` in subprocesses, the
``ablate_cli`` fixture that runs it in this process, and the ``ray`` marker's check.

Which to use: a command refused before any compute (bad grid file, --set, --name, option, marker…) runs in-process
through :func:`ablate_cli`: a subprocess would pay Python, torch and Ray's imports for one line of stderr. A
subprocess is for what needs a process of its own: signals, kill -9, process groups, a real run's exit code, a
closed pipe, the installed console script, environment variables read at import.

Markers (pyproject.toml): ``ray`` — the test starts Ray, in this process or in a subprocess (set here on every test
that uses :func:`ray_session`, and by hand on tests whose subprocesses start it); ``browser`` — it opens a headless
browser. ``make test-fast`` runs ``-m "not ray and not browser"``; in such a run :func:`pytest_configure` makes
``ray.init`` raise and :func:`_no_ray_unless_marked` fails any test after which a Ray session exists, so a test that
starts Ray without its marker fails loudly instead of slowing the fast run down.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks import ray_nodes
from benchmarks.ray_nodes import RayNode, free_port, wait_for_port  # noqa: F401 - the tests' helpers

# ablate's signing key (ablate.signing): one per test session, never the user's ~/.config/ablate/signing.key;
# subprocesses (the CLI, Ray's workers) inherit it. A test that needs its own key sets ABLATE_KEY_FILE itself.
os.environ.setdefault("ABLATE_KEY_FILE", str(Path(tempfile.mkdtemp(prefix="ablate-key-")) / "signing.key"))


#: Where Ray would put its sessions (``$RAY_TMPDIR/ray/session_*``) in a run that deselects ``ray`` tests; None otherwise.
_NO_RAY_TMPDIR: Path | None = None


def _ray_deselected(config) -> bool:
    """Whether ``-m`` deselects a test marked only ``ray`` (e.g. ``-m "not ray and not browser"``)."""
    expression = config.getoption("markexpr", "")
    if not expression:
        return False
    try:
        from _pytest.mark.expression import Expression
    except ImportError:  # pytest moved its parser: the plain reading
        return "not ray" in expression
    return not Expression.compile(expression).evaluate(lambda name, **kwargs: name == "ray")


def pytest_configure(config):
    """In a run without ``ray`` tests: ``ray.init`` raises, and Ray (here or in a subprocess, which inherits
    ``RAY_TMPDIR``) would put its session in a folder of this run, which :func:`_no_ray_unless_marked` watches."""
    global _NO_RAY_TMPDIR
    if not _ray_deselected(config):
        return
    _NO_RAY_TMPDIR = Path(tempfile.mkdtemp(prefix="ablate-no-ray-"))
    os.environ["RAY_TMPDIR"] = str(_NO_RAY_TMPDIR)
    import ray

    def refuse(*args, **kwargs):
        raise RuntimeError(
            "ray.init in a run that deselects `ray` tests: a test that starts Ray must use the ray_session fixture "
            "or be marked @pytest.mark.ray"
        )

    ray.init = refuse


def pytest_unconfigure(config):
    if _NO_RAY_TMPDIR is not None:
        shutil.rmtree(_NO_RAY_TMPDIR, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark ``ray`` every test that uses :func:`ray_session` (directly or through another fixture), before ``-m``
    selects."""
    for item in items:
        if "ray_session" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)


@pytest.fixture(autouse=True)
def _no_ray_unless_marked():
    """In a run without ``ray`` tests: fail the test after which Ray started a session (in a subprocess too)."""
    yield
    if _NO_RAY_TMPDIR is not None:
        started = sorted(p.name for p in (_NO_RAY_TMPDIR / "ray").glob("session_*"))
        if started:
            shutil.rmtree(_NO_RAY_TMPDIR / "ray", ignore_errors=True)
            pytest.fail(f"this test started Ray ({', '.join(started)}) but is not marked `ray`", pytrace=False)


@pytest.fixture(scope="session")
def ray_session():
    """A real local Ray (2 CPUs, no dashboard) shared by every test that runs grids."""
    import ray

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield ray
    ray.shutdown()


def ray_running() -> bool:
    """Whether Ray is initialised in this process (without importing Ray where nothing has)."""
    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized())


@dataclass
class CliRun:
    """What one in-process `ablate ARGV` did; named as :class:`subprocess.CompletedProcess` names it."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    #: Ray was not initialised in this process before the command and is after it. (Where a test's
    #: ``ray_session`` has Ray up already, the `run:` line and the storage folder tell whether a run started.)
    ray_started: bool

    def refusal(self, code: int = 2) -> str:
        """The one ``ablate: error: …`` line of a command refused before any compute: exit ``code``, no traceback,
        nothing else on stderr, no `run:` line (the run never started) and no Ray started."""
        assert self.returncode == code, (self.argv, self.returncode, self.stdout[-2000:], self.stderr[-3000:])
        assert "Traceback" not in self.stderr, self.stderr[-3000:]
        lines = [x for x in self.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and lines[0].startswith("ablate: error: "), self.stderr[-3000:]
        assert "run: " not in self.stdout, "a run started"
        assert not self.ray_started, f"`ablate {' '.join(self.argv)}` started Ray before refusing"
        return lines[0]


#: Signals whose handlers `ablate run` replaces while it runs and must give back.
_HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@pytest.fixture()
def ablate_cli(capsys, monkeypatch):
    """``ablate_cli(*argv, cwd=None)``: run ``ablate ARGV`` in this process through :func:`ablate.cli.main`, its
    output captured by ``capsys`` (earlier output is dropped first), an argparse ``SystemExit`` taken as its exit
    code; returns a :class:`CliRun`.

    What the command may change in this process is put back after each call: the working directory (``cwd``),
    the environment, the root logger's handlers and level, torch's thread count. Signal handlers are checked
    instead: `ablate` must restore them itself, and a leak fails the test.
    """
    import logging

    def run(*argv: str, cwd: Path | str | None = None) -> CliRun:
        from ablate import cli

        if cwd is not None:
            monkeypatch.chdir(cwd)
        environ = dict(os.environ)
        root = logging.getLogger()
        handlers, level = list(root.handlers), root.level
        torch = sys.modules.get("torch")
        threads = torch.get_num_threads() if torch is not None else None
        signals = {s: signal.getsignal(s) for s in _HANDLED_SIGNALS}
        ray_before = ray_running()
        capsys.readouterr()
        try:
            code = cli.main(list(argv))
        except SystemExit as exc:  # argparse: a usage error (2), --help (0)
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            out, err = capsys.readouterr()
            os.environ.clear()
            os.environ.update(environ)
            root.handlers[:], root.level = handlers, level
            if threads is not None:
                torch.set_num_threads(threads)
            leaked = {s.name: h for s, h in ((s, signal.getsignal(s)) for s in _HANDLED_SIGNALS) if h != signals[s]}
            for name in leaked:
                signal.signal(signal.Signals[name], signals[signal.Signals[name]])
        assert not leaked, f"`ablate {' '.join(argv)}` left signal handlers behind: {leaked}"
        return CliRun(list(argv), code, out, err, ray_started=ray_running() and not ray_before)

    return run


def smoke_cmd(storage, *extra: str) -> list[str]:
    """The command line of a real `ablate run batch_vs_dim --scale smoke` in a subprocess, storing in ``storage``."""
    return [
        sys.executable,
        "-m",
        "ablate.cli",
        "run",
        "batch_vs_dim",
        "--scale",
        "smoke",
        "--storage",
        str(storage),
        *extra,
    ]


#: Columns that differ between two runs of the same numbers: ids, timing, host, and where the batch was drawn.
RUN_SPECIFIC = {"trial_id", "pack", "time_total_s", "prefetch"}


def rows_by_point(df):
    """A run's rows (:func:`ablate.analysis.results.load_results`) without :data:`RUN_SPECIFIC` columns, sorted by
    grid point, seed and report: two runs of the same numbers give equal frames, packed or not."""
    keys = [c for c in (*df.attrs["axes"], "seed", "training_iteration") if c in df.columns]
    cols = sorted(c for c in df.columns if c not in RUN_SPECIFIC)
    return df[cols].sort_values(keys, kind="stable").reset_index(drop=True)


def run_logged(cmd: list[str], log_path, timeout: float = 300, env: dict | None = None, cwd=None) -> tuple[int, str]:
    """Run ``cmd`` with its output in a file (not a pipe: Ray's daemons may hold a pipe open after the
    driver exits) in its own process group, killed whole on time-out. Returns (exit code, output)."""
    import signal
    import subprocess

    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = -9
    with open(log_path) as log:
        return code, log.read()


def sigterm_after(argv: list[str], run_dir: Path, rows: int, log: Path) -> None:
    """Start ``argv``, SIGTERM it once ``rows`` reports landed, wait for its 143."""
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            landed = sum(len(p.read_text().splitlines()) for p in run_dir.glob("trial_*/result.json"))
            if landed >= rows:
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 143, log.read_text()[-3000:]


def optuna_journal(run_dir):
    """A local run's study as Optuna itself opens it (``JournalFileBackend`` on ``RUN_DIR/optuna.journal``), the
    storage docs/reports.md tells a user to load: what ablate writes must be Optuna's own format."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(Path(run_dir) / "optuna.journal")))


def start_ray_node(*args: str, env: dict | None = None, timeout: float = 90, wait: bool = True) -> RayNode:
    """:func:`benchmarks.ray_nodes.start_ray_node`, refused where `ray` tests are deselected (the node's own
    --temp-dir would escape the session check). A node that does not start raises RuntimeError with its output."""
    if _NO_RAY_TMPDIR is not None:
        pytest.fail("start_ray_node in a run that deselects `ray` tests: mark the test `ray`", pytrace=False)
    return ray_nodes.start_ray_node(*args, env=env, timeout=timeout, wait=wait)


#: grid name → run directory, shared by tests/reports/test_report.py and tests/reports/test_browser.py within one pytest process.
_RUNS: dict[str, Path] = {}


def smoke_run(name: str, root: Path) -> Path:
    """Run a grid at smoke scale once per test session through `ablate run … --report` (in-process, with Ray's
    live progress table, whose end-of-run "best trial" line once crashed search grids)."""
    if name not in _RUNS:
        from ablate import cli

        code = cli.main(["run", name, "--scale", "smoke", "--storage", str(root), "--report"])
        run_dir = root / f"{name}-smoke"
        assert code == 0, f"smoke run of {name} failed (exit {code})"
        _RUNS[name] = run_dir
    return _RUNS[name]


def runs_root(tmp_path_factory) -> Path:
    """One folder for every smoke run of the session."""
    root = tmp_path_factory.getbasetemp() / "report-smoke-runs"
    root.mkdir(exist_ok=True)
    return root
