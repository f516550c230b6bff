"""A grid finishes in one `ablate run` while trial processes and nodes die (spot and preemptible machines).

Ray Tune retries a trial that fails while it trains, up to ``--max-failures`` times. It does not retry a trial whose
process (Ray's actor, which Tune reuses from one grid point to the next) dies while Tune hands it its point, nor
one that has used its retries: Tune ends those ``ERROR``. After Tune's round the runner asks the record what is
left of the round's units (:func:`units_left`) and runs again, in the same Ray session, those whose process or node
died (:func:`run_again`: each from its own record, as a resume would), as long as the unit's failures in all rounds
together stay within ``--max-failures``. A unit that failed by its own error (a plugin that raises: the same point
fails the same way) is not run again: Ray already retried it as ``--max-failures`` allows.

:class:`Retries` keeps the count across rounds and names why each retry happened, Ray's and the runner's, for the
run's last line (:func:`ablate.service.records.outcome.retry_line`).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from ablate.service.records.plan import Plan, apply_plan, decide_run
from ablate.service.specs.grids import Grid
from ablate.service.specs.params import RECORD_KEY

__all__ = [
    "LOST",
    "NODE_DIED",
    "PROCESS_DIED",
    "Retries",
    "death_of",
    "error_line",
    "failure_reason",
    "last_failure",
    "run_again",
    "units_left",
]

#: Why a unit was run again: its trial process died (killed, crashed, out of memory by the kernel's hand)…
PROCESS_DIED = "its trial process died"
#: … or the node it ran on died or left the cluster …
NODE_DIED = "its node died"
#: … or Ray Tune ended the round with it neither finished nor failed.
LOST = "Ray Tune ended it unfinished"

#: Ray's exceptions that say a trial's process or node is gone, not that the trial's code raised.
_DEATHS = ("RayActorError", "WorkerCrashedError", "NodeDiedError", "LocalRayletDiedError", "ObjectLostError")
_NODE_DEATHS = ("NodeDiedError", "LocalRayletDiedError")
_NODE_WORDS = ("node has died", "node died", "node was terminated", "raylet died", "node is dead", "preempted")
#: What the text of Ray's death errors says (Tune writes ``str(error)``, without the class's name).
_DEATH_TEXTS = (
    ("The actor died", "RayActorError"),
    ("The actor is dead", "RayActorError"),
    ("The worker died unexpectedly", "WorkerCrashedError"),
)
#: The exceptions of Ray a traceback's text names.
_NAMED = re.compile(r"\bray\.exceptions\.(\w+)")
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
_PID = re.compile(r"\bpid[:=] ?(\d+)")
_RAISED = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception|Fault))\b", flags=re.M)


def _chain(exc: BaseException | None):
    """``exc``, the exception a RayTaskError wraps, and its causes and contexts, each once."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        cause = getattr(exc, "cause", None)  # RayTaskError: the exception raised in the worker
        exc = cause if isinstance(cause, BaseException) else (exc.__cause__ or exc.__context__)


def death_of(error: BaseException | str | None) -> str | None:
    """:data:`PROCESS_DIED` or :data:`NODE_DIED` when ``error`` (as Ray Tune hands a trial's error back, or the
    text of its traceback) says the trial's process or its node is gone; None for an error of the trial's own."""
    if isinstance(error, str):
        text = error.rsplit("Failure # ", 1)[-1]  # Tune's error.txt: each failure of the trial, the last one last
        names = set(_NAMED.findall(text)) | {name for phrase, name in _DEATH_TEXTS if phrase in text}
        return _death(names, text)
    for exc in _chain(error):
        died = _death({cls.__name__ for cls in type(exc).__mro__}, str(exc))
        if died is not None:
            return died
    return None


def _death(names: set[str], text: str) -> str | None:
    if not names.intersection(_DEATHS):
        return None
    if names.intersection(_NODE_DEATHS) or any(w in text.lower() for w in _NODE_WORDS):
        return NODE_DIED
    return PROCESS_DIED


