"""How an Optuna grid with a target picks its best configuration: the fewest seconds of training to the target."""

from __future__ import annotations

import json

from ablate.service.execution.search import seconds_to_target
from ablate.service.records.trial_log import read_rows


def _trial(tmp_path, name, rows, torn=False):
    d = tmp_path / name
    d.mkdir()
    text = "".join(json.dumps(r) + "\n" for r in rows) + ('{"r2": 0.9' if torn else "")
    (d / "result.json").write_text(text)
    return d


def test_seconds_to_target_is_the_first_report_that_reaches_it(tmp_path):
    slow = _trial(
        tmp_path,
        "a",
        [
            {"r2": 0.5, "time_total_s": 10, "step": 100},
            {"r2": 0.991, "time_total_s": 90, "step": 900},
            {"r2": 0.995, "time_total_s": 99, "step": 990},
        ],
    )
    fast = _trial(tmp_path, "b", [{"r2": 0.99, "time_total_s": 40, "step": 400}], torn=True)
    never = _trial(tmp_path, "c", [{"r2": 0.98, "time_total_s": 500, "step": 5000}])
    log = lambda trial: read_rows(trial / "result.json")  # noqa: E731 - the rows save_best reads (torn line skipped)
    assert seconds_to_target(log(slow), "r2", 0.99) == (90.0, 900)
    assert seconds_to_target(log(fast), "r2", 0.99) == (40.0, 400)
    assert seconds_to_target(log(never), "r2", 0.99) is None
    assert seconds_to_target(log(tmp_path / "missing"), "r2", 0.99) is None
