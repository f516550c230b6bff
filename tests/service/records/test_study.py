"""An Optuna search's study on object storage (ablate.service.records.study): Optuna's journal as the store's
append-only log (numbered entries in a bucket), appended to by its one writer an operation at a time, fenced against
an earlier driver, read back by a fresh driver and by Optuna's own file backend, against moto's S3 server, this
process's memory (``memory://``) and, for a cut last line, a local disk."""

from __future__ import annotations

import logging
import pickle
import re
import uuid

import optuna
import pytest
import s3_server
from optuna.storages.journal import JournalFileBackend, JournalStorage
from s3_server import fresh_s3_uri

from ablate.service.records import study as study_mod
from ablate.service.records.rundir import DRIVER_LOCK, OPTUNA_DB, STUDY_JOURNAL, has_study, study_file
from ablate.service.records.store import LocalStore, as_store, open_store
from ablate.service.records.store.lease import LeaseLost
from ablate.service.records.store.segments import folder_of
from ablate.service.records.study import StoreJournal, flush_study, load_study, study_storage

s3_query = s3_server.s3_query  # the module's S3 server (a fixture)

optuna.logging.set_verbosity(optuna.logging.WARNING)

ENTRIES = folder_of(STUDY_JOURNAL)  # optuna.journal.d: the journal's entries in a bucket


def _memory_uri(name: str) -> str:
    """A fresh run directory in this process's memory (a :class:`MemoryStore`, one per URI in a process)."""
    return f"memory://{name}-{uuid.uuid4().hex[:8]}/lab/run"


@pytest.fixture(params=["s3", "memory"])
def run_uri(request) -> str:
    """A fresh run directory on moto's S3 server, or in this process's memory."""
    if request.param == "memory":
        return _memory_uri("study")
    return fresh_s3_uri(request.getfixturevalue("s3_query"))


def _search(storage, n: int = 4, *, finish: bool = True) -> optuna.Study:
    """A new study "tune" with ``n`` trials (:func:`_trials`)."""
    return _trials(optuna.create_study(study_name="tune", storage=storage, direction="maximize"), n, finish=finish)


def _trials(study: optuna.Study, n: int, *, finish: bool = True) -> optuna.Study:
    """``study`` with ``n`` more trials: two settings each, three reports, told COMPLETE (the last one left RUNNING
    unless ``finish``)."""
    for i in range(n):
        trial = study.ask()
        x, width = trial.suggest_float("x", 0.0, 1.0), trial.suggest_categorical("width", [16, 32])
        for step in range(3):
            trial.report(x * step, step)
        if finish or i < n - 1:
            study.tell(trial, x + width / 100)
    return study


def _view(study: optuna.Study) -> list[tuple]:
    return [
        (t.number, t.state.name, t.params, t.values, dict(t.intermediate_values), t.distributions)
        for t in study.get_trials(deepcopy=False)
    ]


def _fresh(uri: str) -> optuna.Study:
    """The study as a driver in another process reads it: through a store object of its own."""
    return optuna.load_study(study_name="tune", storage=JournalStorage(StoreJournal(open_store(uri))))


def test_a_study_on_a_store_reads_back_whole_in_a_fresh_driver(run_uri):
    """Written through one storage, read through another made later (as a resumed driver does): the same trials,
    settings, values and reports; the store holds the journal's entries (optuna.journal.d/), no SQLite file, and
    at the search's end (flush_study) one entry, which is the journal as it is."""
    assert not has_study(run_uri) and study_file(run_uri) == STUDY_JOURNAL
    storage = study_storage(run_uri)
    first = _search(storage)
    store = as_store(run_uri)
    assert has_study(run_uri) and store.list(dirs=False) == [] and store.list(dirs=True) == [ENTRIES]
    assert len(store.list(ENTRIES, dirs=False)) > 1
    again = load_study(run_uri, "tune")
    assert again is not None and _view(again) == _view(first) == _view(_fresh(run_uri))
    assert again.best_value == first.best_value
    assert load_study(run_uri, "another name") is None
    flush_study(storage)  # the driver's end: the journal made one entry
    (entry,) = store.list(ENTRIES, dirs=False)
    assert store.read_bytes(f"{ENTRIES}/{entry}") == open_store(run_uri).read_log(STUDY_JOURNAL)
    assert _view(_fresh(run_uri)) == _view(first)


def test_the_journal_opens_with_optuna_s_own_file_backend(tmp_path, run_uri):
    """A downloaded optuna.journal (the lines read_log gives; after flush_study, the one entry) is Optuna's
    JournalFileBackend format, line for line: Optuna itself reads it."""
    storage = study_storage(run_uri)
    study = _search(storage, finish=False)
    flush_study(storage)  # the running trial's last reports wait for an append (as at a driver's end)
    path = tmp_path / STUDY_JOURNAL
    path.write_bytes(open_store(run_uri).read_log(STUDY_JOURNAL))
    theirs = optuna.load_study(study_name="tune", storage=JournalStorage(JournalFileBackend(str(path))))
    assert _view(theirs) == _view(study)
    assert [t.state.name for t in theirs.trials] == ["COMPLETE"] * 3 + ["RUNNING"]


