"""Arguments that `ablate run` and `ablate slurm` share: which grid points to run, at which scale, under which name,
and the checks of their values that run before anything is written or Ray starts (:func:`check_options`)."""

from __future__ import annotations

import argparse
import math

from ablate.service.specs.grid import DEFAULT_SCALE, SCALES

__all__ = ["OPTION_BOUNDS", "add_grid_selection", "check_options", "option_problem"]

#: The numbers each option of `ablate run` and `ablate slurm` takes (by its dest): the comparison, the bound and
#: what the option counts. Ray would take --max-failures -1 as "retry forever" (a trial that always fails would keep
#: the run from ending), so it is refused like the others.
OPTION_BOUNDS: dict[str, tuple[str, int, str]] = {
    "cpus_per_trial": (">", 0, "CPUs per trial; fractions share a core"),
    "gpus_per_trial": (">=", 0, "GPUs per trial; 0 trains on the CPU, fractions share a GPU"),
    "keep_checkpoints": (">=", 1, "checkpoints kept per trial; a retry or --resume starts from the last"),
    "max_concurrent": (">=", 1, "trials running at once"),
    "max_failures": (">=", 0, "retries of a failed trial; 0 retries none"),
}


def add_grid_selection(parser: argparse.ArgumentParser) -> None:
    """Add --scale, --name, --set, --variants and --preset to ``parser``."""
    parser.add_argument("--scale", default=DEFAULT_SCALE, choices=SCALES)
    parser.add_argument(
        "--name", help="run name, a folder name under --storage (default: <grid>-<scale>, or <grid>-<scale>-<preset>)"
    )
    parser.add_argument("--set", nargs="*", metavar="KEY=VALUE", help="override a setting for every trial")
    parser.add_argument("--variants", metavar="NAME[,NAME]", help="run only these of the grid's variants")
    parser.add_argument(
        "--preset", help="train every trial with a named preset, e.g. fast; the grid's axes and --set win"
    )


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def option_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the first option of ``args`` outside what it allows (argparse's wording: ``argument
    --cpus-per-trial: must be a number > 0 (CPUs per trial; …), got 0``), or None. Options ``args`` lacks or left
    at None (a default that means "none" or "decide later") are not checked."""
    for dest, (op, bound, what) in OPTION_BOUNDS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        ok = math.isfinite(value) and (value > bound if op == ">" else value >= bound)
        if not ok:
            noun = "an integer" if isinstance(value, int) else "a number"
            shown = f"{value:g}" if isinstance(value, float) else str(value)
            return f"argument {_flag(dest)}: must be {noun} {op} {bound} ({what}), got {shown}"
    if getattr(args, "name", None) == "":  # other bad names are refused where the run folder is named (rundir)
        return (
            "argument --name: expected a run name (one folder name inside --storage), got '' "
            "(leave --name out for the default name)"
        )
    return None


def check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse ``args`` as argparse refuses a malformed option (the command's usage, one line naming the option and
    what it allows, exit 2) when :func:`option_problem` finds one: before anything is written or Ray starts."""
    problem = option_problem(args)
    if problem is None:
        return
    command = parser
    for action in parser._actions:  # the subcommand's own parser, for its usage line (argparse keeps no public map)
        if isinstance(action, argparse._SubParsersAction):
            command = action.choices.get(getattr(args, "command", None), parser)
    command.error(problem)
