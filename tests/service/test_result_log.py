"""ablate's result log: a trial replayed from an older checkpoint never leaves a duplicated report."""

from __future__ import annotations

import json

from ablate.service.callbacks import _last_logged_iteration, drop_rows_from


def test_rows_from_a_replayed_iteration_on_are_dropped(tmp_path):
    path = tmp_path / "result.json"
    rows = [{"training_iteration": i, "step": 5 * i} for i in range(1, 5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"training_iteration": 5, "st')  # torn last line
    assert _last_logged_iteration(path) == 4
    drop_rows_from(path, 3)  # the trial resumed from the checkpoint after iteration 2 and reports 3 again
    assert [json.loads(line)["training_iteration"] for line in path.read_text().splitlines()] == [1, 2]
    assert _last_logged_iteration(tmp_path / "missing.json") is None
