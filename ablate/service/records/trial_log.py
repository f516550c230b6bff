"""A trial's result log (``trial_<id>/result.json``): one JSON line per report, append-only, read back without Ray.

A resume keeps a log's intact rows (their steps rise), cut back to the checkpoint it continues from; whether a
trial is finished follows from its last row and its stop settings (:func:`finished`).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ablate.files import atomic_write
from ablate.service.records.store.local import LocalStore

_log = logging.getLogger("ablate.service.records.trial_log")

#: The key of the report that ends a trial whose loss went non-finite (a solo trial's or a pack member's), with the
#: error's text naming the step. A result of the science, not a crash: the same seed fails at the same step again,
#: so the trial is never retried and a resume reuses it as it ended.
ERROR_KEY = "member_error"

__all__ = [
    "ERROR_KEY",
    "append_row",
    "cut_log",
    "cut_text",
    "ended",
    "failure_count",
    "finished",
    "intact_rows",
    "json_text",
    "last_row_in",
    "last_step",
    "parse_rows",
    "read_rows",
    "seconds_of",
    "trial_status",
]


def json_text(row: dict[str, Any]) -> str:
    """One JSON line of a report: numpy scalars as numbers, NaN and inf as JSON's NaN/Infinity, the rest as text."""
    return json.dumps(row, default=_plain)


def _plain(value: Any) -> Any:
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    return str(value)


def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a result log; a torn or damaged line is skipped."""
    path = Path(path)
    return parse_rows(path.read_text()) if path.is_file() else []


def parse_rows(text: str, where: str | None = None) -> list[dict[str, Any]]:
    """The rows of a result log's text; a torn or damaged line is skipped. With ``where`` (the log's location), the
    lines skipped but a last one without its newline (a report being written) are named in one warning."""
    rows, skipped = [], []
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        elif line.strip() and number < len(lines):
            skipped.append((number, line))
    if skipped and where is not None:
        number, line = skipped[0]
        _log.warning("%s: skipped %d line(s) that are not report rows (JSON objects), the first line %d: %.60r",
                     where, len(skipped), number, line)  # fmt: skip
    return rows


def intact_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The leading rows of a log whose steps rise (a report each): what a resume keeps of it."""
    out: list[dict[str, Any]] = []
    for row in rows:
        step = row.get("step")
        if not isinstance(step, int) or (out and step <= out[-1]["step"]):
            break
        out.append(row)
    return out


def append_row(path: str | os.PathLike, row: dict[str, Any]) -> None:
    """Append one JSON line to the log file ``path`` (the file only grows; a torn last line is cut first)."""
    path = Path(path)
    LocalStore(path.parent).append_log(path.name, (json_text(row) + "\n").encode("utf-8"))


def cut_log(path: str | os.PathLike, keep: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """Rewrite a log (atomically) with its intact rows for which ``keep(row)``; return the rows kept."""
    path = Path(path)
    rows = intact_rows(read_rows(path))
    kept = [r for r in rows if keep(r)]
    if path.exists() and (len(kept) != len(rows) or len(rows) != len(read_rows(path)) or _torn(path)):
        text = "".join(json_text(r) + "\n" for r in kept)
        atomic_write(path, lambda p: p.write_text(text))
    return kept


def _torn(path: Path) -> bool:
    data = path.read_bytes()
    return bool(data) and not data.endswith(b"\n")


def cut_text(text: str | None, keep: Callable[[dict[str, Any]], bool]) -> tuple[list[dict[str, Any]], str | None]:
    """:func:`cut_log` of a log's ``text`` (None: no log): the intact rows for which ``keep(row)``, and the text to
    write back whole (None when the log stays as it is: nothing cut, nothing out of order, no torn line)."""
    rows = parse_rows(text or "")
    intact = intact_rows(rows)
    kept = [r for r in intact if keep(r)]
    if text is None or (len(kept) == len(intact) == len(rows) and (not text or text.endswith("\n"))):
        return kept, None
    return kept, "".join(json_text(r) + "\n" for r in kept)


def seconds_of(rows: list[dict[str, Any]]) -> float:
    """The training time a log's rows hold: the last row's ``time_total_s`` (0 without rows or without one). A
    trial that continues in a new driver starts its clock there."""
    seconds = rows[-1].get("time_total_s") if rows else None
    return float(seconds) if isinstance(seconds, int | float) else 0.0


def finished(rows: list[dict[str, Any]], max_steps: int, target_r2: float | None = None) -> bool:
    """Whether a trial whose log holds ``rows`` has nothing left to train at these stop settings: it reached
    ``max_steps`` or its ``target_r2``. A higher ``max_steps`` than the one it ran with re-opens it."""
    if not rows:
        return False
    last = rows[-1]
    step = last.get("step")
    if isinstance(step, int) and step >= max_steps:
        return True
    r2 = last.get("r2")
    return target_r2 is not None and isinstance(r2, int | float) and math.isfinite(r2) and r2 >= target_r2


def ended(rows: list[dict[str, Any]], max_steps: int, target_r2: float | None = None) -> bool:
    """Whether a trial has nothing left to train: :func:`finished` at these stop settings, or its loss went
    non-finite (its last row holds :data:`ERROR_KEY`)."""
    return finished(rows, max_steps, target_r2) or bool(rows and rows[-1].get(ERROR_KEY))


def last_step(path: str | os.PathLike, chunk: int = 1 << 16) -> int | None:
    """The step of the last whole row of a log (reads only its tail), or None when it holds none."""
    row = last_row(path, chunk)
    return None if row is None else row["step"]


def last_row(path: str | os.PathLike, chunk: int = 1 << 16) -> dict[str, Any] | None:
    """The last whole row of a log that has a step (reads only its tail), or None when it holds none."""
    path = Path(path)
    if not path.is_file():
        return None
    with path.open("rb") as f:
        end = f.seek(0, os.SEEK_END)
        f.seek(max(0, end - chunk))
        tail = f.read()
    return last_row_in(tail)


def last_row_in(tail: bytes) -> dict[str, Any] | None:
    """The last whole row that has a step in a log's content, or its tail (a first line cut by where the tail
    starts is skipped, as a torn last line is); None when it holds none."""
    lines = tail.split(b"\n")
    for line in reversed(lines[:-1] if not tail.endswith(b"\n") else lines):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            return row
    return None


def trial_status(
    rows: list[dict[str, Any]], max_steps: Any, target_r2: Any, *, error: bool, stopped: bool, live: bool
) -> str:
    """A trial's status from its intact ``rows`` and its stop settings: TERMINATED once its log reaches its stop
    (or its scheduler stopped it, ``stopped``), ERROR when its loss went non-finite (:data:`ERROR_KEY`) or it
    failed for good (``error``), PENDING before its first report, else RUNNING while a live driver writes the run
    (``live``) and INTERRUPTED when none does."""
    if rows and rows[-1].get(ERROR_KEY):
        return "ERROR"
    if isinstance(max_steps, int) and finished(rows, max_steps, target_r2):
        return "TERMINATED"
    if error:
        return "ERROR"
    if rows and stopped:
        return "TERMINATED"
    if not rows:
        return "PENDING"
    return "RUNNING" if live else "INTERRUPTED"


def failure_count(error: Any) -> int:
    """How often a trial failed in its last driver, from its parsed error.json (0 without one; 1 for one written
    before the count was kept)."""
    if not isinstance(error, dict):
        return 0
    count = error.get("failures", 1)
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 1
