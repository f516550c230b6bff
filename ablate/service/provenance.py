"""Record what produced a run in its directory (:mod:`ablate.provenance` collects it), at start and each resume."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ablate.provenance import collect, distributions, science_changes
from ablate.rundir import ENVIRONMENT_FILE, PROVENANCE_FILE, RunReader, atomic_write

__all__ = ["record_provenance"]

_log = logging.getLogger("ablate.provenance")


def record_provenance(run_dir: str, event: str) -> list[str]:
    """Append this process's provenance to ``RUN_DIR/ablate_provenance.jsonl`` and write the installed
    distributions beside it; on a resume, warn (and return) what changed since the last record that can change
    the run's numbers (``torch: 2.13.0 -> 2.14.1``)."""
    before = RunReader(run_dir).provenance()
    record = collect(event=event)
    changes = science_changes(before[-1], record) if before and event == "resume" else []
    if changes:
        _log.warning(
            "--resume: the code that continues this run differs from the code that wrote it (%s); the resumed "
            "reports may not equal a run that never stopped",
            "; ".join(changes),
        )
    path = Path(run_dir, PROVENANCE_FILE)
    text = "".join(json.dumps(r) + "\n" for r in [*before, record])
    atomic_write(path, lambda p: p.write_text(text))
    env = distributions()
    atomic_write(Path(run_dir, ENVIRONMENT_FILE), lambda p: p.write_text(env))
    return changes