def test_a_search_uploads_its_journal_about_once_in_one_request_an_operation(run_uri, monkeypatch):
    """Each operation appends only its own line (one PUT of a new entry in a bucket; entries merged as they pile
    up, the whole made one entry at the end): the bytes a search of 30 trials uploads are a small multiple of its
    journal, never the journal again at each operation (which was 71x it here), and its requests at most one an
    operation."""
    store = open_store(run_uri)
    put = {"requests": 0, "bytes": 0}
    plain_put = store.put

    def counted(key, data, *args, **kwargs):
        put["requests"] += 1
        put["bytes"] += len(data)
        return plain_put(key, data, *args, **kwargs)

    monkeypatch.setattr(store, "put", counted)
    storage = JournalStorage(StoreJournal(store))
    _search(storage, n=30)
    flush_study(storage)
    journal = open_store(run_uri).read_log(STUDY_JOURNAL)
    operations = journal.count(b"\n")
    assert operations > 30 * 7  # the study, and each trial's creation, two settings, three reports and its end
    assert put["bytes"] < 4 * len(journal), (put, len(journal))
    assert put["requests"] < operations, (put, operations)


def test_only_intermediate_values_wait_for_the_next_append(monkeypatch):
    """A created trial, its settings and its end are appended at once (the log is then the whole journal); a report
    told to Optuna waits for the next of those, or FLUSH_S seconds, and flush_study appends it."""
    uri = _memory_uri("deferred")
    clock = [1000.0]
    monkeypatch.setattr(study_mod.time, "monotonic", lambda: clock[0])
    storage = study_storage(uri)
    study = optuna.create_study(study_name="tune", storage=storage, direction="maximize")
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    stored = lambda: open_store(uri).read_log(STUDY_JOURNAL).splitlines()  # noqa: E731 (another process's read)
    n_ops = len(stored())
    assert n_ops >= 3  # the study, the trial and its setting, each appended as made
    trial.report(0.5, 1)
    trial.report(0.6, 2)
    assert len(stored()) == n_ops  # waiting: the reports are in every trial's own result log too
    clock[0] += study_mod.FLUSH_S
    trial.report(0.7, 3)
    assert len(stored()) == n_ops + 3  # the oldest waited FLUSH_S: all three go up, in one append
    trial.report(0.8, 4)
    assert len(stored()) == n_ops + 3
    flush_study(storage)
    assert len(stored()) == n_ops + 4
    trial.report(0.9, 5)
    study.tell(trial, 0.9)  # a trial's end goes up at once, with the report before it
    assert len(stored()) == n_ops + 6
    assert dict(load_study(uri, "tune").trials[0].intermediate_values) == {1: 0.5, 2: 0.6, 3: 0.7, 4: 0.8, 5: 0.9}


def test_a_driver_that_lost_its_lease_appends_nothing():
    """Each append asks check() first: a driver whose lease was taken over raises LeaseLost and leaves the journal
    as the next driver may be writing it."""
    uri = _memory_uri("lost")
    _search(study_storage(uri), n=1)
    before = open_store(uri).read_log(STUDY_JOURNAL)
    lost = LeaseLost(as_store(uri).join(DRIVER_LOCK), "taken over")

    def check():
        raise lost

    study = optuna.load_study(study_name="tune", storage=study_storage(uri, check=check))
    with pytest.raises(LeaseLost):
        study.ask()
    assert open_store(uri).read_log(STUDY_JOURNAL) == before


def test_a_driver_that_another_took_over_from_stops_in_one_line_and_leaves_the_next_one_s_study(run_uri):
    """Two drivers of one run, each with a store of its own (two processes), neither asking a lease (no check):
    the second's first append writes the journal as one entry reaching past the first's entries; the first's
    appends after that land inside it (read past) or collide with the second's, and a collision is a LeaseLost in
    one line naming the journal, raised again at each later write, never retried. The second's study goes on
    intact, as a fresh driver reads it."""
    first = _search(JournalStorage(StoreJournal(open_store(run_uri))), n=2)
    second = _fresh(run_uri)  # resumed elsewhere: the study loaded, two more trials
    _trials(second, 2)
    with pytest.raises(LeaseLost) as lost:
        _trials(first, 1)  # the earlier driver carries on: its next trial's appends
    where = open_store(run_uri).join(STUDY_JOURNAL)
    assert str(lost.value).startswith(f"lost the lease {where}: another driver took over the run (")
    assert "\n" not in str(lost.value)
    with pytest.raises(LeaseLost, match=re.escape(where)):
        flush_study(first._storage)  # and at each write after it
    _trials(second, 1)
    flush_study(second._storage)
    fresh = _fresh(run_uri)
    assert _view(fresh) == _view(second) and len(fresh.trials) == 5
    assert [t.state.name for t in fresh.trials] == ["COMPLETE"] * 5


