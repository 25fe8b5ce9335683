"""Bulk reads as Arrow columns (store/read/columns.py) against a real store: a topic queue's topic
column comes from its name (the caller's ``topic``) without reading what the query does not
need, the records overrule a name that does not fit them, and retention is honoured on the
short path too."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from store import Message
from store.errors import RecordCorruptError
from store.log import record_columns
from store.read import columns
from store.read.readonly import CommitLogReader

TOPIC_ONLY = columns.schema_of(["topic"])


def rows(read: columns.RangeRead, schema: pa.Schema) -> dict[str, list]:
    return pa.Table.from_batches(read.batches, schema).to_pydict()


async def put(store, topic: str, queue: str, n: int) -> int:
    results = await store.put_batch([(Message(topic=topic, body=b"%d" % i), [queue]) for i in range(n)])
    return results[-1].position


async def test_a_topic_only_read_of_a_topic_queue_reads_no_range_and_no_record(open_store, monkeypatch) -> None:
    store = await open_store()
    await put(store, "a/b", "t:a/b", 40)
    qid = store.index.lookup("t:a/b").qid
    log = CommitLogReader(store.commitlog.directory)

    def refused(*args, **kwargs):
        raise AssertionError("read what the query does not need")

    monkeypatch.setattr(columns, "read_entries", refused)
    monkeypatch.setattr(record_columns, "cut", refused)
    read = columns.read_range_live(store.index.db, log, store.commitlog, "t:a/b", qid, 5, 40, TOPIC_ONLY, "a/b")
    assert (read.first_offset, read.next_offset) == (5, 40)
    assert rows(read, TOPIC_ONLY) == {"topic": ["a/b"] * 35}
    schema = columns.schema_of(["queue", "offset", "topic"])
    read = columns.read_range_live(store.index.db, log, store.commitlog, "t:a/b", qid, 0, 40, schema, "a/b")
    assert rows(read, schema) == {"queue": ["t:a/b"] * 40, "offset": list(range(40)), "topic": ["a/b"] * 40}
    with pytest.raises(AssertionError, match="does not need"):  # without the topic, the records are read
        columns.read_range_live(store.index.db, log, store.commitlog, "t:a/b", qid, 0, 40, TOPIC_ONLY)
    log.close()


async def test_the_records_overrule_a_topic_that_does_not_fit_them(open_store) -> None:
    """A queue whose records have another topic than the caller says (the gateway never
    writes one): when the records are read anyway, their topic is the column."""
    store = await open_store()
    await put(store, "x/y", "t:a/b", 3)
    await put(store, "a/b", "t:a/c", 3)  # same length, other bytes
    log = CommitLogReader(store.commitlog.directory)
    schema = columns.schema_of(["topic", "payload"])
    for queue, said in [("t:a/b", "a/b"), ("t:a/c", "a/b"), ("t:a/c", "a/bb")]:
        qid = store.index.lookup(queue).qid
        read = columns.read_range_live(store.index.db, log, store.commitlog, queue, qid, 0, 3, schema, said)
        assert rows(read, schema) == {"topic": ["x/y" if queue == "t:a/b" else "a/b"] * 3,
                                      "payload": [b"0", b"1", b"2"]}
    log.close()


async def test_retention_is_honoured_without_a_range_read(open_store) -> None:
    """Entries whose records lie below the commitlog's start are gone: a topic-only read starts
    after them, as the full read does."""
    store = await open_store()
    positions = [await put(store, "a/b", "t:a/b", 1) for _ in range(10)]
    qid = store.index.lookup("t:a/b").qid
    log = CommitLogReader(store.commitlog.directory)
    for schema in (TOPIC_ONLY, columns.schema_of(["topic", "payload"])):
        read = columns.read_range(store.index.db, log, "t:a/b", qid, 0, 10, positions[4], schema, "a/b")
        assert (read.first_offset, read.next_offset) == (4, 10)
        assert rows(read, schema)["topic"] == ["a/b"] * 6
    log.close()


async def test_records_far_apart_are_read_apart_and_exactly(open_store, monkeypatch) -> None:
    """A topic queue whose records lie among other topics' records (more than GATHER_GAP apart)
    is read record by record: the bytes copied are about its own, not everything in between,
    and the rows are exact; records close together are still read in one piece."""
    store = await open_store()
    filler = b"f" * 20_000
    for i in range(12):  # t:a/b's records 100 KB apart, t:a/c's close together after them
        await store.put_batch([(Message(topic="a/b", body=b"r%d" % i), ["t:a/b"]),
                               *[(Message(topic="z", body=filler), ["t:z"]) for _ in range(5)]])
    await store.put_batch([(Message(topic="a/c", body=b"c%d" % i), ["t:a/c"]) for i in range(5)])
    log = CommitLogReader(store.commitlog.directory)
    copied: list[int] = []
    real_pread = os.pread

    def counting_pread(fd: int, n: int, at: int) -> bytes:
        copied.append(n)
        return real_pread(fd, n, at)

    monkeypatch.setattr(os, "pread", counting_pread)  # (the active segment's bytes come by pread)
    schema = columns.schema_of(["offset", "payload"])
    qid = store.index.lookup("t:a/b").qid
    read = columns.read_range_live(store.index.db, log, store.commitlog, "t:a/b", qid, 2, 12, schema, "a/b")
    assert rows(read, schema) == {"offset": list(range(2, 12)), "payload": [b"r%d" % i for i in range(2, 12)]}
    assert len(copied) == 10 and sum(copied) < 2_000, copied  # not the ~1 MB between its first and last
    copied.clear()
    qid = store.index.lookup("t:a/c").qid
    read = columns.read_range_live(store.index.db, log, store.commitlog, "t:a/c", qid, 0, 5, schema, "a/c")
    assert rows(read, schema)["payload"] == [b"c%d" % i for i in range(5)] and len(copied) == 1
    log.close()


async def test_records_of_ranges_side_by_side_are_read_together_and_exactly(open_store, monkeypatch) -> None:
    """Topics published in turn: each topic queue's records lie far apart (more than
    GATHER_GAP), but next to the other queues' records. A read of all their ranges together
    (the data API's POST /data/read, a Spark micro-batch) reads each cluster of records once,
    not each record apart, and every range's rows are exact, in order."""
    store = await open_store()
    topics = [f"s/{k}" for k in range(8)]
    filler = b"f" * 80_000
    for i in range(6):  # one reading per topic, in turn, then a long gap of another topic
        await store.put_batch([*[(Message(topic=t, body=b"%s:%d" % (t.encode(), i)), [f"t:{t}"]) for t in topics],
                               (Message(topic="z", body=filler), ["t:z"])])
    log = CommitLogReader(store.commitlog.directory)
    copied: list[int] = []
    real_pread = os.pread

    def counting_pread(fd: int, n: int, at: int) -> bytes:
        copied.append(n)
        return real_pread(fd, n, at)

    monkeypatch.setattr(os, "pread", counting_pread)  # (the active segment's bytes come by pread)
    schema = columns.schema_of(["offset", "payload"])
    ranges = [(f"t:{t}", store.index.lookup(f"t:{t}").qid, 1, 6, t) for t in reversed(topics)]
    reads, batches = columns.read_ranges_live(store.index.db, log, store.commitlog, ranges, schema)
    assert [read.rows for read in reads] == [5] * len(topics)
    assert pa.Table.from_batches(batches, schema).to_pydict() == {
        "offset": list(range(1, 6)) * len(topics),
        "payload": [b"%s:%d" % (t.encode(), i) for t in reversed(topics) for i in range(1, 6)]}
    assert len(batches) == 1  # the ranges' rows built together
    assert len(copied) == 5, copied  # a read per turn of the 8 topics, not 40 (one a record)
    log.close()


async def test_ranges_built_together_across_segments_match_each_range_read_alone(open_store) -> None:
    """Ranges of topic queues and of a wildcard queue whose records span several commitlog
    segments, some near each other and some far apart, built together: the same rows, in
    order, as each range read alone, and batches never longer than BATCH_ROWS."""
    store = await open_store(segment_size=64 << 10)
    topics = [f"s/{k}" for k in range(5)]
    for i in range(400):
        t = topics[i % len(topics)] if i % 7 else topics[0]
        body = b"%s:%d:" % (t.encode(), i) + b"x" * (i % 300)
        await store.put_batch([(Message(topic=t, body=body), [f"t:{t}", "w:s/+"])])
    log = CommitLogReader(store.commitlog.directory)
    schema = columns.schema_of(["queue", "offset", "topic", "payload", "timestamp", "born_timestamp"])
    ranges = []
    for queue, start, stop in [("t:s/3", 10, 60), ("w:s/+", 5, 390), ("t:s/0", 0, 130), ("t:s/1", 3, 4),
                               ("t:s/2", 20, 20), ("t:s/4", 0, 50)]:
        topic = None if queue.startswith("w:") else queue[2:]
        ranges.append((queue, store.index.lookup(queue).qid, start, stop, topic))
    reads, batches = columns.read_ranges_live(store.index.db, log, store.commitlog, ranges, schema)
    assert all(b.num_rows <= columns.BATCH_ROWS for b in batches)
    alone = [columns.read_range_live(store.index.db, log, store.commitlog, q, qid, s, e, schema, t)
             for q, qid, s, e, t in ranges]
    assert [(r.first_offset, r.next_offset) for r in reads] == [(r.first_offset, r.next_offset) for r in alone]
    expected = [row for r in alone for row in pa.Table.from_batches(r.batches, schema).to_pylist()]
    assert pa.Table.from_batches(batches, schema).to_pylist() == expected
    assert len(list(store.commitlog.directory.iterdir())) > 2  # (the records span several segments)
    log.close()


async def test_a_broken_record_among_ranges_read_together_is_named_by_its_own_queue_and_offset(open_store) -> None:
    """Ranges built together: a record that is not what its index entry says fails the read
    with an error naming its own queue and offset, not the first range's."""
    store = await open_store()
    for i in range(6):
        await store.put_batch([(Message(topic=t, body=b"%s%d" % (t.encode(), i)), [f"t:{t}"]) for t in ("a", "b")])
    broken = (await store.put_batch([(Message(topic="b", body=b"b6"), ["t:b"])]))[0].position
    store.commitlog.flush()
    segment = broken - broken % store.commitlog.segment_size
    path = next(p for p in store.commitlog.directory.iterdir() if p.name.isdigit() and int(p.name) == segment)
    with open(path, "r+b") as f:
        f.seek(broken - segment + 4)  # the record's magic (log/record.py)
        f.write(b"\0\0\0\0")
    log = CommitLogReader(store.commitlog.directory)
    ranges = [(q, store.index.lookup(q).qid, 0, store.index.lookup(q).next_offset, q[2:]) for q in ("t:a", "t:b")]
    with pytest.raises(RecordCorruptError, match=r"queue t:b offset 6\b"):
        columns.read_ranges_live(store.index.db, log, store.commitlog, ranges, columns.schema_of(["payload"]))
    log.close()
