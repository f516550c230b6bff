"""`python -m benchmarks --only object_store`: what a run costs on object storage, in requests and bytes.

A run on ``s3://`` writes through :class:`~ablate.service.records.store.CloudStore`, which has no append: its result
log is numbered entries written create-only and merged (:mod:`ablate.service.records.store.segments`), so a report
(:meth:`TrialRecord.append <ablate.service.records.record.TrialRecord.append>`) is one PUT of its own line, the first
of a process's reports also listing the log (and reading what is there); every 32 entries of one size class are
merged into one (each line uploaded about twice in all up to 1024 lines). This measures, against moto's S3 server on
127.0.0.1 (:mod:`benchmarks.s3_server`), for each operation a trial or ``ablate status`` makes:

- requests, counted per HTTP method in the server's log (one line a request) before and after each phase;
- bytes uploaded and downloaded, counted where the code hands them to the store or gets them from it (a wrapper
  around the CloudStore: the log's length after each append, the checkpoint's ``torch.save`` buffer, …);
- wall seconds, against the same operations on a :class:`~ablate.service.records.store.LocalStore` in a temporary
  folder. The S3 times are moto's (a Python server on the same cores), not a bucket's: a real S3's latency per
  request sets the time there, so only the counts and bytes carry over.

obstore's S3 client (the ``object_store`` crate) makes each read one GET (a missing file: one GET answered 404) and
each write one PUT, conditional where the store asks for it (a lease's create, renewals and release: ``If-None-Match``
and ``If-Match``); a file larger than its chunk size (5 MiB: a checkpoint) is a multipart upload (create, parts,
complete). A list is a GET of the bucket; deleting a folder lists it and deletes its objects in one bulk POST.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ablate.service.records.store import OVERWRITE, Got, PutMode, Store
from ablate.service.records.store.bucket import BucketStore
from benchmarks.s3_server import request_counts, s3_server

#: The HTTP methods the table gives a column each (obstore's S3 client uses no other here).
METHODS = ("GET", "HEAD", "PUT", "POST", "DELETE")
#: The reports whose own cost the table gives (as the log grows).
REPORTS_SHOWN = (1, 10, 100, 1000)
#: The latent dimension of the reports and of the checkpointed model (the reference setting's).
D = 10


class CountingStore(BucketStore):
    """A store that passes every call to ``inner`` and counts the bytes written (``up``) and read (``down``)."""

    def __init__(self, inner: Store):
        self.inner, self.uri, self.up, self.down = inner, inner.uri, 0, 0

    def join(self, *parts: str) -> str:
        return self.inner.join(*parts)

    def get(self, key: str) -> Got | None:
        got = self.inner.get(key)
        self.down += 0 if got is None else len(got.data)
        return got

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        self.up += len(data)
        return self.inner.put(key, data, mode)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def delete_many(self, keys: builtins.list[str]) -> None:
        self.inner.delete_many(keys)

    def delete_tree(self, prefix: str) -> None:
        self.inner.delete_tree(prefix)

    def list(self, prefix: str = "", *, dirs: bool) -> builtins.list[str]:
        return self.inner.list(prefix, dirs=dirs)

    def _keys(self, prefix: str) -> builtins.list[str]:
        return self.inner._keys(prefix)  # type: ignore[attr-defined]

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)


def report_row(step: int, trial_id: str, config: dict[str, Any], d: int = D) -> dict[str, Any]:
    """A report with the keys and sizes of a real one (a smoke trial's result.json, at latent dimension ``d``):
    about 2.3 kB as a JSON line at d = 10."""
    x = (step % 97) / 97
    row: dict[str, Any] = {
        "trial_id": trial_id, "date": "2026-11-28_13-49-42", "pid": 28785, "hostname": "node-1",
        "node_ip": "192.0.2.2", "iterations_since_restore": step // 100, "config": config, "step": step,
        "samples_seen": step * config["batch_size"], "loss": 3.4236245155334473 - x, "lr_now": 0.0001,
        "prefetch": False, "r2": 0.607986302447607 + x / 3,
    }  # fmt: skip
    row.update({f"r2_dim_{i}": 0.38251278641040276 + i / 100 for i in range(d)})
    row.update({"r2_lambda_5": 0.7609163920895632, "r2_lambda_25": 0.6805297288428549, "mcc": 0.7007009413316125,
                "eval_loss": 3.4228312969207764, "true_latent_loss": 2.7957639694213867,
                "loss_floor": 0.15438289940357208, "loss_gap": 3.2684483975172043})  # fmt: skip
    row.update({f"lambda_hat_{i}": 0.7331348061561584 + i for i in range(d)})
    row.update({"lambda_max_rel_error": 0.9902248692512512, "lambda_rank_corr": 0.8787878787878788,
                "sim_pos_mean": 0.9996760541485588, "sim_neg_mean": 0.984138649856252, "sim_overlap": 0.95,
                "nn_is_positive": 0.6875, "sim_pos_hist": [0.0] * 39 + [1.0],
                "sim_neg_hist": [0.0] * 38 + [0.05, 0.95], "g_cond_threshold": 1.2778146260142718,
                "g_cond_pools": 1.0, "g_cond_layer_0": 1.2741238524068526, "g_cond_layer_1": 1.2177120450799264,
                "g_cond_layer_2": 1.1247106825443234, "g_linear_r2": 0.8394953848849761, "done": False,
                "time_this_iter_s": 0.015189653386187274, "time_total_s": 0.028929710388183594 * step,
                "time_since_restore": 0.028929710388183594 * step, "timestamp": 1795873782 + step,
                "training_iteration": step // 100})  # fmt: skip
    return row


def finished_cover(reports: int) -> list[tuple[int, int]]:
    """The entry a finished trial's log of ``reports`` lines is, appended one at a time and made one entry at its
    end (:meth:`~ablate.service.records.record.TrialRecord.compact`): one entry reaching past every entry written."""
    return [(1, appended_cover(reports)[-1][1] + 1)] if reports else []


def appended_cover(reports: int) -> list[tuple[int, int]]:
    """The entries (first, last) a log of ``reports`` lines appended one at a time in one process ends with: each
    line an entry, :data:`~ablate.service.records.store.segments.FAN_OUT` entries of one size class merged into one
    (the writer's own rule, replayed without a store)."""
    from ablate.service.records.store import segments

    cover: list[tuple[int, int]] = []
    for n in range(1, reports + 1):
        cover.append((n, n))
        while len(cover) >= segments.FAN_OUT:
            run = cover[-segments.FAN_OUT :]
            if len({segments._size_class(a, b) for a, b in run}) != 1:
                break
            cover[-segments.FAN_OUT :] = [(run[0][0], run[-1][1])]
    return cover


def trial_config(seed: int) -> dict[str, Any]:
    """A trial's settings as its params.json and its reports' ``config`` hold them (the reference setting)."""
    return {"grid": "bench", "scale": "reference", "loss": "aninfonce", "concentration": "5/25", "generator_seed": 0,
            "latent_dim": D, "batch_size": 1000, "max_steps": 100_000, "report_every": 100, "seed": seed}  # fmt: skip


def reference_state() -> dict[str, Any]:
    """A checkpoint's state at the reference model's size (the encoder_widths 10-50-50-50-50-10 × d at d = 10,
    about 855 000 weights, with Λ̂, Adam's two moments after one step, the data RNG and the config: 10.3 MB): :meth:`Experiment.state_dict
    <ablate.core.experiment.Experiment.state_dict>` of a small-batch, small-pool RunConfig (neither changes it)."""
    from ablate.config import RunConfig
    from ablate.core.experiment import Experiment

    exp = Experiment(
        RunConfig(latent_dim=D, batch_size=32, eval_samples=256, generator_cond_samples=200, generator_seed=0)
    )
    exp.train(1)
    return exp.state_dict()


class _Meter:
    """Requests (from the server's log) and bytes (from the counting store) between :meth:`phase`'s start and end."""

    def __init__(self, log_dir: Path, store):
        self.log_dir, self.store = log_dir, store

    @contextlib.contextmanager
    def phase(self, into: dict[str, Any]) -> Iterator[None]:
        before, up, down = request_counts(self.log_dir), self.store.up, self.store.down
        t = time.perf_counter()
        yield
        into["s3_s"] = time.perf_counter() - t
        counts = request_counts(self.log_dir) - before
        into.update({m: counts.get(m, 0) for m in METHODS})
        into["requests"] = sum(counts.values())
        into["up_bytes"], into["down_bytes"] = self.store.up - up, self.store.down - down


def _timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _series(meter: _Meter, ops: list[tuple[Callable[[], Any], Callable[[], Any]]]) -> list[tuple[dict, float]]:
    """Each (on S3, locally) pair of ``ops`` run in turn: its S3 measurement and its local seconds."""
    out = []
    for on_s3, on_disk in ops:
        s3: dict[str, Any] = {}
        with meter.phase(s3):
            on_s3()
        out.append((s3, _timed(on_disk)))
    return out


def _sum(each: list[tuple[dict, float]]) -> tuple[dict, float]:
    """The S3 measurements and local seconds of several operations, added up."""
    return {k: sum(s3[k] for s3, _ in each) for k in each[0][0]}, sum(local for _, local in each)


def _saved(state: dict[str, Any]) -> bytes:
    """``state`` as a checkpoint holds it (what :func:`~ablate.service.records.trial.write_checkpoint` uploads)."""
    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _row(what: str, ops: int, s3: dict[str, Any], local_s: float) -> dict[str, Any]:
    """A table row: totals over the ``ops`` operations a phase made, and per operation."""
    return {
        "operation": what,
        "ops": ops,
        "requests": s3["requests"],
        "per_op": s3["requests"] / ops,
        **{m: s3[m] for m in METHODS},
        "up_bytes": s3["up_bytes"],
        "up_per_op": s3["up_bytes"] / ops,
        "down_bytes": s3["down_bytes"],
        "s3_ms_per_op": 1e3 * s3["s3_s"] / ops,
        "local_ms_per_op": 1e3 * local_s / ops,
        "ratio": s3["s3_s"] / local_s if local_s > 0 else float("nan"),
    }


def _on_both(meter: _Meter, remote: Any, local: Any, what: str, ops: int, run: Callable[[Any], Any]) -> dict:
    """``run(store)`` on the S3 store, measured, then on the local one, timed."""
    s3: dict[str, Any] = {}
    with meter.phase(s3):
        run(remote)
    return _row(what, ops, s3, _timed(lambda: run(local)))


def bench_object_store(reports: int = 100, checkpoints: int = 10, trials: int = 4) -> list[dict[str, Any]]:
    """Requests, bytes and wall time of a trial's and a status read's operations on moto's S3 against a local
    folder (see the module's note); a row per operation. Needs moto's server (RuntimeError without it)."""
    from ablate.service.records.reader import RunReader
    from ablate.service.records.record import TRIAL_LOCK, TrialRecord
    from ablate.service.records.rundir import RESULT_FILE, RUN_MARKER
    from ablate.service.records.store import CloudStore, LocalStore
    from ablate.service.records.store.lease import Lease
    from ablate.service.records.store.segments import entry_name
    from ablate.service.records.trial import write_checkpoint
    from ablate.service.records.trial_log import json_text

    state = reference_state()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ablate-object-store-") as tmp, s3_server(tmp) as query:
        log_dir = Path(tmp)
        run = f"s3://runs/bench/{uuid.uuid4().hex[:8]}?{query}"
        remote = CountingStore(CloudStore(run))
        local = LocalStore(log_dir / "local-run")
        meter = _Meter(log_dir, remote)
        remote.write_text("warm-up.txt", "obstore's S3 client is made on its first request")  # not measured

        trial_id, config = "seed=0", trial_config(0)
        s3_record, local_record = TrialRecord(remote, trial_id), TrialRecord(local, trial_id)
        # -- the trial's params.json, written first (it makes the local folder)
        rows.append(_on_both(meter, s3_record, local_record, "params.json", 1, lambda r: r.write_params(config)))

        # -- a trial's reports: each one PUT of its line (the first also lists the log), merges every 32 entries
        new = [report_row(100 * (n + 1), trial_id, config) for n in range(reports)]
        each = _series(meter, [(lambda r=r: s3_record.append(r), lambda r=r: local_record.append(r)) for r in new])
        log_bytes = len("".join(json_text(r) + "\n" for r in new).encode())
        rows.append(_row(f"report, mean of {reports} (log of {log_bytes} B at the end)", reports, *_sum(each)))
        shown = sorted({n for n in REPORTS_SHOWN if n <= reports} | {reports})
        rows.extend(_row(f"report {n} (log {n} rows)", 1, *each[n - 1]) for n in shown)
        rows.append(_on_both(meter, s3_record, local_record, "the log made one entry at the trial's end", 1,
                             lambda r: r.compact()))  # fmt: skip

        # -- checkpoints at the reference model's size, keeping 2: each lists the folder and, from the third on,
        # deletes the oldest (a list and a bulk delete)
        size = len(_saved(state))
        each = _series(
            meter,
            [(lambda k=k: write_checkpoint(s3_record.checkpoints, {**state, "step": k}, keep=2, logged=k),
              lambda k=k: write_checkpoint(local_record.checkpoints, {**state, "step": k}, keep=2, logged=k))
             for k in range(100, 100 * checkpoints + 1, 100)],
        )  # fmt: skip
        rows.append(_row(f"checkpoint 1-{len(each[:2])} ({size} B, nothing to prune)", len(each[:2]), *_sum(each[:2])))
        if each[2:]:
            rows.append(_row(f"checkpoint 3-{checkpoints} (keep 2: prunes 1)", len(each[2:]), *_sum(each[2:])))

        # -- the trial's lease (its lock in a bucket): acquire (a read, a create-only write), three renewals and the
        # release (a write matched on the version last written, each)
        def lease(store) -> None:
            held = Lease(store, f"trial_{trial_id}/{TRIAL_LOCK}").acquire()
            for _ in range(3):
                held.renew()
            held.release()

        rows.append(_on_both(meter, remote, local, "lease: acquire + 3 renews + release", 1, lease))

        # -- `ablate status`: RunReader(uri).trial_states() of a run of `trials` trials, each with a log of `reports`
        def make_run(store) -> None:
            configs = {f"seed={i}": trial_config(i) for i in range(trials)}
            marker = {"grid": "bench", "scale": "reference", "axes": ["seed"], "n_trials": trials, "runs": [],
                      "points": configs}  # fmt: skip
            store.write_text(RUN_MARKER, json.dumps(marker, indent=1))
            for tid, cfg in configs.items():
                record = TrialRecord(store, tid)
                record.write_params(cfg)
                lines = [(json_text(report_row(100 * (n + 1), tid, cfg)) + "\n").encode() for n in range(reports)]
                if isinstance(store, LocalStore):
                    record.rewrite([report_row(100 * (n + 1), tid, cfg) for n in range(reports)])
                    continue
                for first, last in finished_cover(reports):  # what a finished trial's log is
                    store.put(
                        f"{record.name}/{RESULT_FILE}.d/{entry_name(first, last)}", b"".join(lines[first - 1 : last])
                    )

        # -- an Optuna search's study: a trial asked (6 settings), told `reports` intermediate values, and told its
        # value, through the journal in the bucket (optuna.journal.d/) against the same journal in a local file
        search_trials = 10

        def search(storage) -> None:
            import optuna

            optuna.logging.set_verbosity(optuna.logging.WARNING)
            study = optuna.create_study(study_name="bench", storage=storage, direction="maximize",
                                        load_if_exists=True)  # fmt: skip
            for _ in range(search_trials):
                trial = study.ask()
                x = sum(trial.suggest_float(f"x{i}", 0.0, 1.0) for i in range(6))
                for step in range(reports):
                    trial.report(x * step, step)
                study.tell(trial, x)

        from ablate.service.records.rundir import STUDY_JOURNAL
        from ablate.service.records.study import StoreJournal, flush_study, study_storage

        journal = StoreJournal(remote)

        def on_s3() -> None:
            from optuna.storages import JournalStorage

            storage = JournalStorage(journal)
            search(storage)
            flush_study(storage)

        s3: dict[str, Any] = {}
        with meter.phase(s3):
            on_s3()
        study_bytes = len(remote.inner.read_log(STUDY_JOURNAL) or b"")
        rows.append(
            _row(
                f"search trial: 6 settings, {reports} reports, told (study {study_bytes} B at the end)",
                search_trials,
                s3,
                _timed(lambda: search(study_storage(local.root))),
            )
        )

        status_remote = CountingStore(CloudStore(f"s3://runs/bench/{uuid.uuid4().hex[:8]}?{query}"))
        status_local = LocalStore(log_dir / "local-status")
        make_run(status_remote)
        make_run(status_local)
        meter.store = status_remote
        rows.append(
            _on_both(
                meter, status_remote, status_local, f"status read ({trials} trials, {reports}-row logs)", 1,
                lambda store: RunReader(store).trial_states(),
            )
        )  # fmt: skip
    return rows


def versions() -> str:
    """The versions the counts depend on: obstore's S3 client makes the requests, moto answers them."""
    import importlib.metadata as md

    return f"obstore {md.version('obstore')} (its S3 client makes the requests), moto {md.version('moto')}"


def bench_driver_capacity(delay_s: float = 0.03, trials: int = 20, reports: int = 200) -> dict[str, Any]:
    """How many trials reporting once a second the driver keeps current with every request ``delay_s`` slower (a
    proxy on 127.0.0.1 in front of moto's server, :mod:`benchmarks.s3_proxy`): ``reports`` reports appended in
    turn to ``trials`` trials' logs, as the driver's result log appends them (one thread, one after another), after
    each trial's first report (which also lists its log). Reports a second is that number of trials."""
    from ablate.service.records.record import TrialRecord
    from ablate.service.records.store import CloudStore
    from benchmarks.s3_proxy import s3_proxy

    with tempfile.TemporaryDirectory(prefix="ablate-capacity-") as tmp, s3_server(tmp) as query:
        with s3_proxy(query, delay_s=delay_s) as slow:
            store = CloudStore(f"s3://runs/capacity/{uuid.uuid4().hex[:8]}?{slow}")
            records = [TrialRecord(store, f"seed={i}") for i in range(trials)]
            for i, record in enumerate(records):
                record.append(report_row(100, record.id, trial_config(i)))
            before = sum(slow.counts.values())
            t = time.perf_counter()
            for n in range(reports):
                record = records[n % trials]
                record.append(report_row(200 + 100 * (n // trials), record.id, trial_config(n % trials)))
            wall = time.perf_counter() - t
            made = sum(slow.counts.values()) - before
    return {"delay_ms": 1000 * delay_s, "reports": reports, "requests_per_report": made / reports,
            "ms_per_report": 1000 * wall / reports, "trials_kept_current_at_1_report_per_s": reports / wall}  # fmt: skip