def test_a_cut_last_line_is_left_out_with_a_warning_and_written_away(tmp_path, caplog):
    """A journal whose last line has no newline (an append a killed writer cut, on a local disk): read without it,
    with one warning naming the journal; the next append leaves a journal Optuna's file backend reads."""
    store = LocalStore(tmp_path / "run")
    study = _search(JournalStorage(StoreJournal(store)), n=2)
    path = tmp_path / "run" / STUDY_JOURNAL
    with path.open("ab") as f:
        f.write(b'{"op_code": 4, "worker_id": "w", "study_id": 0, "dat')
    with caplog.at_level(logging.WARNING, logger="ablate.service.records.study"):
        again = optuna.load_study(study_name="tune", storage=JournalStorage(StoreJournal(store)))
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and str(path) in said[0] and "last line is cut" in said[0] and "\n" not in said[0], said
    assert _view(again) == _view(study)
    more = _trials(again, 1)
    theirs = optuna.load_study(study_name="tune", storage=JournalStorage(JournalFileBackend(str(path))))
    assert _view(theirs) == _view(more) and len(theirs.trials) == 3


def test_an_earlier_version_s_whole_journal_loads_and_is_taken_in_at_the_next_append(tmp_path, run_uri, caplog):
    """A run an earlier ablate wrote: the journal one object, optuna.journal (here with the cut last line an
    upload never left, read around as on disk). It loads (has_study, load_study); the search's next operation
    makes it the log's first entry and removes the object; a fresh driver reads every trial."""
    path = tmp_path / STUDY_JOURNAL
    old = _search(JournalStorage(JournalFileBackend(str(path))), n=2)
    store = as_store(run_uri)
    store.write_bytes(STUDY_JOURNAL, path.read_bytes() + b'{"op_code": 4, "wor')
    assert has_study(run_uri) and store.list(dirs=True) == []
    with caplog.at_level(logging.WARNING, logger="ablate.service.records.study"):
        loaded = load_study(run_uri, "tune")
    assert _view(loaded) == _view(old) and len(caplog.records) == 1
    more = _trials(optuna.load_study(study_name="tune", storage=study_storage(run_uri)), 1)
    assert not store.exists(STUDY_JOURNAL) and store.list(dirs=True) == [ENTRIES]
    assert _view(_fresh(run_uri)) == _view(more) and len(more.trials) == 3


def test_a_damaged_journal_is_an_error_naming_it_never_a_study_read_in_part(run_uri):
    """A line that is not JSON before the last one: a ValueError naming the journal."""
    store = as_store(run_uri)
    study_uri = re.escape(store.join(STUDY_JOURNAL))
    study_line = b'{"op_code": 0, "worker_id": "w", "study_name": "tune", "directions": [1]}\n'
    store.append_log(STUDY_JOURNAL, study_line)
    store.append_log(STUDY_JOURNAL, b"not json\n" + study_line)
    with pytest.raises(ValueError, match=f"{study_uri}: not an Optuna journal"):
        load_study(run_uri, "tune")


def test_the_storage_pickles_as_ray_tune_snapshots_its_searcher():
    """Ray Tune pickles the searcher, storage and all: the copy reads the same study from the store."""
    uri = _memory_uri("pickled")
    storage = study_storage(uri)
    study = _search(storage, n=2)
    copy = pickle.loads(pickle.dumps(storage))
    assert isinstance(copy._backend, StoreJournal)
    assert _view(optuna.load_study(study_name="tune", storage=copy)) == _view(study)


def test_a_local_run_keeps_its_study_as_optunas_journal_file_and_an_earlier_runs_sqlite_study_as_it_is(tmp_path):
    """On a file system the study is the file optuna.journal, which Optuna's own JournalFileBackend (and so
    optuna-dashboard) opens as it is; a run an earlier version made keeps its optuna.db, read and continued."""
    from conftest import optuna_journal

    new, old = tmp_path / "new", tmp_path / "old"
    assert study_file(new) == STUDY_JOURNAL and not has_study(new)
    _search(study_storage(new), n=2)
    assert has_study(new) and (new / STUDY_JOURNAL).is_file() and not (new / OPTUNA_DB).exists()
    assert _view(optuna.load_study(study_name="tune", storage=optuna_journal(new))) == _view(load_study(new, "tune"))
    old.mkdir()
    _search(optuna.storages.RDBStorage(f"sqlite:///{old / OPTUNA_DB}"), n=2)
    assert has_study(old) and study_file(old) == OPTUNA_DB
    _trials(load_study(old, "tune"), 1)  # a resumed search goes on in its SQLite study
    assert len(load_study(old, "tune").trials) == 3 and not (old / STUDY_JOURNAL).exists()
