"""An Optuna search's study on object storage (ablate.service.records.study): Optuna's journal in one object, written
whole by its one writer, read back by a fresh driver and by Optuna's own file backend, against moto's S3 server and
this process's memory (``memory://``)."""

from __future__ import annotations

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
from ablate.service.records.store import as_store
from ablate.service.records.store.lease import LeaseLost
from ablate.service.records.study import StoreJournal, flush_study, load_study, study_storage

s3_query = s3_server.s3_query  # the module's S3 server (a fixture)

optuna.logging.set_verbosity(optuna.logging.WARNING)


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
    """A study with ``n`` trials: two settings each, three reports, told COMPLETE (the last one left RUNNING unless
    ``finish``)."""
    study = optuna.create_study(study_name="tune", storage=storage, direction="maximize")
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


def test_a_study_on_a_store_reads_back_whole_in_a_fresh_driver(run_uri):
    """Written through one storage, read through another made later (as a resumed driver does): the same trials,
    settings, values and reports; the store holds one journal object, and no SQLite file."""
    assert not has_study(run_uri) and study_file(run_uri) == STUDY_JOURNAL
    first = _search(study_storage(run_uri))
    assert has_study(run_uri) and as_store(run_uri).list(dirs=False) == [STUDY_JOURNAL]
    again = load_study(run_uri, "tune")
    assert again is not None and _view(again) == _view(first)
    assert again.best_value == first.best_value
    assert load_study(run_uri, "another name") is None


def test_the_journal_opens_with_optuna_s_own_file_backend(tmp_path, run_uri):
    """A downloaded optuna.journal is Optuna's JournalFileBackend format, line for line: Optuna itself reads it."""
    storage = study_storage(run_uri)
    study = _search(storage, finish=False)
    flush_study(storage)  # the running trial's last reports wait for an upload (as at a driver's end)
    path = tmp_path / STUDY_JOURNAL
    path.write_bytes(as_store(run_uri).read_bytes(STUDY_JOURNAL))
    theirs = optuna.load_study(study_name="tune", storage=JournalStorage(JournalFileBackend(str(path))))
    assert _view(theirs) == _view(study)
    assert [t.state.name for t in theirs.trials] == ["COMPLETE"] * 3 + ["RUNNING"]


def test_only_intermediate_values_wait_for_the_next_upload(monkeypatch):
    """A created trial, its settings and its end are uploaded at once (the object is then the whole journal); a
    report told to Optuna waits for the next of those, or FLUSH_S seconds, and flush_study uploads it."""
    uri = _memory_uri("deferred")
    clock = [1000.0]
    monkeypatch.setattr(study_mod.time, "monotonic", lambda: clock[0])
    storage = study_storage(uri)
    study = optuna.create_study(study_name="tune", storage=storage, direction="maximize")
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    stored = lambda: as_store(uri).read_text(STUDY_JOURNAL).splitlines()  # noqa: E731
    n_ops = len(stored())
    assert n_ops >= 3  # the study, the trial and its setting, each uploaded as made
    trial.report(0.5, 1)
    trial.report(0.6, 2)
    assert len(stored()) == n_ops  # waiting: the reports are in every trial's own result log too
    clock[0] += study_mod.FLUSH_S
    trial.report(0.7, 3)
    assert len(stored()) == n_ops + 3  # the oldest waited FLUSH_S: all three go up
    trial.report(0.8, 4)
    assert len(stored()) == n_ops + 3
    flush_study(storage)
    assert len(stored()) == n_ops + 4
    trial.report(0.9, 5)
    study.tell(trial, 0.9)  # a trial's end goes up at once, with the report before it
    assert len(stored()) == n_ops + 6
    assert dict(load_study(uri, "tune").trials[0].intermediate_values) == {1: 0.5, 2: 0.6, 3: 0.7, 4: 0.8, 5: 0.9}


def test_a_driver_that_lost_its_lease_uploads_nothing():
    """Each upload asks check() first: a driver whose lease was taken over raises LeaseLost and leaves the journal
    as the next driver may be writing it."""
    uri = _memory_uri("lost")
    study = _search(study_storage(uri), n=1)
    before = as_store(uri).read_bytes(STUDY_JOURNAL)
    lost = LeaseLost(as_store(uri).join(DRIVER_LOCK), "taken over")

    def check():
        raise lost

    study = optuna.load_study(study_name="tune", storage=study_storage(uri, check=check))
    with pytest.raises(LeaseLost):
        study.ask()
    assert as_store(uri).read_bytes(STUDY_JOURNAL) == before


def test_a_damaged_journal_is_an_error_naming_it_never_a_study_read_in_part():
    store = as_store(_memory_uri("damaged"))  # the in-memory store of this URI (one per URI, as the run's)
    study_uri = re.escape(store.join(STUDY_JOURNAL))
    store.write_text(STUDY_JOURNAL, '{"op_code": 0, "worker_id": "w", "study_name": "tune", "directions": [1]}\n{"op')
    with pytest.raises(ValueError, match=f"{study_uri}: not an Optuna journal"):
        load_study(store.uri, "tune")
    store.write_text(STUDY_JOURNAL, "not json\n")
    with pytest.raises(ValueError, match=f"{study_uri}: not an Optuna journal"):
        load_study(store.uri, "tune")


def test_the_storage_pickles_as_ray_tune_snapshots_its_searcher():
    """Ray Tune pickles the searcher, storage and all: the copy reads the same study from the store."""
    uri = _memory_uri("pickled")
    storage = study_storage(uri)
    study = _search(storage, n=2)
    copy = pickle.loads(pickle.dumps(storage))
    assert isinstance(copy._backend, StoreJournal)
    assert _view(optuna.load_study(study_name="tune", storage=copy)) == _view(study)


def test_a_local_run_keeps_its_study_in_sqlite(tmp_path):
    """On a file system the study stays optuna.db (optuna-dashboard's sqlite:/// URL), as before."""
    assert study_file(tmp_path) == OPTUNA_DB and not has_study(tmp_path)
    _search(study_storage(tmp_path), n=2)
    assert has_study(tmp_path) and (tmp_path / OPTUNA_DB).is_file() and not (tmp_path / STUDY_JOURNAL).exists()
    assert len(load_study(tmp_path, "tune").trials) == 2
