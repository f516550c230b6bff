"""Reads a run directory (finished, running or interrupted; local or remote) into one tidy DataFrame.

One row per trial per report. Only JSON is read (the run marker, Ray's experiment state, each trial's
params.json and result.json): nothing is unpickled, and a directory ablate did not write is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from ablate.grids import axis_text
from ablate.runner import RUN_MARKER, RunError

__all__ = ["RunReader", "load_results", "export_results"]

#: Columns that lead the table, in this order (when present).
LEAD_COLUMNS = ["trial_id", "status", "seed", "training_iteration", "step", "samples_seen", "time_total_s", "r2"]
#: Ray bookkeeping left out of the table.
_DROP = {"config", "date", "timestamp", "pid", "hostname", "node_ip", "done", "time_this_iter_s",
         "time_since_restore", "iterations_since_restore", "checkpoint_dir_name", "should_checkpoint"}


class RunReader:
    """Reads text files of a run directory on local disk or any pyarrow filesystem URI (s3://, gs://)."""

    def __init__(self, run_dir: str | Path):
        self.uri = str(run_dir)
        if "://" in self.uri and not self.uri.startswith("file://"):
            import pyarrow.fs as pafs

            self.fs, self.root = pafs.FileSystem.from_uri(self.uri)
        else:
            self.fs, self.root = None, str(Path(self.uri.removeprefix("file://")))

    def _join(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def read_text(self, *parts: str) -> str | None:
        """A file's text, or None if it does not exist."""
        path = self._join(*parts)
        if self.fs is None:
            p = Path(path)
            return p.read_text() if p.is_file() else None
        import pyarrow.fs as pafs

        if self.fs.get_file_info(path).type != pafs.FileType.File:
            return None
        with self.fs.open_input_stream(path) as f:
            return f.read().decode()

    def list_dirs(self, prefix: str = "") -> list[str]:
        """Names of sub-folders of the run directory starting with ``prefix``."""
        if self.fs is None:
            root = Path(self.root)
            return sorted(p.name for p in root.iterdir() if p.is_dir() and p.name.startswith(prefix))
        import pyarrow.fs as pafs

        infos = self.fs.get_file_info(pafs.FileSelector(self.root))
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory and i.base_name.startswith(prefix))

    def list_files(self, prefix: str) -> list[str]:
        """Names of files in the run directory starting with ``prefix``."""
        if self.fs is None:
            return sorted(p.name for p in Path(self.root).glob(prefix + "*") if p.is_file())
        import pyarrow.fs as pafs

        infos = self.fs.get_file_info(pafs.FileSelector(self.root))
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.File and i.base_name.startswith(prefix))

    def marker(self) -> dict[str, Any]:
        """The run marker; refuses a directory ablate did not write."""
        text = self.read_text(RUN_MARKER)
        if text is None:
            raise RunError(f"{self.uri}: not an ablate run directory (no {RUN_MARKER}); "
                           "ablate reads only runs it wrote itself")
        try:
            info = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RunError(f"{self.uri}/{RUN_MARKER}: damaged run marker ({exc})") from None
        if not isinstance(info, dict) or "grid" not in info:
            raise RunError(f"{self.uri}/{RUN_MARKER}: not an ablate run marker")
        return info

    def trial_states(self) -> dict[str, dict[str, Any]]:
        """trial_id → {status, params, failures} from the newest experiment state (JSON fields only).

        The newest is the one with the latest session timestamp in its name: Ray's storage sync rewrites
        every file at the end of a run, so modification times cannot tell.
        """
        names = self.list_files("experiment_state")
        if not names:
            return {}
        text = self.read_text(names[-1]) or "{}"
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return {}
        out = {}
        for entry in data.get("trial_data", []):
            info = json.loads(entry[0])
            meta = json.loads(entry[1]) if len(entry) > 1 else {}
            out[info["trial_id"]] = {"status": info.get("status", "UNKNOWN"),
                                     "params": info.get("evaluated_params", {}),
                                     "failures": meta.get("num_failures", 0)}
        return out

    def statuses(self) -> dict[str, str]:
        """trial_id → Ray status, from the newest experiment state."""
        return {k: v["status"] for k, v in self.trial_states().items()}

    def results(self, trial_dir: str) -> list[dict[str, Any]]:
        """A trial's reports from its result.json (a line being written right now is skipped)."""
        rows = []
        for line in (self.read_text(trial_dir, "result.json") or "").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return rows


def _axis_value(v: Any) -> Any:
    return axis_text(v) if isinstance(v, dict | list) else v


def load_results(run_dir: str | Path) -> pd.DataFrame:
    """One row per trial per report, with the grid axes as columns under their YAML names.

    Columns: trial_id, status, every grid axis, seed, training_iteration, step, samples_seen,
    time_total_s, r2, r2_lambda_<Λ>, r2_dim_<i>, mcc, loss, loss_floor, lambda_hat_<i>, and the other
    reported metrics. ``df.attrs`` holds the run marker (grid, scale, axes).
    """
    reader = RunReader(run_dir)
    info = reader.marker()
    axes = [a for a in info.get("axes", []) if a != "seed"]
    statuses = reader.statuses()
    records: list[dict[str, Any]] = []
    for name in reader.list_dirs("trial_"):
        params_text = reader.read_text(name, "params.json")
        params = json.loads(params_text) if params_text else {}
        trial_id = name.removeprefix("trial_")
        rows = reader.results(name)
        unique = {row.get("training_iteration", 0): row for row in rows}  # a replayed report supersedes
        for it in sorted(unique):
            row = unique[it]
            rec: dict[str, Any] = {"trial_id": trial_id, "status": statuses.get(trial_id, "UNKNOWN")}
            for k, v in row.items():
                if k in _DROP or k == "trial_id":
                    continue
                rec[k] = v
            for axis in axes:  # the trial's settings win over a metric of the same name
                rec[axis] = _axis_value(params.get(axis))
            rec["seed"] = params.get("seed")
            records.append(rec)
    df = pd.DataFrame.from_records(records)
    if not df.empty:
        lead = [c for c in ["trial_id", "status", *axes, *LEAD_COLUMNS[2:]] if c in df.columns]
        df = df[lead + [c for c in df.columns if c not in lead]]
        df = df.sort_values(["trial_id", "training_iteration"], kind="stable").reset_index(drop=True)
    df.attrs.update({"grid": info.get("grid"), "scale": info.get("scale"), "axes": axes,
                     "run_dir": str(run_dir), "marker": info})
    return df


def export_results(run_dir: str | Path, out: str | Path) -> Path:
    """Write the results table to ``out`` (.csv or .parquet); list-valued cells become JSON text in CSV."""
    out = Path(out)
    df = load_results(run_dir)
    if out.suffix == ".parquet":
        df.to_parquet(out, index=False)
    elif out.suffix == ".csv":
        flat = df.copy()
        for col in flat.columns:
            if flat[col].map(lambda v: isinstance(v, list | dict)).any():
                flat[col] = flat[col].map(lambda v: json.dumps(v) if isinstance(v, list | dict) else v)
        flat.to_csv(out, index=False)
    else:
        raise RunError(f"--out {out}: unknown format {out.suffix!r}; allowed: .csv, .parquet")
    return out
