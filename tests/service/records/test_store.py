"""The run directory's store (issue "The run record on object storage"): one contract, run over a :class:`LocalStore`
in a temporary folder, a :class:`CloudStore` on a real S3 server (moto's, on 127.0.0.1: tests/s3_server.py) and a
:class:`MemoryStore` (``memory://``), conditional writes included; and :class:`RunReader` reading the same run
through a local and an S3 store. No Ray."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
import s3_server
from s3_server import fresh_s3_uri
from unfinished_runs import finished_smoke_run

from ablate.files import WriteError
from ablate.service.records.reader import RunReader
from ablate.service.records.rundir import DRIVER_LOCK, PROVENANCE_FILE, RESULT_FILE, RUN_MARKER
from ablate.service.records.store import (
    CREATE,
    CloudStore,
    Conflict,
    LocalStore,
    Match,
    MemoryStore,
    Store,
    check_conditional,
    open_store,
)
from ablate.service.records.store.flock import PidLock

s3_query = s3_server.s3_query  # the module's S3 server (a fixture)


@pytest.fixture(params=["local", "s3", "memory"])
def store(request, tmp_path) -> Store:
    """An empty run directory's store: a local folder, a prefix of a bucket on the S3 server, or a fresh store in
    this process's memory (``memory://``, whose folders are implicit, as in a bucket)."""
    if request.param == "local":
        return LocalStore(tmp_path / "run")
    if request.param == "memory":
        return MemoryStore(f"memory://test-{uuid.uuid4().hex[:8]}/lab/run")
    return CloudStore(fresh_s3_uri(request.getfixturevalue("s3_query")))


def test_bytes_and_text_round_trip_and_a_missing_file_reads_none(store):
    data = bytes(range(256)) * 3
    store.write_bytes("blob.bin", data)
    store.write_text("trial_a/params.json", '{"τ": 0.5}\n')
    assert store.read_bytes("blob.bin") == data
    assert store.read_text("trial_a/params.json") == '{"τ": 0.5}\n'
    assert store.read_bytes("trial_a/params.json") == '{"τ": 0.5}\n'.encode()
    assert store.exists("blob.bin") and store.exists("trial_a") and store.exists("trial_a/params.json")

    for missing in ("nope.json", "trial_a/nope.json", "trial_b/params.json", "trial_a"):  # the last: a folder
        assert store.read_bytes(missing) is None and store.read_text(missing) is None, missing
    assert not store.exists("nope.json") and not store.exists("trial_b")


def test_an_overwrite_replaces_the_whole_file(store):
    store.write_text("result.json", "".join(json.dumps({"step": s}) + "\n" for s in range(100)))
    store.write_text("result.json", '{"step": 0}\n')
    assert store.read_text("result.json") == '{"step": 0}\n'
    store.write_bytes("result.json", b"")
    assert store.read_bytes("result.json") == b"" and store.list(dirs=False) == ["result.json"]


def test_a_file_read_while_it_is_replaced_reads_whole_old_or_new(store):
    """A log rewritten at each report, read by `ablate status` meanwhile: each read is one version whole, never cut
    or padded (an S3 object is read in one GET, its bytes and version together)."""
    import threading

    versions = [b'{"step": 5}\n' * 9, b'{"step": 10}\n' * 9]  # lengths differ
    store.write_bytes("result.json", versions[0])
    done = threading.Event()

    def rewrite():
        i = 0
        while not done.wait(0.03):  # every 30 ms: far more often than a log, so that reads overlap writes
            i += 1
            store.write_bytes("result.json", versions[i % 2])

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        reads = [store.get("result.json") for _ in range(40)]
    finally:
        done.set()
        writer.join()
    torn = [r for r in reads if r is None or r.data not in versions]
    assert not torn, torn[:3]


def test_list_names_the_direct_files_or_folders_of_a_folder(store):
    for key in ("ablate_run.json", "provenance.jsonl", "trial_b/params.json", "trial_a/result.json",
                "trial_a/checkpoint_5/state.pt", "trial_a/checkpoint_10/state.pt"):  # fmt: skip
        store.write_text(key, key)
    assert store.list(dirs=False) == ["ablate_run.json", "provenance.jsonl"]
    assert store.list(dirs=True) == ["trial_a", "trial_b"]
    assert store.list("trial_a", dirs=False) == ["result.json"]
    assert store.list("trial_a/", dirs=True) == ["checkpoint_10", "checkpoint_5"]
    assert store.list("trial_a/checkpoint_5", dirs=False) == ["state.pt"]
    for nothing in ("trial_c", "trial_a/result.json"):  # no such folder; a file
        assert store.list(nothing, dirs=False) == [] and store.list(nothing, dirs=True) == []


