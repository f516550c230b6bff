"""A trial's Ray result that carries several reports (``--results-every S``), and splitting it back into rows.

A grid's trial (:class:`ablate.service.execution.trainable.AblateTrainable`) trains report after report within one
Ray iteration until ``S`` seconds have passed, and returns the last report with the ones before it under
:data:`REPORTS_KEY`, each with its own ``time_this_iter_s``. Ray then hears from the trial at most every ``S``
seconds (one result, one pass of Tune's loop and callbacks, one progress-table update), while the driver's result
log (:class:`ablate.service.execution.callbacks.ResultLog`) still writes every report as its own row
(:func:`split_reports`). A search's trials send every report: ASHA and the searcher judge each one.

Nothing here imports Ray.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RAY_KEYS", "REPORTS_KEY", "split_reports"]

#: The key under which a result carries the reports trained before its own, oldest first.
REPORTS_KEY = "reports"
#: Keys Ray adds to every result (a finished trial's last report is handed back without them).
RAY_KEYS = (
    "training_iteration", "trial_id", "time_this_iter_s", "time_total_s", "timestamp", "date", "pid",
    "hostname", "node_ip", "time_since_restore", "iterations_since_restore", "done", "config",
)  # fmt: skip
#: Ray's keys that an earlier report of a result shares with it (where and in which Ray iteration it trained).
_SHARED = ("trial_id", "date", "pid", "hostname", "node_ip", "iterations_since_restore", "config")
#: Ray's clocks, in seconds, that an earlier report reads as they stood when it ended.
_CLOCKS = ("time_total_s", "time_since_restore", "timestamp")


def split_reports(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The reports a Ray result carries, oldest first, each a row as if Ray had had a result for it: Ray's keys
    of the result shared, its clocks (``time_total_s``, ``time_since_restore``, ``timestamp``) wound back by the
    time of the reports after it, ``time_this_iter_s`` its own, and ``done`` false. A result without earlier
    reports is one row, itself."""
    earlier = result.get(REPORTS_KEY)
    last = {k: v for k, v in result.items() if k != REPORTS_KEY}
    if not isinstance(earlier, list) or not earlier:
        return [last]
    own = [_seconds(r.get("time_this_iter_s")) for r in earlier]
    whole = _seconds(last.get("time_this_iter_s"))
    last_own = max(whole - sum(own), 0.0)
    rows: list[dict[str, Any]] = []
    after = last_own  # the time trained after the report in hand, until the result was made
    for report, seconds in zip(reversed(earlier), reversed(own)):
        row = {**{k: last[k] for k in _SHARED if k in last}, **report, "done": False, "time_this_iter_s": seconds}
        for clock in _CLOCKS:
            value = last.get(clock)
            if isinstance(value, int | float) and not isinstance(value, bool):
                row[clock] = int(value - after) if clock == "timestamp" else value - after
        rows.append(row)
        after += seconds
    if "time_this_iter_s" in last:
        last["time_this_iter_s"] = last_own
    return [*reversed(rows), last]


def _seconds(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