def failure_reason(error: BaseException | str | None) -> str:
    """Why a trial failed, in a few words: :func:`death_of`'s answer, or ``it raised NAME`` for its own error."""
    died = death_of(error)
    if died is not None:
        return died
    if error is None:
        return "it failed"
    if isinstance(error, str):  # a traceback's text: the last exception it names
        found = _RAISED.findall(error.rsplit("Failure # ", 1)[-1])
        return f"it raised {found[-1]}" if found else "it failed"
    inner = [exc for exc in _chain(error) if not type(exc).__name__.startswith("RayTaskError")]
    return f"it raised {type(inner[-1] if inner else error).__name__}"


def _failures(error: BaseException | str | None, count: int) -> int:
    """A unit's failures in a round: Tune's ``count``, but one death of one process once. Tune, handing a trial
    whose actor died to that same dead cached actor again, fails it twice by one death: its error text names the
    same process (``pid``) in both."""
    if not isinstance(error, str):
        return max(int(count), 1)
    seen: set[str] = set()
    again = 0  # failures by a process already counted
    for section in error.split("Failure # ")[1:]:
        pid = _PID.search(section) if death_of(section) else None
        if pid is not None:
            again += pid[1] in seen
            seen.add(pid[1])
    return max(int(count) - again, 1)


def last_failure(text: str | None) -> str | None:
    """The last failure of Tune's ``error.txt`` of a trial (it holds each, the last one last), without its colours."""
    if not text:
        return None
    text = _COLOUR.sub("", text)
    return text.rsplit("Failure # ", 1)[-1].partition("\n")[2].strip() or text.strip()


def error_line(text: str | None) -> str:
    """A trial's last failure in one line: :func:`death_of`'s words for a dead process or node, else the last line
    of its traceback (``NAME: message``)."""
    died = death_of(text)
    if died is not None:
        return died
    lines = [line.strip() for line in (last_failure(text) or "").splitlines() if line.strip()]
    return lines[-1] if lines else "the trial failed"


class Retries:
    """Failures per unit (a grid point, or a pack) across the rounds of one `ablate run`, and the retries they
    earned: by Ray within a round (:meth:`ray_retried`) and by the runner between rounds (:meth:`again`)."""

    def __init__(self, max_failures: int):
        self.max_failures = max_failures
        self.failures: Counter[str] = Counter()  # unit id → failures so far, all rounds
        self.retried: dict[str, list[str]] = {}  # unit id → why each retry (Ray's or the runner's) happened
        self.redone = 0  # reports trained again: those after the checkpoint a retried trial continued from

    def ray_retried(self, unit: str, reason: str) -> None:
        """Ray Tune retried ``unit`` in this round (its trial failed while it trained)."""
        self.retried.setdefault(unit, []).append(reason)

    def again(self, unfinished: set[str], failed: dict[str, tuple[int, BaseException | str | None]]) -> set[str]:
        """Of the units a round ran that its record says did not end (``unfinished``: neither finished nor failed
        for good by a non-finite loss), those to run again: whose last failure in the round (``failed``: unit id →
        Tune's count of its failures in the round and its last error) was the death of its process or node, or
        that Tune left unfinished without an error, while their failures in all rounds stay within
        ``max_failures``. A unit that failed by its own error is not run again."""
        out = set()
        for unit in sorted(unfinished):
            count, error = failed.get(unit, (1, None))
            self.failures[unit] += _failures(error, count)
            why = death_of(error) if unit in failed else LOST
            if why is not None and self.failures[unit] <= self.max_failures:
                out.add(unit)
                self.retried.setdefault(unit, []).append(why)
        return out


def units_left(grid: Grid, run_dir: str, ran: Plan, **settings: Any) -> Plan:
    """What the record says is left of the units ``ran`` (a round's plan) after the round: the run's plan decided
    afresh from its files (:func:`ablate.service.records.plan.decide_run`, which writes nothing; ``settings`` as
    for it), cut down to those units (:meth:`ablate.service.records.plan.Plan.only`)."""
    ids = {unit[RECORD_KEY]["id"] for unit in ran.units}
    return decide_run(grid, run_dir, **settings).only(ids)


def run_again(left: Plan, units: set[str], run_dir: str) -> Plan:
    """The plan that runs ``units`` of ``left`` (:func:`units_left`) again, each from its own record as a resume
    would (its newest checkpoint its log covers), written for those units alone: the run's other points, finished
    or failed by their own error, are left as they are."""
    return apply_plan(left.only(units), run_dir)  # its .redone: the reports its cut logs dropped