def test_delete_and_delete_tree_and_a_missing_one_is_fine(store):
    for key in ("a.json", "trial_a/params.json", "trial_a/checkpoint_5/state.pt", "trial_b/params.json"):
        store.write_text(key, "x")
    store.delete("a.json")
    store.delete("a.json")
    store.delete("trial_c/params.json")
    assert store.read_text("a.json") is None and store.list(dirs=False) == []

    store.delete_tree("trial_a")
    store.delete_tree("trial_a")
    store.delete_tree("trial_c")
    assert store.list(dirs=True) == ["trial_b"] and store.read_text("trial_b/params.json") == "x"
    assert store.read_text("trial_a/params.json") is None and store.read_text("trial_a/checkpoint_5/state.pt") is None
    assert not store.exists("trial_a")
    with pytest.raises(ValueError):
        store.delete_tree("")  # never the run directory itself


def test_keys_stay_under_the_root_and_join_names_a_key_where_the_user_would(store):
    for bad in ("", "/", "../x", "trial_a/../../x", "./x"):
        with pytest.raises(ValueError, match="not a key"):
            store.write_text(bad, "x")
    assert store.join() == store.uri
    if isinstance(store, LocalStore):
        assert store.join("trial_a", "params.json") == str(store.root / "trial_a" / "params.json")
    else:
        base, mark, query = store.uri.partition("?")
        assert store.join("trial_a", "params.json") == f"{base}/trial_a/params.json{mark}{query}"
        assert store.join("trial_a/params.json") == store.join("trial_a", "params.json")


def test_a_local_write_leaves_no_temporary_and_a_failed_one_names_the_file(tmp_path):
    store = LocalStore(tmp_path / "run")
    store.write_text("trial_a/params.json", "{}")
    with pytest.raises(WriteError) as err:  # a file where a folder should be
        store.write_text("trial_a/params.json/x", "{}")
    assert err.value.filename == str(tmp_path / "run" / "trial_a" / "params.json" / "x")
    assert str(err.value).startswith(f"cannot write {err.value.filename} (")
    assert sorted(p.name for p in (tmp_path / "run" / "trial_a").iterdir()) == ["params.json"]


