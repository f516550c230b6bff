"""The store's append-only log (issue 47, item 3): on disk one file appended to; on a store without append (in
memory, and a real S3 server: moto's on 127.0.0.1) numbered entries written create-only and merged
(:mod:`ablate.service.records.store.segments`). A kill at any moment loses no line and repeats none; an earlier
writer that carries on after a new one started cannot overwrite it; damage is read around in one line. No Ray."""

from __future__ import annotations

import logging
import random
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
import s3_server
from s3_server import fresh_s3_uri

import ablate.service.records.store.segments as segments
from ablate.service.records.store import CloudStore, Conflict, LocalStore, MemoryStore, Store
from ablate.service.records.store.segments import SegmentLogs, folder_of

KEY = "trial_x/result.json"
LOGGER = "ablate.service.records.store"

s3_query = s3_server.s3_query  # the module's S3 server (a fixture)


@pytest.fixture(params=["local", "memory", "s3"])
def store(request, tmp_path) -> Store:
    if request.param == "local":
        return LocalStore(tmp_path / "run")
    if request.param == "memory":
        return MemoryStore(f"memory://segments-{uuid.uuid4().hex[:8]}")
    return CloudStore(fresh_s3_uri(request.getfixturevalue("s3_query")))


@pytest.fixture(params=["memory", "s3"])
def bucket(request) -> Store:
    """A store without append: its logs are entries."""
    if request.param == "memory":
        return MemoryStore(f"memory://segments-{uuid.uuid4().hex[:8]}")
    return CloudStore(fresh_s3_uri(request.getfixturevalue("s3_query")))


def line(i: int) -> bytes:
    return f'{{"step": {i}}}\n'.encode()


def lines(*numbers: int) -> bytes:
    return b"".join(line(i) for i in numbers)


def entries(store: Store) -> list[str]:
    return store.list(folder_of(KEY), dirs=False)


def test_a_log_is_appended_read_replaced_and_its_tail_read(store):
    assert store.read_log(KEY) is None and store.log_tail(KEY) is None
    for i in range(5):
        store.append_log(KEY, line(i))
    assert store.read_log(KEY) == lines(0, 1, 2, 3, 4)
    assert store.log_tail(KEY).endswith(line(4))
    store.replace_log(KEY, lines(0, 1))
    assert store.read_log(KEY) == lines(0, 1)
    store.append_log(KEY, line(2))
    assert store.read_log(KEY) == lines(0, 1, 2) and store.log_tail(KEY).endswith(line(2))
    store.replace_log(KEY, b"")
    assert store.read_log(KEY) == b"" and store.log_tail(KEY) == b""


def test_entries_are_merged_as_they_pile_up_and_read_in_few_requests(bucket, monkeypatch):
    """With 4 entries merged into one, 70 lines are read from at most 3 entries per size class, in order."""
    monkeypatch.setattr(segments, "FAN_OUT", 4)
    for i in range(70):
        bucket.append_log(KEY, line(i))
    names = entries(bucket)
    assert bucket.read_log(KEY) == SegmentLogs(bucket).read(KEY) == lines(*range(70))  # the writer, another reader
    taken, gaps = segments.cover(names)
    assert not gaps and len(taken) <= 3 * 3, taken
    assert len(names) == len(taken), names  # merged sources are deleted
    assert bucket.log_tail(KEY).endswith(line(69))


def test_a_finished_log_is_made_one_entry_that_a_reader_reads_in_one_request(bucket, monkeypatch):
    monkeypatch.setattr(segments, "FAN_OUT", 4)
    for i in range(10):
        bucket.append_log(KEY, line(i))
    assert len(entries(bucket)) > 1
    bucket.compact_log(KEY)
    assert len(entries(bucket)) == 1 and SegmentLogs(bucket).read(KEY) == lines(*range(10))
    bucket.append_log(KEY, line(10))  # a log goes on after it (a trial extended later)
    assert SegmentLogs(bucket).read(KEY) == bucket.read_log(KEY) == lines(*range(11))


