"""benchmarks/object_store.py on a tiny run (5 reports, 3 checkpoints, 2 trials) against moto's S3 server: the
table's rows and columns, and request and byte counts that are positive integers. No timing asserted; no Ray."""

from __future__ import annotations

import pytest

from ablate.service.records.store.segments import FAN_OUT
from benchmarks.object_store import METHODS, bench_object_store
from benchmarks.s3_server import moto_server


def test_bench_object_store_counts_the_requests_and_bytes_of_each_operation():
    try:
        moto_server()
    except RuntimeError as exc:
        pytest.fail(str(exc))
    rows = bench_object_store(reports=5, checkpoints=3, trials=2)

    ops = [r["operation"] for r in rows]
    assert ops[0] == "params.json" and ops[1].startswith("report, mean of 5 (log of ")
    assert ops[2:5] == ["report 1 (log 1 rows)", "report 5 (log 5 rows)", "the log made one entry at the trial's end"]
    ops = ops[:4] + ops[5:]  # the rows below as they were numbered before the compaction's
    assert ops[4].startswith("checkpoint 1-2 (") and ops[5] == "checkpoint 3-3 (keep 2: prunes 1)"
    assert ops[6] == "lease: acquire + 3 renews + release" and ops[8] == "status read (2 trials, 5-row logs)"
    assert ops[7].startswith("search trial: 6 settings, 5 reports, told (study ")
    assert all(list(r) == list(rows[0]) for r in rows)  # one table
    by = {r["operation"]: r for r in rows}
    for r in rows:
        assert isinstance(r["requests"], int) and r["requests"] > 0, r
        assert r["requests"] == sum(r[m] for m in METHODS), r
        assert all(isinstance(r[m], int) and r[m] >= 0 for m in METHODS), r
        assert r["per_op"] == r["requests"] / r["ops"]
        for k in ("s3_ms_per_op", "local_ms_per_op"):
            assert r[k] >= 0
    # every write uploads. A report on a bucket is one create-only entry of its own line (store/segments.py): its
    # upload does not grow with the log; the first report of the process also lists the log (empty: nothing read),
    # the fifth reads nothing at all; 5 reports (fewer than FAN_OUT: no merge) upload the log once in all
    writes = [r for r in rows if not r["operation"].startswith("status")]
    assert all(isinstance(r["up_bytes"], int) and r["up_bytes"] > 0 for r in writes)
    first, fifth, reports = by["report 1 (log 1 rows)"], by["report 5 (log 5 rows)"], by[ops[1]]
    log_bytes = int(ops[1].removeprefix("report, mean of 5 (log of ").removesuffix(" B at the end)"))
    assert 5 < FAN_OUT and reports["up_bytes"] == log_bytes and reports["PUT"] == 5 and reports["down_bytes"] == 0
    assert first["PUT"] == 1 and first["GET"] >= 1 and first["down_bytes"] == 0
    assert fifth["requests"] == fifth["PUT"] == 1 and fifth["down_bytes"] == 0
    assert abs(fifth["up_bytes"] - first["up_bytes"]) <= 8  # a line each (the step's digits differ)
    assert by[ops[1]]["ops"] == 5 and by[ops[4]]["ops"] == 2 and by[ops[5]]["ops"] == 1
    # the pruning: a delete (S3's bulk delete is a POST) beyond the requests of a checkpoint's upload
    prune, upload = by[ops[5]], by[ops[4]]
    assert prune["DELETE"] + prune["POST"] >= 1 + (upload["DELETE"] + upload["POST"]) / upload["ops"]
    assert prune["requests"] > upload["per_op"]
    lease = by[ops[6]]  # a read, then a conditional PUT each: the create, 3 renewals, the released tombstone
    assert lease["PUT"] == 5 and lease["DELETE"] == 0 and lease["down_bytes"] == 0
    search = by[ops[7]]  # a trial's creation, its 6 settings and its end each append an entry to the journal's log
    study = int(ops[7].split("(study ")[1].split(" B")[0])
    assert search["ops"] == 10 and search["PUT"] >= 8 * 10
    # O(journal) bytes in all, never the journal again per operation (merges read back what they merge, once)
    assert search["up_bytes"] <= 4 * study and search["down_bytes"] <= study, (search, study)
    compacted = by["the log made one entry at the trial's end"]  # one PUT of the whole log, its 5 entries deleted
    assert compacted["PUT"] == 1 and compacted["up_bytes"] == log_bytes and compacted["POST"] == 1
    status = by["status read (2 trials, 5-row logs)"]
    assert status["up_bytes"] == 0 and status["down_bytes"] >= 2 * log_bytes and status["PUT"] == 0  # each log whole
