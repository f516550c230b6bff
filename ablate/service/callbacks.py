"""Driver-side Ray Tune callbacks of the runner (imported only once Ray is needed)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ray.tune import Callback

from ablate import ray_compat
from ablate.rundir import PACK_FILE, PARAMS_FILE, RESULT_FILE, TRIAL_PREFIX, atomic_write, member_id
from ablate.service.params import PACK_KEY, flat_params, pack_members
from ablate.service.snapshots import save_backup
from ablate.service.trust import sign_session

__all__ = ["ResultLog", "SnapshotKeeper", "append_row"]

_log = logging.getLogger("ablate.service.runner")


class SnapshotKeeper(Callback):
    """Back up each experiment snapshot Ray writes, so a driver killed mid-copy can still be resumed.

    Ray saves its snapshot into a staging folder in the driver's thread at every controller step, then copies
    it into the run directory in the background (not atomically). At the end of every step in which a trial
    started, reported, checkpointed or ended, this copies the staging folder's snapshot (complete by
    construction) into ``.ablate_snapshot/``, so the backup is never behind the last checkpoint and a resume
    from it replays at most one report period. Local run directories only. It keeps no paths of its own: it
    is pickled into ``tuner.pkl`` and must follow a run directory that is moved.

    It also signs every snapshot while Ray writes it (:meth:`get_state`), so that ``--resume`` unpickles only
    files ablate wrote (:mod:`ablate.service.trust`).
    """

    def __init__(self):
        self._dirty = False
        self._trials: list = []

    def __getstate__(self):
        return {"_dirty": False}  # nothing of a running driver goes into tuner.pkl

    def on_step_begin(self, iteration, trials, **info):
        self._trials = trials  # Ray's own list: the trials it adds in this step appear in it

    def get_state(self):
        """Ray calls this while it saves a snapshot (TuneController.save_to_dir), after writing the experiment
        and search algorithm state into its staging folder and before copying them into the run directory:
        the moment to sign them. Returns None: this callback keeps no state of its own."""
        self._sign()
        return None

    def on_experiment_end(self, trials, **info):
        """Ray's last snapshot has been written and copied (Ray waited for the copy): sign it, also for a driver
        that ran no step (a resumed run with nothing left to do)."""
        self._trials = trials
        self._sign()

    def _sign(self) -> None:
        trials = getattr(self, "_trials", None)  # absent in a keeper unpickled from an older tuner.pkl
        paths = ray_compat.snapshot_paths(trials) if trials else None
        if paths is not None:
            try:
                sign_session(*paths)
            except OSError as exc:
                self._warn(exc)

    def _warn(self, exc: OSError) -> None:
        if not getattr(self, "_warned", False):  # once per run, not at every step
            self._warned = True
            _log.warning("could not back up or sign the experiment snapshot: %s", exc)

    def _changed(self, **info):
        self._dirty = True

    on_trial_start = on_trial_restore = on_trial_result = on_checkpoint = _changed
    on_trial_complete = on_trial_error = on_trial_recover = _changed

    def on_step_end(self, iteration, trials, **info):
        if not trials or not self._dirty:
            return
        self._dirty = False
        paths = ray_compat.snapshot_paths(trials)
        if paths is None:  # remote storage: Ray's own sync
            return
        try:
            save_backup(*paths)
        except OSError as exc:  # a full disk must not stop the run: Ray's own snapshot still exists
            self._warn(exc)


def _cut_torn_line(path: Path, chunk: int = 1 << 16) -> None:
    """Drop a last line without its newline: the row a killed writer left half-written. Reads only the tail
    (one byte when the file is intact), so appending stays cheap however long the log grows."""
    with path.open("rb+") as f:
        end = f.seek(0, os.SEEK_END)
        if end == 0:
            return
        f.seek(end - 1)
        if f.read(1) == b"\n":
            return
        stop = end
        while stop > 0:
            start = max(0, stop - chunk)
            f.seek(start)
            cut = f.read(stop - start).rfind(b"\n")
            if cut >= 0:
                f.truncate(start + cut + 1)
                return
            stop = start
        f.truncate(0)


def append_row(path: Path, row: dict) -> None:
    """Append one JSON line to ``path`` (the file only ever grows; a torn last line is cut first)."""
    if path.exists():
        _cut_torn_line(path)
    with path.open("a") as f:
        f.write(json.dumps(row, cls=ray_compat.json_encoder()) + "\n")
        f.flush()


def _rows(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a torn last line
    return rows


def _last_logged_iteration(path: Path) -> int | None:
    its = [r.get("training_iteration") for r in _rows(path)]
    its = [i for i in its if isinstance(i, int)]
    return max(its) if its else None


def drop_rows_from(path: Path, iteration: int) -> None:
    """Keep only the rows of ``path`` before ``iteration`` (atomically): a trial resumed from a checkpoint older
    than its last report (e.g. stopped by Ctrl-C between a report and its checkpoint) reports those again."""
    kept = [
        r
        for r in _rows(path)
        if not (isinstance(r.get("training_iteration"), int) and r["training_iteration"] >= iteration)
    ]
    text = "".join(json.dumps(r, cls=ray_compat.json_encoder()) + "\n" for r in kept)
    atomic_write(path, lambda p: p.write_text(text))


class ResultLog(Callback):
    """Write each trial's params.json and result.json straight into its folder of a local run directory.

    Ray's own JSON logger writes into a staging folder that Ray copies over the run directory at every
    snapshot, truncating each file first: a driver killed during that copy leaves ``result.json`` empty or cut
    short, and a finished trial is never rerun to refill it. Here rows are only ever appended, in the driver's
    thread, before Ray records the checkpoint that follows them; a row cut by a kill is dropped on the next
    append and replayed by the resumed trial. params.json is written atomically.
    """

    def __init__(self):
        super().__init__()
        self._last_iteration: dict[str, int] = {}

    def on_trial_start(self, iteration, trials, trial, **info):
        folder = Path(ray_compat.trial_folder(trial))
        folder.mkdir(parents=True, exist_ok=True)
        members = pack_members(trial.config)
        if members:  # a pack: its folder keeps the checkpoints, each member gets a trial folder of its own
            ids = [member_id(trial.trial_id, i) for i in range(len(members))]
            _write_json(folder / PACK_FILE, {"members": ids})
            for i, params in enumerate(members):
                (folder.parent / f"{TRIAL_PREFIX}{ids[i]}").mkdir(exist_ok=True)
                _write_json(folder.parent / f"{TRIAL_PREFIX}{ids[i]}" / PARAMS_FILE, _member_label(params, trial, i))
            return
        _write_json(folder / PARAMS_FILE, flat_params(trial.config))  # the grid point's axes at the top level

    def on_trial_result(self, iteration, trials, trial, result, **info):
        folder = Path(ray_compat.trial_folder(trial))
        if isinstance(result.get("members"), list):  # a pack: one row per member that reported
            members = pack_members(trial.config)
            shared = {k: v for k, v in result.items() if k not in _PACK_RESULT_KEYS}
            for i, row in enumerate(result["members"]):
                if row is None:  # finished (or failed) in an earlier report
                    continue
                mid = member_id(trial.trial_id, i)
                config = _member_label(members[i], trial, i)
                self._append(
                    folder.parent / f"{TRIAL_PREFIX}{mid}" / RESULT_FILE,
                    mid,
                    {**shared, **row, "trial_id": mid, "pack": config[PACK_KEY], "config": config},
                )
            pack_row = {k: v for k, v in result.items() if k != "members"}  # what Ray's own readers look for
            self._append(folder / RESULT_FILE, trial.trial_id, pack_row)
            return
        if isinstance(result.get("config"), dict):  # the grid point's values at the top level, as in params.json
            result = {**result, "config": flat_params(result["config"])}
        self._append(folder / RESULT_FILE, trial.trial_id, result)

    def _append(self, path: Path, key: str, result: dict) -> None:
        it = result.get("training_iteration")
        if isinstance(it, int):
            last = self._last_iteration.get(key)
            if last is None:  # first report of this trial in this driver: what the log already holds
                last = _last_logged_iteration(path)
            if last is not None and it <= last:  # replayed from an earlier checkpoint: drop the rows it redoes
                drop_rows_from(path, it)
            self._last_iteration[key] = it
        append_row(path, result)


#: A pack trial's own result keys that are not a member's: the member rows and the pack-wide means.
_PACK_RESULT_KEYS = ("members", "r2", "loss", "mcc", "step", "done", "config", "trial_id")


def _member_label(params: dict, trial, index: int) -> dict:
    """A member's params.json: its settings and ``pack`` = ``<pack trial id>:<index>``."""
    return {**params, PACK_KEY: f"{trial.trial_id}:{index}"}


def _write_json(path: Path, data: dict) -> None:
    text = json.dumps(data, indent=2, sort_keys=True, cls=ray_compat.json_encoder())
    atomic_write(path, lambda p: p.write_text(text))
