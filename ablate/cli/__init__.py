"""`ablate` command line: a thin layer that parses arguments and calls the Python API."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from ablate.analysis.text import generator_line, lambda_hat_line
from ablate.analysis.text import text_table as _table
from ablate.cli.compare import add_compare_parser
from ablate.cli.run import cmd_run, resume_command
from ablate.cli.slurm import add_slurm_parser
from ablate.columns import r2_block_lambda
from ablate.config import ConfigError
from ablate.service.execution.options import add_run_options
from ablate.service.specs.grid import DEFAULT_SCALE, SCALES

__all__ = ["main"]


def cmd_train(args: argparse.Namespace) -> int:
    from ablate.core.experiment import Experiment
    from ablate.service.specs.resolve import resolve_config

    config = resolve_config(args.preset, args.set)
    steps = args.steps or config.max_steps
    exp = Experiment(config)
    print(
        f"# ablate train: d={config.latent_dim} batch={config.batch_size} loss={config.loss} "
        f"Λ={config.concentration} steps={steps} device={exp.device}",
        flush=True,
    )
    print(f"# {generator_line(exp.generator_stats)}", flush=True)
    started = time.time()
    while exp.step < steps:
        n = min(config.report_every, steps - exp.step)
        m = exp.train(n)
        m.update(exp.evaluate())
        blocks = " ".join(f"{k}={v:.3f}" for k, v in m.items() if r2_block_lambda(k) is not None)
        print(
            f"step={m['step']} loss={m['loss']:.4f} r2={m['r2']:.4f} {blocks} mcc={m['mcc']:.3f} "
            f"elapsed={time.time() - started:.1f}s",
            flush=True,
        )
        lam_hat = exp.lambda_hat()
        if lam_hat is not None and config.loss in ("aninfonce", "ensemble_aninfonce"):
            print(
                f"    {lambda_hat_line(lam_hat.reshape(-1, config.latent_dim)[0].tolist(), config.lambda_true)}",
                flush=True,
            )
    return 0


# ------------------------------------------------------------ list / show
def cmd_list(args: argparse.Namespace) -> int:
    from ablate.service.specs.grids import known_grids, load_grid

    rows = []
    for name in known_grids():
        row: dict[str, Any] = {"grid": name}
        for scale in SCALES:
            grid = load_grid(name, scale)
            row[f"trials@{scale}"] = grid.n_trials
            row["figure"] = grid.figure
        rows.append({k: row[k] for k in ["grid", *[f"trials@{s}" for s in SCALES], "figure"]})
    print(_table(rows))
    return 0


#: The most characters of a grid's description that `ablate show` prints (the file holds all of it).
SHOWN_DESCRIPTION = 2000


def _shortened(text: str) -> str:
    """``text``, cut to :data:`SHOWN_DESCRIPTION` characters with a note of how long it is."""
    if len(text) <= SHOWN_DESCRIPTION:
        return text
    return f"{text[:SHOWN_DESCRIPTION]}… ({len(text):,} characters in all; the grid file holds the rest)"


def cmd_show(args: argparse.Namespace) -> int:
    from ablate.service.specs.grids import load_grid

    grid = load_grid(args.grid, args.scale)
    trials = grid.trials  # expanded once: a 10 000-point grid takes a second per expansion
    print(f"grid: {grid.name}  (scale {grid.scale}, file {grid.path})")
    print(f"figure: {grid.figure}")
    print(f"description: {_shortened(grid.description.strip())}")
    print(f"search: {grid.search}; trials: {grid.n_trials}; cost: {grid.cost_steps(trials):,} trial-samples")
    if grid.scale_preset:
        print(f"preset: {grid.scale_preset} (the {grid.scale} scale starts from it; its own base and stop win)")
    print("base:")
    for k, v in grid.base.items():
        print(f"  {k}: {v}")
    print(f"stop: {grid.stop.settings()}")
    if grid.axes:
        print("axes:")
        for k, v in grid.axes.items():
            print(f"  {k}: {v}")
    if grid.variants:
        print("variants:")
        for v in grid.variants:
            print(f"  {v.param()}")
    if grid.optuna:
        print(f"optuna: {grid.optuna_dict()}")
    print(f"seeds: {grid.seeds}")
    for c in grid.chosen:
        print(f"chosen: {c.as_dict()}")
    if args.generator:
        from ablate.core.experiment import generator_stats

        print("generator g (one line per distinct g of the grid):")
        seen: dict[tuple, object] = {}
        for trial in trials:
            cfg = trial.config
            key = (
                cfg.latent_dim,
                cfg.generator_layers,
                cfg.effective_generator_seed,
                cfg.generator_cond_quantile,
                cfg.generator_cond_samples,
                cfg.generator,
                json.dumps(cfg.generator_options, sort_keys=True, default=str),
            )
            seen.setdefault(key, cfg)
        for key, cfg in list(seen.items())[:SHOWN_GENERATORS]:  # each g is built to describe it
            print(f"  d={key[0]} seed={key[2]}: {generator_line(generator_stats(cfg))}", flush=True)
        if len(seen) > SHOWN_GENERATORS:
            print(f"  … and {len(seen) - SHOWN_GENERATORS} more distinct g (each seed builds its own unless the grid "
                  "fixes generator_seed)")  # fmt: skip
    return 0


# ------------------------------------------------------------------- run: ablate.cli.run


def cmd_status(args: argparse.Namespace) -> int:
    from ablate.analysis.status import run_status

    info = run_status(args.run_dir, args.grid)
    print(f"run: {args.run_dir}  grid: {info['grid']} ({info['scale']})")
    print("  ".join(f"{k}: {v}" for k, v in info["counts"].items()))
    if info.get("driver"):
        print("driver: ablate pid {pid} on host {host} since {since}".format(**info["driver"]))
    if info.get("last_run"):
        print(f"last run: {info['last_run']}")
    if info.get("provenance"):
        print(f"made by: {info['provenance']}")
    print(_table(info["trials"]))
    for trial_id, error in info["errors"].items():
        print(f"trial {trial_id} failed: {_one_line(error)}")
    for trial_id, problem in info["damaged"].items():  # each says what the next `ablate run … --resume` does
        print(f"trial {trial_id}: {problem}")
    return 0


def _one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line, cut to ``limit`` characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


# ------------------------------------------------- report / export / dashboard
def cmd_report(args: argparse.Namespace) -> int:
    from ablate.reports.report import default_out, edited_note, left_out_note, load_run, watch_report, write_report

    out = args.out or default_out(args.run_dir, args.grid)
    if args.watch is None:
        run = load_run(args.run_dir, args.grid)
        print(f"report: {write_report(run, out, args.dashboard)}")
        for note in (edited_note(run), left_out_note(run)):  # the page's lines, word for word
            if note:
                print(note)
        return 0
    try:
        log = lambda m: print(m, flush=True)  # noqa: E731
        watch_report(args.run_dir, out, args.watch, args.dashboard, log=log, grid=args.grid)  # logs why it ended
    except KeyboardInterrupt:
        print("stopped watching; the report holds the last refresh", file=sys.stderr)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from ablate.analysis.finished import edited_line
    from ablate.analysis.results import NothingToExport, export_results
    from ablate.service.records.reader import RunReader
    from ablate.service.records.store import output_location

    name = f"results-{args.grid}.csv" if args.grid else "results.csv"
    out = args.out or output_location(args.run_dir, name)  # a run in a bucket: RUN-results.csv here, as a report
    try:
        print(f"wrote {export_results(args.run_dir, out, args.grid)}")
        edited = edited_line(RunReader(args.run_dir, args.grid).disagreeing())
        if edited:  # as report and compare say it: those trials are not in the table
            print(edited)
    except NothingToExport as exc:  # a run that started but has no report: say so, exit 1, write no empty table
        print(f"ablate: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_claims(args: argparse.Namespace) -> int:
    from ablate.analysis.claims import evaluate_run, markdown_table, text_report

    results = []
    for run_dir in args.run_dir:
        found = evaluate_run(run_dir, args.grid)
        if not found and not args.markdown:
            print(f"{run_dir}: its grid decides no claim of docs/reproduction.md")
        results += found
    print(markdown_table(results) if args.markdown else text_report(results))
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    from ablate.service.execution.cluster import (
        serve,  # Ray's web dashboard (not the report specs in ablate/dashboards/)
    )

    return serve(args.host, args.port, out=lambda m: print(m, flush=True))


# ------------------------------------------------------------------ main
#: Help of --grid on the commands that read a run.
GRID_HELP = "of a run that holds several grids, read this one's points (default: the grid it ran last)"


#: The distinct generators `ablate show` describes (building each takes a moment); the rest are counted.
SHOWN_GENERATORS = 12


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    p = argparse.ArgumentParser(prog="ablate", description="Identifiability ablations of contrastive learning.")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train one experiment without Ray, one line per report")
    t.add_argument("--set", nargs="*", metavar="KEY=VALUE", help="RunConfig fields, e.g. latent_dim=10")
    t.add_argument("--steps", type=int, help="steps to train (default: max_steps)")
    t.add_argument("--preset", help="start from a named preset (ablate/presets/*.yaml), e.g. fast; --set wins over it")
    t.set_defaults(func=cmd_train)

    sub.add_parser("list", help="every grid with its figure and trial counts").set_defaults(func=cmd_list)

    s = sub.add_parser("show", help="a grid's resolved settings and axes")
    s.add_argument("grid")
    s.add_argument("--scale", default=DEFAULT_SCALE, choices=SCALES)
    s.add_argument(
        "--no-generator",
        dest="generator",
        action="store_false",
        help="skip building each g of the grid (seconds per g at d >= 20) to print its condition numbers",
    )
    s.set_defaults(func=cmd_show)

    r = sub.add_parser("run", help="run one or more grids through Ray Tune")
    r.add_argument(
        "grid",
        nargs="+",
        help="grid names (see `ablate list`) or paths to grid YAML files; several run one after another on one Ray",
    )
    add_run_options(r, "run")
    r.add_argument("--report", dest="report", action="store_true", default=True, help=argparse.SUPPRESS)
    r.add_argument(
        "--no-report", dest="report", action="store_false", help="skip writing RUN_DIR/report.html when the run ends"
    )
    r.set_defaults(func=cmd_run)

    st = sub.add_parser("status", help="trials finished / running / errored / pending of a run")
    st.add_argument("run_dir")
    st.add_argument("--grid", help=GRID_HELP)
    st.set_defaults(func=cmd_status)

    rp = sub.add_parser("report", help="an offline HTML report of a run (finished or in progress)")
    rp.add_argument("run_dir")
    rp.add_argument("--out", help="HTML file to write (default: RUN_DIR/report.html)")
    rp.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=10.0,
        metavar="SECONDS",
        help="rewrite the report every SECONDS (default 10) until no trial is left to run (each finished or failed)",
    )
    rp.add_argument("--dashboard", help="a dashboard spec YAML (default: ablate/dashboards/<grid>.yaml)")
    rp.add_argument("--grid", help=GRID_HELP)
    rp.set_defaults(func=cmd_report)

    about = "write a run's results table as CSV or Parquet (exit 1, writing nothing, while no trial has reported)"
    ex = sub.add_parser("export", help=about, description=about[0].upper() + about[1:] + ".")
    ex.add_argument("run_dir")
    ex.add_argument(
        "--out",
        help="FILE.csv or FILE.parquet (default: RUN_DIR/results.csv; for a run on object storage, "
        "RUN-results.csv in the current folder)",
    )
    ex.add_argument("--grid", help=GRID_HELP)
    ex.set_defaults(func=cmd_export)

    cl = sub.add_parser("claims", help="check runs against the papers' claims (docs/reproduction.md)")
    cl.add_argument("run_dir", nargs="+")
    cl.add_argument("--markdown", action="store_true", help="print the summary table of docs/reproduction.md")
    cl.add_argument("--grid", help=GRID_HELP)
    cl.set_defaults(func=cmd_claims)

    add_compare_parser(sub)  # ablate compare RUN --by AXIS: ablate.cli.compare
    add_slurm_parser(sub)  # ablate slurm GRID: a SLURM batch script (ablate.cli.slurm)

    db = sub.add_parser("dashboard", help="start (or find) the local Ray head and print its dashboard URL")
    db.add_argument("--host", help="interface the dashboard binds to (default 127.0.0.1; others warn)")
    db.add_argument("--port", type=int, default=8265)
    db.set_defaults(func=cmd_dashboard)
    return p


#: The most characters of one line of an error message; a longer line keeps its start and end (the file and
#: what is wrong) around '…'. Spec errors quote values cut short already; this also bounds everything else.
ERROR_LINE_LIMIT = 2000


def error_text(exc: BaseException) -> str:
    """``str(exc)`` with every line longer than :data:`ERROR_LINE_LIMIT` cut in its middle."""
    head, tail = ERROR_LINE_LIMIT * 3 // 4, ERROR_LINE_LIMIT // 4
    lines = str(exc).splitlines() or [""]
    return "\n".join(
        f"{line[:head]} … ({len(line) - head - tail:,} characters left out) … {line[-tail:]}"
        if len(line) > ERROR_LINE_LIMIT
        else line
        for line in lines
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `ablate` console script.

    A reader that stops reading (``ablate status RUN | head -1``) ends the command quietly with exit 141, as a
    shell reports a command a closed pipe (SIGPIPE) stopped: no BrokenPipeError traceback."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # now, not at exit, where a reader that has gone could only be reported, not caught
        return code
    except BrokenPipeError:
        _stdout_to_devnull()
        return 141


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so that Python's last flush at exit does not fail on the closed pipe again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is no real file (a test's capture): nothing is flushed to a pipe
        pass


def _main(argv: list[str] | None) -> int:
    from ablate.core.dgp import LowAcceptanceError
    from ablate.service.records.rundir import RunError, WriteError
    from ablate.service.records.store import StoreError
    from ablate.service.specs.grids import GridError
    from ablate.service.specs.presets import PresetError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except WriteError as exc:  # a full disk, a read-only --out: what could not be written, and why
        print(f"ablate: error: {error_text(exc)}", file=sys.stderr)
        return 1
    except StoreError as exc:  # a bucket that cannot be reached or read (after its client's retries)
        print(f"ablate: error: {error_text(exc)}", file=sys.stderr)
        return 1
    except (ConfigError, GridError, PresetError, RunError, LowAcceptanceError) as exc:
        print(f"ablate: error: {error_text(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # a second Ctrl-C (or SIGTERM: ray_compat.Terminated) stops at once
        from ablate.ray_compat import Terminated

        hint = f": {resume_command(args)}" if args.command == "run" else ""
        print(f"ablate: interrupted; continue with --resume{hint}", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
