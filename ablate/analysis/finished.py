"""Which trials finished, and why each other one did not: the one rule compare, the claims and the report share.

A trial's last report is its final value only when the trial finished: it ran to its stop settings (``max_steps``
or ``target_r2``), so its status (:func:`ablate.service.records.trial_log.trial_status`) is TERMINATED and its scheduler did not stop
it early. A trial that errored (its loss went non-finite, its last row holding :data:`ablate.service.records.trial_log.ERROR_KEY`, or
Ray gave up on it), was interrupted, is still running, or that a search's scheduler (ASHA) stopped before its stop
settings (TERMINATED, column ``stopped_early``; ``ablate status`` counts it as finished, a search's normal outcome)
ended at another step, so its last report is not comparable with a finished trial's final value. Every final value
(``ablate compare`` at ``final``, the claims, the report's grid points and final-value panels) is read from
:func:`finished_only`'s table, and every trial left out is named with why (:func:`unfinished_trials`) in one line
worded by :func:`left_out_line`. A trial whose params.json disagrees with the run's record of its point (edited by
hand) is not read at all (:meth:`ablate.service.records.reader.RunReader.disagreeing`); every command that leaves it
out says so in one line too (:func:`edited_line`).
"""

from __future__ import annotations

import pandas as pd

from ablate.analysis.run import final_rows

__all__ = [
    "FINISHED_STATUSES",
    "NAMED_LEFT_OUT",
    "STOPPED_EARLY_WORDS",
    "edited_line",
    "final_values",
    "finished_only",
    "left_out_line",
    "unfinished_trials",
]

#: Trial statuses whose last report is the trial's end (unless its scheduler stopped it early).
FINISHED_STATUSES = frozenset({"TERMINATED"})
#: How a left-out trial's status reads.
_STATUS_WORDS = {"ERROR": "errored", "INTERRUPTED": "interrupted", "RUNNING": "still running"}
#: How a trial its scheduler stopped before its stop settings reads.
STOPPED_EARLY_WORDS = "stopped early by the scheduler"
#: Left-out trials named in :func:`left_out_line`; the rest are counted.
NAMED_LEFT_OUT = 10


def _finished(df: pd.DataFrame) -> pd.Series:
    """Per row: whether its trial finished (a status in :data:`FINISHED_STATUSES`, not ``stopped_early``)."""
    done = df["status"].astype(str).isin(FINISHED_STATUSES)
    if "stopped_early" in df.columns:
        done &= df["stopped_early"].ne(True)
    return done


def unfinished_trials(df: pd.DataFrame) -> dict[str, str]:
    """trial id → why its last report is not its end (``errored at step 7``, ``interrupted at step 5``, ``still
    running at step 3``, ``stopped early by the scheduler at step 4``), for each trial of the table that did not
    finish; {} for a table without statuses."""
    if df.empty or "status" not in df.columns:
        return {}
    last = final_rows(df)
    out = {}
    for (_, row), done in zip(last.iterrows(), _finished(last)):
        if done:
            continue
        status = str(row["status"])
        words = STOPPED_EARLY_WORDS if status in FINISHED_STATUSES else _STATUS_WORDS.get(status, status.lower())
        step = row.get("step")
        at = f" at step {int(step)}" if step is not None and pd.notna(step) else ""
        out[str(row["trial_id"])] = f"{words}{at}"
    return out


def finished_only(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of the trials that finished (every report of each; ``attrs`` kept). A table without statuses is
    returned as it is."""
    if df.empty or "status" not in df.columns:
        return df
    out = df[_finished(df)]
    out.attrs.update(df.attrs)
    return out


def final_values(df: pd.DataFrame) -> pd.DataFrame:
    """The final report of each trial that finished (:func:`ablate.analysis.run.final_rows` of
    :func:`finished_only`): what a final value is read from."""
    return final_rows(finished_only(df))


def left_out_line(left_out: dict[str, str], why: str) -> str:
    """One line: how many trials did not finish and were left out (``why``: what that means for the reader), each
    named with why it did not finish; past :data:`NAMED_LEFT_OUT` the rest are counted."""
    named = "; ".join(f"{t} ({reason})" for t, reason in list(left_out.items())[:NAMED_LEFT_OUT])
    more = f"; … and {len(left_out) - NAMED_LEFT_OUT} more" if len(left_out) > NAMED_LEFT_OUT else ""
    return f"left out: {len(left_out)} trial(s) that did not finish ({why}): {named}{more}"


def edited_line(trials: list[str]) -> str:
    """One line: how many trials were left out because their params.json disagrees with the run's record of their
    point, the first :data:`NAMED_LEFT_OUT` named (the report's and compare's words); "" when there are none."""
    if not trials:
        return ""
    more = " …" if len(trials) > NAMED_LEFT_OUT else ""
    return (
        f"{len(trials)} trial(s) left out: their params.json disagrees with the run's record of their point "
        f"(edited by hand?): {', '.join(trials[:NAMED_LEFT_OUT])}{more}"
    )
