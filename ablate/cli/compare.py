"""`ablate compare`: differences between the levels of one axis of a run, with 95 % intervals over seeds."""

from __future__ import annotations

import argparse
import math
from typing import Any

from ablate.analysis.text import text_table

__all__ = ["add_compare_parser", "cmd_compare", "compare_rows", "left_out_line", "left_out_notes"]


def _ci(lo: float, hi: float) -> str:
    return "" if math.isnan(lo) else f"[{lo:+.4f}, {hi:+.4f}]"


def compare_rows(table: Any) -> list[dict[str, Any]]:
    """The rows ``ablate compare`` prints from :func:`ablate.analysis.compare.compare`'s table."""
    by = table.attrs["by"]
    others = [c for c in table.columns[: list(table.columns).index("a")]]
    rows = []
    for _, r in table.iterrows():
        row: dict[str, Any] = {c: r[c] for c in others}
        row[f"{by}: a − b"] = f"{r['a']} − {r['b']}"
        row["seeds"] = f"{r['n_a']} vs {r['n_b']}"
        row["means"] = f"{r['mean_a']:.4f} vs {r['mean_b']:.4f}"
        row["diff"] = f"{r['diff']:+.4f}"
        row["95 % CI (Welch)"] = _ci(r["welch_lo"], r["welch_hi"])
        row["p (Welch)"] = "" if math.isnan(r["welch_p"]) else f"{r['welch_p']:.3g}"
        row["95 % CI (bootstrap)"] = _ci(r["boot_lo"], r["boot_hi"])
        row["verdict"] = r["verdict"]
        rows.append(row)
    return rows


#: Why the left-out trials are left out, as compare says it.
LEFT_OUT_WHY = "a last report before the end is not comparable with finished trials'; compare them with --at STEP"


def left_out_line(left_out: dict[str, str]) -> str:
    """One line: how many trials did not finish and were left out, each named with why
    (:func:`ablate.analysis.finished.left_out_line`, worded for compare)."""
    from ablate.analysis.finished import left_out_line as line

    return line(left_out, LEFT_OUT_WHY)


def left_out_notes(edited: list[str], unfinished: dict[str, str]) -> list[str]:
    """The lines naming the trials compare leaves out, as the report words them: those whose params.json
    disagrees with the run's record (``edited``, never read: :func:`ablate.analysis.finished.edited_line`), then
    those that did not finish (``unfinished``, at ``final``: :func:`left_out_line`); none when every trial counts."""
    from ablate.analysis.finished import edited_line

    return [line for line in (edited_line(edited), left_out_line(unfinished) if unfinished else "") if line]


def cmd_compare(args: argparse.Namespace) -> int:
    """Print every pairwise difference of ``--by``'s levels (see :func:`ablate.analysis.compare.compare`), after a
    line for each kind of trial left out of them (:func:`left_out_notes`)."""
    from ablate.analysis.compare import BOOT_SEED, N_BOOT, compare
    from ablate.analysis.run import load_run

    run = load_run(args.run_dir)
    table = compare(run.df, args.by, args.metric, args.at, axes=run.ctx.axes)
    print(
        f"run: {args.run_dir}  grid: {run.name}  metric: {args.metric} at {args.at if args.at == 'final' else 'step ' + str(args.at)}"
    )
    print(
        f"difference = mean(a) − mean(b) over seeds; the verdict reads Welch's t interval (needs ≥ 2 seeds a side); "
        f"bootstrap: {N_BOOT} resamples of each side's seeds, seed {BOOT_SEED}"
    )
    for note in left_out_notes(run.left_out, table.attrs.get("left_out") or {}):
        print(note)
    if table.empty:
        print(f"no two levels of {args.by} to compare (one level, or no finished reports yet)")
        return 0
    print(text_table(compare_rows(table)))
    return 0


def add_compare_parser(sub: Any) -> None:
    """Add ``ablate compare`` to the CLI's subparsers."""
    c = sub.add_parser("compare", help="differences between an axis's levels with 95 %% intervals over seeds")
    c.add_argument("run_dir")
    c.add_argument("--by", required=True, help="the axis whose levels to compare, e.g. variant, batch_size")
    c.add_argument("--metric", default="r2", help="a reported metric column (default r2)")
    c.add_argument(
        "--at", default="final", metavar="final|STEP", help="each trial's last report, or its report at STEP"
    )
    c.set_defaults(func=cmd_compare)