def test_a_new_writer_fences_off_an_earlier_one_which_stops_and_never_overwrites_it(bucket):
    """Two processes writing one log (a driver whose lease was taken over, carrying on): each writer is a
    SegmentLogs of its own. The new one claims the number after every entry there and writes the log as one entry
    reaching it; the earlier one's next append takes that number, collides and raises Conflict, so no line of it
    lands unseen. An append of the earlier one that lands between the new one's read and its claim is read again
    and kept, and the claim goes one further."""
    old, new = SegmentLogs(bucket), SegmentLogs(bucket)
    for i in range(3):
        old.append(KEY, line(i))
    new.append(KEY, line(3))
    with pytest.raises(Conflict, match="another writer"):
        old.append(KEY, b'{"step": 100}\n')
    assert bucket.read_log(KEY) == lines(0, 1, 2, 3)
    new.append(KEY, line(4))
    assert bucket.read_log(KEY) == lines(0, 1, 2, 3, 4)

    old, new = SegmentLogs(bucket), SegmentLogs(bucket)
    old.append(KEY, line(5))  # a fresh writer: one entry [1, M] (and its claim)
    assert new.read(KEY) == lines(0, 1, 2, 3, 4, 5)  # the new writer reads...
    old.append(KEY, line(6))  # ...the earlier one appends meanwhile...
    new.append(KEY, line(7))  # ...so the new one's claim collides: it reads again and claims past it
    with pytest.raises(Conflict, match="another writer"):
        old.append(KEY, line(8))
    assert bucket.read_log(KEY) == lines(0, 1, 2, 3, 4, 5, 6, 7)


def test_damage_is_read_around_and_said_in_one_line(bucket, caplog):
    for i in range(6):
        bucket.append_log(KEY, line(i))
    names = entries(bucket)
    bucket.delete(f"{folder_of(KEY)}/{names[2]}")  # an entry deleted by hand
    bucket.put(f"{folder_of(KEY)}/notes.txt", b"not an entry\n")  # an object of another name
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        data = SegmentLogs(bucket).read(KEY)  # a reader in another process (the writer reads what it wrote)
    assert data == lines(0, 1, 3, 4, 5)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "misses its entries 3" in said[0] and "\n" not in said[0], said


def test_a_log_written_whole_by_an_earlier_version_is_read_and_taken_in_at_the_next_append(bucket):
    bucket.put(KEY, lines(0, 1))
    assert bucket.read_log(KEY) == lines(0, 1)
    bucket.append_log(KEY, line(2))
    assert bucket.read_log(KEY) == lines(0, 1, 2) and bucket.get(KEY) is None


WRITER = textwrap.dedent(
    """
    import json, sys
    import ablate.service.records.store.segments as segments
    from ablate.service.records.store import open_store
    segments.FAN_OUT = 4
    store, key, total = open_store(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    done = [json.loads(x)["step"] for x in (store.read_log(key) or b"").decode().splitlines()]
    assert done == list(range(len(done))), done
    print(len(done), flush=True)
    for i in range(len(done), total):
        store.append_log(key, (json.dumps({"step": i}) + "\\n").encode())
    """
)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_writer_killed_at_any_moment_loses_no_line_and_repeats_none(where, tmp_path, request):
    """A writer appending lines (in a bucket entries merged 4 at a time, so kills land in entry writes, merges and
    the deletes after them) is killed with SIGKILL six times at random moments; each time a new writer reads the
    log, checks it is 0, 1, 2, … with nothing repeated, and carries on. At the end every line is there once."""
    uri = str(tmp_path / "run") if where == "local" else fresh_s3_uri(request.getfixturevalue("s3_query"))
    total = 100_000 if where == "local" else 400  # about 2 s of appends either way
    rng, kills, starts = random.Random(47), 0, []
    for _ in range(7):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, uri, KEY, str(total)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        start = proc.stdout.readline()
        assert start.strip().isdigit(), proc.communicate()[1]
        starts.append(int(start))
        time.sleep(rng.uniform(0.05, 0.3))
        proc.send_signal(signal.SIGKILL)
        kills += proc.wait() == -signal.SIGKILL
    proc = subprocess.run([sys.executable, "-c", WRITER, uri, KEY, str(total)], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert kills >= 4 and 0 < starts[3] < total, (kills, starts)  # the kills landed mid-log
    store = LocalStore(tmp_path / "run") if where == "local" else CloudStore(uri)
    assert store.read_log(KEY) == lines(*range(total))
