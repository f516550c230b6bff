"""`ablate run GRID [GRID ...]`: the command-line side of :func:`ablate.service.execution.runner.run_grid`.

Several grids run one after another in one process, on one Ray: the embedded Ray starts once (its start and
shutdown are most of a laptop grid's fixed cost), and every grid gets its own run directory, summary, report
and claims hint. Every grid is resolved with its preset, ``--set`` and ``--variants``
(:func:`ablate.service.specs.resolve.resolve_grid`) and checked (:func:`ablate.service.execution.preflight.check_run`:
pack, plugins, sampler, memory) once, before the first trial starts; :func:`run_grid` runs what was checked.
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from ablate.analysis.text import text_table as _table
from ablate.config import ConfigError
from ablate.service.execution.options import build_options, options_from_args, resume_words

__all__ = ["cmd_run", "resume_command"]

#: Rows of the end-of-run summary table; a larger grid's full table is `ablate status RUN`.
SUMMARY_ROWS = 60
#: A grid of more trials starts only with --yes (a typo in an axis can make thousands).
ASK_ABOVE_TRIALS = 2000
#: Wall seconds of Ray Tune's bookkeeping per Ray trial on one slot (start, reports, end): 0.101 s, the
#: ``overhead_s_per_trial`` of `python -m benchmarks --only bookkeeping --trials 1000` (10.5 trials/s) on the
#: 2-core development machine, 2026-11-27 (docs/performance.md#many-trials).
TRIAL_OVERHEAD_S = 0.1
#: Trials an interrupted run's message names, per kind (stopped, never started); the rest are counted.
LISTED_TRIALS = 20


def _grid_names(args: argparse.Namespace) -> list[str]:
    return [args.grid] if isinstance(args.grid, str) else list(args.grid)


def _grid_argument(grid: str) -> str:
    """A grid as a resume command names it: a grid file by its absolute path (the command works from any folder),
    a shipped or plugin grid by its name."""
    path = Path(grid).expanduser()
    if path.suffix in (".yaml", ".yml") or "/" in grid or path.is_file():
        return str(path.resolve())
    return grid


def resume_command(args: argparse.Namespace, run_dir: str | None = None, grids: list[str] | None = None) -> str:
    """The `ablate run … --resume` command that continues the run ``args`` started: its options as
    :func:`ablate.service.execution.options.resume_words` spells them, storage and name spelled out, so it works
    from any folder.

    ``grids`` (default: every grid of ``args``) are the grids still to run; with several, each keeps its
    default name, and ``--resume`` continues those that started and starts the others.
    """
    from ablate.service.records.rundir import split_run_dir
    from ablate.service.records.store import normal_location

    names = [_grid_argument(g) for g in (grids if grids is not None else _grid_names(args))]
    storage, name = normal_location(args.storage), args.name
    if run_dir is not None and len(names) == 1:
        storage, name = split_run_dir(str(run_dir))
    options = options_from_args(args, storage=storage, name=name if len(names) == 1 else None)
    return shlex.join(["ablate", "run", *names, *resume_words(options), "--resume"])


def size_line(grid, args: argparse.Namespace, pack: int) -> str:
    """``<grid>: N trials …`` with a floor on its wall time (Ray's bookkeeping alone, :data:`TRIAL_OVERHEAD_S` a
    Ray trial, on the slots this machine gives); above :data:`ASK_ABOVE_TRIALS` trials, a :class:`ConfigError`
    unless ``--yes``: a grid that large is usually a typo in an axis, and its Ray bookkeeping alone takes long."""
    import os

    n = grid.n_trials
    ray_trials = -(-n // max(pack, 1))
    slots = max(1, int((os.cpu_count() or 1) // max(args.cpus_per_trial, 1e-9)))
    if args.max_concurrent:
        slots = min(slots, args.max_concurrent)
    floor = ray_trials * TRIAL_OVERHEAD_S / (slots if not args.address else max(slots, 1))
    line = f"{grid.name}: {n} trials at scale {grid.scale}; at least {_duration(floor)} of Ray's bookkeeping alone"
    line += " on this machine" if not args.address else " (this machine's rate; a cluster has more slots)"
    if n > ASK_ABOVE_TRIALS and not getattr(args, "yes", False):
        raise ConfigError(f"{line}: more than {ASK_ABOVE_TRIALS} trials; add --yes to start them")
    return line


def sampler_note(grid, gpus_per_trial: float | None) -> str | None:
    """A note when trials ask for a GPU but draw positives with ``sampler: adaptive`` (the default, the papers'
    rejection rounds, which read the host several times a batch and idle the card); None otherwise."""
    if not gpus_per_trial:
        return None
    n = sum(
        t.config.sampler == "adaptive" and t.config.conditional == "normal" and t.config.threshold is not None
        for t in grid.trials
    )  # a normal conditional without a threshold, or a vMF one, draws without rejection
    if not n:
        return None
    how = (
        "add --set sampler=fixed"
        if n == grid.n_trials  # --set reaches every trial; a vMF conditional refuses the fixed sampler
        else "give their variants sampler: fixed (--set would reach the grid's other trials too)"
    )
    return (
        f"{grid.name}: note: {n} of {grid.n_trials} trials ask for a GPU and draw positives with sampler: adaptive, "
        f"whose rejection rounds read the host several times a batch; on a card {how} "
        "(the same law, no host reads: docs/reproduction.md#the-fixed-shape-sampler)"
    )


def _print_plan(grid: str, plan) -> None:
    """``<grid>: N points: a reused, b continued, c started``, and which points train solo under ``--pack``."""
    print(f"{grid}: {plan.summary()}", flush=True)
    solo = plan.solo_line()
    if solo:
        print(f"{grid}: {solo}", flush=True)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def cmd_run(args: argparse.Namespace) -> int:
    """Run every grid named on the command line, in order; stop at the first that is interrupted."""
    from ablate.service.execution.preflight import check_run
    from ablate.service.execution.runner import default_run_name, has_run_state
    from ablate.service.execution.teardown import run_signals
    from ablate.service.specs.resolve import resolve_grid

    names = _grid_names(args)
    if len(names) > 1 and args.name:
        raise ConfigError(f"--name {args.name!r} names one run; with {len(names)} grids each run is <grid>-<scale>")
    options = options_from_args(args)
    grids = [resolve_grid(name, options, note=print, named=len(names) > 1) for name in names]
    seen = [g.name for g in grids]
    twice = sorted({n for n in seen if seen.count(n) > 1})
    if twice:
        raise ConfigError(f"grid {', '.join(twice)} is named twice; each grid runs once per `ablate run`")
    runs = []
    for grid in grids:  # every grid's checks (pack, plugins, sampler, memory), once, before the first starts
        runs.append(check_run(grid, options))
        print(size_line(grid, args, runs[-1].pack), flush=True)
        note = sampler_note(grid, options.gpus_per_trial)
        if note:
            print(note, flush=True)
    codes = []
    with run_signals() as signals:  # SIGTERM as Ctrl-C; a run a signal stopped leaves no Ray process behind
        for i, (name, run) in enumerate(zip(names, runs)):
            one = copy.copy(args)
            one.grid = name
            if len(runs) > 1:
                # several grids: --resume continues each grid that has a run and starts the others
                one.resume = args.resume and has_run_state(args.storage, default_run_name(run.grid))
                run = replace(run, options=build_options(run.options, resume=one.resume))
                print(f"\n=== grid {i + 1} of {len(runs)}: {run.grid.name} ===", flush=True)
            code = _run_one(one, run)
            codes.append(code)
            if code in (130, 143):  # Ctrl-C, SIGTERM
                signals.stopped = True
                if i + 1 < len(runs):
                    rest = resume_command(args, grids=names[i:])
                    print(f"{len(runs) - i - 1} grid(s) not started; run them all with:\n  {rest}", file=sys.stderr)
                return code
    if len(grids) > 1:
        print("\n" + ", ".join(f"{g.name}: {'ok' if c == 0 else f'exit {c}'}" for g, c in zip(grids, codes)))
    return max(codes)


def _run_one(args: argparse.Namespace, run) -> int:
    """Run one checked grid (:class:`ablate.service.execution.preflight.CheckedRun`) and say how it ended."""
    from ablate.service.execution.cluster import auth_hint
    from ablate.service.execution.runner import run_grid
    from ablate.service.records.outcome import StorageFull, retry_line, summary_rows
    from ablate.service.specs.grids import natural_key

    grid = run.grid

    def announce(run_dir: str, url: str | None) -> None:
        print(f"run: {run_dir}")
        print(f"grid: {grid.name} at scale {grid.scale}: {grid.n_trials} trials")
        if not getattr(args, "dashboard", True) and not args.address:
            print("dashboard: off (--no-dashboard)", flush=True)
        else:
            print(f"dashboard: {url or 'not available'}  ({auth_hint()})", flush=True)

    try:
        outcome = run_grid(run, on_start=announce, on_plan=lambda plan: _print_plan(grid.name, plan))
    except StorageFull as exc:
        print(f"ablate: error: {exc}: {resume_command(args)}", file=sys.stderr)
        return 1
    rows = summary_rows(outcome)
    done = f"; {outcome.plan.summary()}" if outcome.plan is not None else ""
    print(f"\nsummary ({len(rows)} trials, {outcome.wall_s:.1f} s{done}):")
    print(_table(sorted(rows, key=lambda r: [natural_key(r[k]) for k in grid.axis_names()])[:SUMMARY_ROWS]))
    if len(rows) > SUMMARY_ROWS:
        print(f"… and {len(rows) - SUMMARY_ROWS} more trials: ablate status {outcome.run_dir}")
    if outcome.best_config:
        print(
            f"\nbest configuration ({outcome.best_config['metric']}={outcome.best_config['value']}): "
            f"{json.dumps(outcome.best_config['config'], default=str)}  (saved to {outcome.run_dir}/best_config.json)"
        )
    print(f"\nrun directory: {outcome.run_dir}")
    if args.report and not outcome.storage_full and not outcome.interrupted:
        _write_run_report(outcome.run_dir)
    elif args.report and outcome.interrupted:  # a stop asked for is quick: the report of a large grid is not
        print(f"report: not written (interrupted); write it with: ablate report {outcome.run_dir}")
    from ablate.analysis.claims.evaluate import CLAIMS

    if grid.name in CLAIMS:
        print(f"claims: ablate claims {outcome.run_dir}   (does the run reproduce the paper? docs/reproduction.md)")
    resume = resume_command(args, str(outcome.run_dir))
    if outcome.interrupted:
        print(_interrupted_text(outcome, resume), file=sys.stderr)
        return 128 + outcome.stop_signal  # 130 (Ctrl-C) or 143 (SIGTERM), as a shell reports a signal
    if outcome.storage_full:
        print(f"ablate: error: {outcome.storage_full}: {resume}", file=sys.stderr)
        return 1
    if outcome.failed:
        print(f"{len(outcome.failed)} trial(s) did not finish:", file=sys.stderr)
        for t in outcome.failed:
            print(f"  {t.trial_id} [{t.label}]: {t.error}", file=sys.stderr)
    retried = retry_line(outcome)
    if retried:  # the run's last line: what it retried, and why
        print(retried, file=sys.stderr if outcome.failed else sys.stdout, flush=True)
    return 1 if outcome.failed else 0


def _interrupted_text(outcome, resume: str) -> str:
    """What a Ctrl-C or SIGTERM stopped: the trials it interrupted and those that never started, by grid point."""
    import signal

    how = "SIGTERM" if outcome.stop_signal == signal.SIGTERM else "Ctrl-C"
    stopped, waiting = outcome.unfinished, outcome.not_started
    undrawn = max(outcome.grid.n_trials - len(outcome.trials), 0)  # an Optuna grid's samples not yet drawn
    lines = [
        f"interrupted: {len(stopped)} trial(s) stopped before they finished, {len(waiting) + undrawn} never "
        f"started ({how}); nothing finished was lost."
    ]
    for what, trials in (("stopped", stopped), ("never started", waiting)):
        labels = sorted(t.label for t in trials)
        if labels:
            more = f"; … and {len(labels) - LISTED_TRIALS} more" if len(labels) > LISTED_TRIALS else ""
            lines.append(f"  {what}: " + "; ".join(labels[:LISTED_TRIALS]) + more)
    if undrawn:
        lines.append(f"  never started: {undrawn} sample(s) the search has not drawn yet")
    return "\n".join([*lines, f"Continue with:\n  {resume}"])


def _write_run_report(run_dir) -> None:
    """RUN_DIR/report.html at the end of a run; a report that cannot be written never fails the run."""
    from ablate.reports.report import write_report

    try:
        print(f"report: {write_report(str(run_dir))}")
    except Exception as exc:  # noqa: BLE001 - the run's results are safe on disk; say why and how to retry
        print(f"report: not written ({type(exc).__name__}: {exc}); retry: ablate report {run_dir}", file=sys.stderr)