def test_a_write_into_a_read_only_folder_names_the_file(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only folder")
    store, folder = LocalStore(tmp_path / "run"), tmp_path / "run" / "trial_a"
    store.write_text("trial_a/params.json", "{}")
    folder.chmod(0o555)
    try:
        with pytest.raises(WriteError) as err:
            store.write_text("trial_a/result.json", "{}")
        with pytest.raises(WriteError) as nested:
            store.write_text("trial_a/checkpoint_5/state.pt", "{}")
        store.delete("trial_a/nope.json")  # nothing to delete: fine
    finally:
        folder.chmod(0o755)
    assert err.value.filename == str(folder / "result.json")
    assert str(err.value).startswith(f"cannot write {folder / 'result.json'} (")
    assert nested.value.filename == str(folder / "checkpoint_5" / "state.pt")
    assert sorted(p.name for p in folder.iterdir()) == ["params.json"]


def test_a_write_to_a_bucket_that_does_not_exist_names_the_objects_uri(s3_query):
    store = CloudStore(fresh_s3_uri(s3_query, bucket="no-such-bucket"))
    with pytest.raises(WriteError) as err:
        store.write_text("trial_a/params.json", "{}")
    assert err.value.filename == store.join("trial_a", "params.json")
    assert str(err.value).startswith(f"cannot write {store.join('trial_a', 'params.json')} (")
    assert "bucket does not exist" in str(err.value), err.value
    with pytest.raises(WriteError, match="bucket does not exist"):  # no bucket is no Conflict: no file is there
        store.put("trial_a/params.json", b"{}", CREATE)
    assert store.read_text("trial_a/params.json") is None
    with pytest.raises(OSError, match="bucket does not exist") as listed:  # said, not read as an empty run
        store.list(dirs=True)
    assert str(listed.value).startswith(f"{store.uri}: ") and "\n" not in str(listed.value)


def test_open_store_picks_the_store_of_a_path_or_uri(tmp_path, s3_query):
    local, file_uri, remote = open_store(tmp_path), open_store(f"file://{tmp_path}"), open_store(fresh_s3_uri(s3_query))
    assert isinstance(local, LocalStore) and local.root == tmp_path and local.uri == str(tmp_path)
    assert isinstance(file_uri, LocalStore) and file_uri.root == tmp_path and file_uri.uri == f"file://{tmp_path}"
    assert isinstance(remote, CloudStore) and remote.uri.startswith("s3://runs/lab/")
    memory = open_store("memory://lab-open/run")
    assert isinstance(memory, MemoryStore) and memory.uri == "memory://lab-open/run"


def _copy(run_dir: Path, store: Store) -> None:
    """Every file of a local run, written into ``store`` through its own writes."""
    for path in sorted(p for p in run_dir.rglob("*") if p.is_file()):
        store.write_bytes(path.relative_to(run_dir).as_posix(), path.read_bytes())


def test_run_reader_reads_the_same_run_through_both_stores(tmp_path, s3_query):
    written = tmp_path / "written"
    ids = finished_smoke_run(written)
    (written / PROVENANCE_FILE).write_text(json.dumps({"event": "start"}) + "\n")
    (written / f"trial_{ids[0]}" / RESULT_FILE).write_text('{"step": 5, "training_iteration": 1}\n{"step": 1')
    local, remote = LocalStore(tmp_path / "local"), CloudStore(fresh_s3_uri(s3_query))
    _copy(written, local)
    _copy(written, remote)

    readers = [RunReader(local), RunReader(remote), RunReader(tmp_path / "local"), RunReader(remote.uri)]
    assert [r.uri for r in readers] == [local.uri, remote.uri, str(tmp_path / "local"), remote.uri]

    def seen(reader: RunReader) -> dict:
        return {
            "marker": reader.marker(),
            "points": reader.points(),
            "trial_dirs": reader.trial_dirs(),
            "dirs": reader.list_dirs(),
            "files": reader.list_files(""),
            "provenance": reader.provenance(),
            "states": reader.trial_states(),
            "results": {n: reader.results(n) for n in reader.trial_dirs()},
            "logged": {n: reader.logged_rows(n) for n in reader.trial_dirs()},
            "missing": reader.read_text("trial_nope", "params.json"),
            "live": reader.driver_live(),
        }

    first = seen(readers[0])
    assert first["trial_dirs"] == sorted(f"trial_{i}" for i in ids) and first["live"] is False
    assert first["files"] == sorted([RUN_MARKER, PROVENANCE_FILE]) and first["missing"] is None
    assert {k: v["status"] for k, v in first["states"].items()} == {
        i: "INTERRUPTED" if i == ids[0] else "TERMINATED" for i in ids
    }  # the first trial's log ends in a torn line: one intact row
    assert first["logged"][f"trial_{ids[0]}"] == [{"step": 5, "training_iteration": 1}]
    for reader in readers[1:]:
        assert seen(reader) == first, reader.uri

    # a live driver is known by its lock: an flock on disk, a lease in a bucket; a lock file on S3 that is no
    # lease (no token) says nothing
    remote.write_text(DRIVER_LOCK, json.dumps({"pid": os.getpid(), "host": "here", "since": 0}))
    lock = PidLock(local.join(DRIVER_LOCK)).acquire()
    try:
        assert [r.driver_live() for r in readers] == [True, False, True, False]
        lease = remote.lock(DRIVER_LOCK, ttl_s=60).acquire()  # takes the damaged object over
        try:
            assert [r.driver_live() for r in readers] == [True, True, True, True]
            assert readers[1].driver()["pid"] == os.getpid()
        finally:
            lease.release()
    finally:
        lock.release()
    assert [r.driver_live() for r in readers] == [False, False, False, False]
    assert remote.exists(DRIVER_LOCK) and remote.lock_holder(DRIVER_LOCK, ttl_s=60) is None  # released: a tombstone


def test_conditional_writes_are_a_compare_and_swap(store):
    """The leases and fencing rest on these (ablate.service.records.store.lease): a create-only put writes once, a put
    matched on a version writes only while the file is still that version, a failed condition raises Conflict and
    changes nothing, and a put's version is the one a following get reports."""
    first = store.put("lease.json", b"first", CREATE)
    assert store.get("lease.json") == (b"first", first)
    with pytest.raises(Conflict) as again:
        store.put("lease.json", b"second", CREATE)
    assert store.join("lease.json") in str(again.value)
    assert store.get("lease.json") == (b"first", first)  # the first content, its version

    updated = store.put("lease.json", b"updated", Match(first))
    assert store.get("lease.json") == (b"updated", updated)
    with pytest.raises(Conflict):
        store.put("lease.json", b"stale", Match(first))  # the version before the update
    assert store.get("lease.json") == (b"updated", updated)
    third = store.put("lease.json", b"third", Match(updated))
    assert store.get("lease.json") == (b"third", third) and third != updated

    with pytest.raises(Conflict):
        store.put("nope.json", b"x", Match(third))  # no file at the key
    assert store.get("nope.json") is None and not store.exists("nope.json")

    overwritten = store.put("lease.json", b"overwritten")
    assert store.get("lease.json") == (b"overwritten", overwritten)
    store.delete("lease.json")
    created = store.put("lease.json", b"created again", CREATE)  # a deleted file can be created again
    assert store.get("lease.json") == (b"created again", created)

    check_conditional(store)
    assert store.list(dirs=False) == ["lease.json"]  # its probe removed


def test_a_store_that_read_and_wrote_a_log_still_pickles_and_its_copy_carries_the_log_on(store):
    """A store travels pickled (to Ray's workers; in Tune's snapshots of a scheduler that holds a RunRecord, as an
    Optuna search's resume takes): after reading and appending a log it still pickles, and the copy reads the same
    lines and appends after them."""
    import pickle

    store.append_log("trial_x/result.json", b'{"step": 1}\n')
    assert store.read_log("trial_x/result.json") == b'{"step": 1}\n'
    copy = pickle.loads(pickle.dumps(store))
    assert copy.read_log("trial_x/result.json") == b'{"step": 1}\n'
    copy.append_log("trial_x/result.json", b'{"step": 2}\n')
    reader = pickle.loads(pickle.dumps(store))  # another process's view: everything written
    assert reader.read_log("trial_x/result.json") == b'{"step": 1}\n{"step": 2}\n'
