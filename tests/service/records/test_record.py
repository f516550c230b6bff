"""A trial's record (ablate/service/records/record.py): the lock a trial holds while it trains."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ablate.service.records.record import TRIAL_LOCK, TrialRecord


def test_a_trial_waits_for_its_folder_s_lock_while_another_process_trains_it_and_says_so(tmp_path):
    """A search may suggest a setting its run is training right now (the same folder): the second trial waits for
    the first, saying so now and then, and takes the lock when the first lets it go (its process ends: the lock is
    an flock, so a dead holder never keeps it)."""
    trial = TrialRecord(tmp_path, "t")
    trial.make()
    holder = subprocess.Popen(
        [sys.executable, "-c", (
            "import sys, time\n"
            "from ablate.service.records.store.flock import PidLock\n"
            "PidLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(5)\n"
        ), str(Path(trial.folder) / TRIAL_LOCK)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout.readline().strip() == "held"
    said: list[tuple[str, float]] = []
    lock = trial.hold(lambda held, waited: said.append((str(held), waited)), say_every_s=0.5)
    try:
        assert holder.wait(timeout=30) == 0, "the holder ran to its end"
        assert len(said) >= 2 and said[-1][1] > said[0][1], said  # said at once, then again while it waited
        assert f"pid {holder.pid} on host" in said[0][0], said
    finally:
        lock.release()
