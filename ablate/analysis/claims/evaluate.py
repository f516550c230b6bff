"""Claims evaluator: does a run reproduce the paper's claim for its grid, within a stated tolerance?

One function per claim of docs/reproduction.md (:mod:`.main_text`, :mod:`.appendix`). Each takes the tidy results
table of a run (:func:`ablate.analysis.results.load_results`) and the run's
:class:`ablate.analysis.run.RunContext` (the trials' resolved configs, the grid's paper values), and returns a
:class:`ClaimResult`: the paper's figure and value, ablate's value (mean ± sd over seeds where there are seeds),
one :class:`Check` per criterion, and PASS / FAIL / NOT MEASURED. The claims read columns of values, never a
report's display labels; files are read only by :func:`evaluate_run` and :func:`run_wall_s`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import pandas as pd

from ablate.analysis.claims.appendix import claim_ensemble, claim_hard_negatives, claim_tricl, claim_zimmermann
from ablate.analysis.claims.base import ClaimFn, ClaimResult, claim_scope
from ablate.analysis.claims.linear_lambda import claim_linear_lambda, claim_linear_lambda_public_run
from ablate.analysis.claims.main_text import (
    claim_anisotropy,
    claim_batch_vs_dim,
    claim_batch_vs_lambda,
    claim_bimodal,
)
from ablate.analysis.finished import left_out_line, unfinished_trials
from ablate.analysis.run import RunContext, load_run
from ablate.service.records.reader import RunReader
from ablate.service.records.rundir import MARKER_TIME_FORMAT, run_name

__all__ = [
    "CLAIMS",
    "LEFT_OUT_WHY",
    "command",
    "evaluate_frame",
    "evaluate_run",
    "markdown_table",
    "run_wall_s",
    "text_report",
]


# --------------------------------------------------------------------------- registry and runs
#: grid name → the claims its runs decide. Grids absent here (concentration_dynamics, tune_*) decide none.
CLAIMS: dict[str, list[ClaimFn]] = {
    "anisotropy": [claim_anisotropy],
    "bimodal_dynamics": [claim_bimodal],
    "linear_lambda": [claim_linear_lambda, claim_linear_lambda_public_run],
    "batch_vs_dim": [claim_batch_vs_dim],
    "batch_vs_lambda": [claim_batch_vs_lambda],
    "hard_negatives": [claim_hard_negatives],
    "ensemble": [claim_ensemble],
    "tricl": [claim_tricl],
    "zimmermann_sphere": [claim_zimmermann],
}


#: Why the trials that did not finish are left out, as the claims say it.
LEFT_OUT_WHY = "a last report before the end is not a final value; the claim is decided on the finished trials"


def evaluate_frame(df: pd.DataFrame, ctx: RunContext) -> list[ClaimResult]:
    """Every claim registered for the table's grid (``df.attrs['grid']`` or ``ctx.grid``), each on the trials it
    reads (:func:`ablate.analysis.claims.base.reads`) that finished: each result names the trials it reads that did
    not finish in ``left_out`` (:func:`ablate.analysis.finished.unfinished_trials`), and a check left without data
    says that they were left out. A trial the claim does not read is never named in it."""
    grid = str(df.attrs.get("grid") or ctx.grid)
    out = []
    for fn in CLAIMS.get(grid, []):
        part = claim_scope(fn)(df, ctx)
        part.attrs.update(df.attrs)
        res = fn(part, ctx)
        left_out = unfinished_trials(part)
        res.grid, res.scale = grid, str(df.attrs.get("scale", ""))
        res.left_out = left_out
        for check in res.checks if left_out else []:
            if check.passed is None:
                check.value += f" ({len(left_out)} trial(s) that did not finish were left out)"
        out.append(res)
    return out


def run_wall_s(run_dir: str | Path) -> float | None:
    """Seconds from the run's creation (its marker) to the last report of any trial, or None if unknown."""
    reader = RunReader(run_dir)
    try:
        start = datetime.strptime(reader.marker()["created"], MARKER_TIME_FORMAT).timestamp()
    except (KeyError, ValueError):
        return None
    last = [row["timestamp"] for name in reader.trial_dirs() for row in reader.results(name)[-1:] if "timestamp" in row]
    return float(max(last) - start) if last else None


def evaluate_run(run_dir: str | Path, grid: str | None = None) -> list[ClaimResult]:
    """Read a run directory and evaluate the claims of its grid (``grid``: one of several it holds; default: the
    one it ran last); an empty list if that grid decides none."""
    run = load_run(run_dir, grid)
    results = evaluate_frame(run.df, run.ctx)
    wall = run_wall_s(run_dir) if results else None
    preset = RunReader(str(run_dir), grid).marker().get("preset") if results else None
    for res in results:
        res.run_dir, res.wall_s, res.preset = str(run_dir), wall, preset
    return results


# --------------------------------------------------------------------------- output
def command(grid: str, scale: str, preset: str | None = None) -> str:
    """The one command that reproduces a claim's run and report."""
    run = f"ablate run {grid} --scale {scale}" + (f" --preset {preset}" if preset else "")
    return f"{run} && ablate report runs/{run_name(grid, scale, preset)}"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(results: Sequence[ClaimResult]) -> str:
    """The summary table of docs/reproduction.md, one row per claim; its result names the trials left out."""
    head = ["#", "claim", "figure", "paper", "ablate", "criterion", "result", "wall (2 CPU)", "command"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(results, key=lambda r: r.claim):
        wall = f"{r.wall_s:.0f} s" if r.wall_s is not None else "n/a"
        cells = [
            str(r.claim),
            r.title,
            r.figure,
            r.paper_value,
            r.value,
            r.criterion,
            f"**{r.status}**" + (f"; {left_out_line(r.left_out, LEFT_OUT_WHY)}" if r.left_out else ""),
            wall,
            f"`{command(r.grid, r.scale, r.preset)}`",
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def text_report(results: Sequence[ClaimResult]) -> str:
    """A plain-text account of each claim, the trials it left out (they did not finish), and its checks."""
    out = []
    for r in results:
        wall = f", wall {r.wall_s:.0f} s" if r.wall_s is not None else ""
        preset = f", preset {r.preset}" if r.preset else ""
        out.append(f"claim {r.claim} [{r.status}] {r.title} — {r.figure} ({r.grid} @ {r.scale}{preset}{wall})")
        out.append(f"  paper:  {r.paper_value}")
        out.append(f"  ablate: {r.value}")
        if r.left_out:
            out.append(f"  {left_out_line(r.left_out, LEFT_OUT_WHY)}")
        for c in r.checks:
            verdict = {True: "pass", False: "FAIL", None: "not measured"}[c.passed]
            out.append(f"  - [{verdict}] {c.name}: {c.value}\n      criterion: {c.criterion}")
    return "\n".join(out)
