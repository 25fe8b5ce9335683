"""A queue's offset range as Arrow columns: the one place that turns stored messages into rows
for bulk readers (the gateway's read API and the co-located ``StoreReader`` both call
``read_ranges``: the rows of several ranges built together, in batches that may hold several
ranges' rows). Needs numpy and pyarrow (the ``arrow`` extra), as its decoder
(``record_columns``) needs numpy; nothing else in the store does.

Rows: queue, offset, topic, key (null when the message has none), properties (a map),
payload (binary), timestamp (the store time, UTC), born_timestamp (the producer's time where the
protocol carries one -- remoting's bornTimestamp --, else the time the gateway accepted the message:
MQTT and AMQP 0-9-1 publishes carry none). Speed comes from doing no Python work per
message: index entries come from one RocksDB range scan, decoded as a structured numpy array;
the record fields are cut out of the commitlog map by one pass of the compiled decoder
(``store/log/record_columns.py``) straight into Arrow buffers. A topic queue's topic column is its
name's where no record is read (the caller says so: ``read_range``), else each record's, and a read that needs neither entries nor records
(topic, queue, offset) reads no range at all. Properties repeat (an MQTT message carries its
publisher's client id), so each distinct property block is decoded once.
"""

from __future__ import annotations

import functools
import itertools
from mmap import mmap
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rocksdict import Rdict, ReadOptions

from ..log import record_columns
from ..log.commitlog import CommitLog
from ..index.consumequeue import ENTRY_VALUE, entry_key
from ..errors import RecordCorruptError
from ..holds.codec import INDIRECT, ControlRecord
from .readonly import CommitLogReader
from ..log.record import decode_properties

ARROW_SCHEMA = pa.schema([
    pa.field("queue", pa.string(), nullable=False),
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("topic", pa.string(), nullable=False),
    pa.field("key", pa.string()),
    pa.field("properties", pa.map_(pa.string(), pa.string())),
    pa.field("payload", pa.binary(), nullable=False),
    pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("born_timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
])

# columns cut out of the commitlog record; the others come from the queue name and the index entry
RECORD_COLUMNS = frozenset({"topic", "key", "properties", "payload", "born_timestamp"})

ENTRY_DTYPE = np.dtype([("position", ">u8"), ("size", ">u4"), ("tag", ">i8"), ("store_ts", ">i8")])
assert ENTRY_DTYPE.itemsize == ENTRY_VALUE.size

BATCH_ROWS = 32_768  # rows per RecordBatch: big enough to amortise, small enough for memory
_MAX_COLUMN = (1 << 31) - 1  # bytes of a string or binary column (int32 offsets)
# Records of a run further apart than this are read apart (``_gather``): a topic queue's records
# lie among other topics' records, and one read from its first to its last would copy them all
GATHER_GAP = 64 << 10


@dataclass(slots=True)
class RangeRead:
    """What a bulk read found: rows for offsets [first_offset, next_offset). ``first_offset`` is
    past the offset asked for when the messages before it are gone (retention)."""

    first_offset: int
    next_offset: int
    batches: list[pa.RecordBatch] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return self.next_offset - self.first_offset


def schema_of(columns: Iterable[str] | None) -> pa.Schema:
    """The schema of a read of ``columns`` (None: all), in ``ARROW_SCHEMA`` order; a name that
    is not a column is a ValueError naming it."""
    if columns is None:
        return ARROW_SCHEMA
    return _schema_of(frozenset(columns))


@functools.lru_cache(maxsize=256)  # (a reader asks once per fetch: 1,000 short queues, 1,000 times)
def _schema_of(wanted: frozenset[str]) -> pa.Schema:
    unknown = sorted(wanted - set(ARROW_SCHEMA.names))
    if unknown:
        raise ValueError(f"no column {', '.join(map(repr, unknown))}; the columns are {', '.join(ARROW_SCHEMA.names)}")
    return pa.schema([f for f in ARROW_SCHEMA if f.name in wanted])


def clamp(start: int, end: int, low: int, high: int, max_rows: int) -> tuple[int, int]:
    """The offsets a read of [start, end) serves from a queue holding [low, high): it skips what
    is gone (below ``low``), stops at ``high`` and after ``max_rows`` rows. (first, stop)."""
    first = max(start, low)
    return first, max(first, min(end, high, first + max_rows))


def read_entries(db: Rdict, qid: int, start: int, stop: int) -> tuple[int, np.ndarray]:
    """Index entries of offsets [start, stop) that still exist, as (first offset, ENTRY_DTYPE
    array). Retention removes a queue's entries from the front only, so what exists is one run
    ending at ``stop`` (the caller never asks past the queue's next offset)."""
    if stop <= start:
        return start, np.empty(0, ENTRY_DTYPE)
    opts = ReadOptions()
    opts.set_iterate_upper_bound(entry_key(qid, stop))
    values = list(db.values(from_key=entry_key(qid, start), read_opt=opts))
    first = stop - len(values)
    # (all of [start, stop) found: a run with no hole; fewer: the first found must be ``first``)
    if values and first > start and db.get(entry_key(qid, first)) is None:
        raise RecordCorruptError(f"consume queue {qid} has a hole in offsets [{start}, {stop})")
    return first, np.frombuffer(b"".join(values), ENTRY_DTYPE)


def read_range(db: Rdict, log: CommitLogReader, queue: str, qid: int, start: int, stop: int,
               min_position: int, schema: pa.Schema = ARROW_SCHEMA, topic: str | None = None) -> RangeRead:
    """Rows of ``queue`` (index id ``qid``) for offsets [start, stop), as many BATCH_ROWS-row
    batches as needed, with the columns of ``schema`` (``schema_of``). Entries whose record lies
    below ``min_position`` (the commitlog's start) are gone: the read starts after them. ``stop``
    must not pass the queue's next offset.

    ``topic``: the topic every record of the queue has, where the caller knows it from the
    queue's name (a topic queue: the store knows no queue names). The topic column is then built
    from it, not cut out of each record; a read whose other columns need neither index entries
    nor records (topic, queue, offset) reads one index entry, not the range."""
    (result,), batches = read_ranges(db, log, [(queue, qid, start, stop, topic)], min_position, schema)
    result.batches = batches
    return result


def read_ranges(db: Rdict, log: CommitLogReader, ranges: Iterable[tuple[str, int, int, int, str | None]],
                min_position: int, schema: pa.Schema = ARROW_SCHEMA) -> tuple[list[RangeRead], list[pa.RecordBatch]]:
    """The rows of several ranges, each (queue, qid, start, stop, topic), in order, in batches of
    at most BATCH_ROWS rows that may hold rows of several ranges (the RangeReads say where each
    range is and hold no batches). Ranges whose records are cut are built together: a
    micro-batch of many short topic ranges is a few column builds, not one a range."""
    names = schema.names
    results: list[RangeRead] = []
    batches: list[pa.RecordBatch] = []
    together: list[tuple[str, int, np.ndarray]] = []  # (queue, first offset, entries) of ranges built as one
    for queue, qid, start, stop, topic in ranges:
        from_records = RECORD_COLUMNS.intersection(names) - ({"topic"} if topic is not None else set())
        if not from_records and "timestamp" not in names and _kept(db, qid, start, stop, min_position):
            # retention removes a queue's entries from the front only: [start, stop) all exist
            batches.extend(_joined_batches(log, together, schema))
            together = []
            result = RangeRead(start, max(start, stop))
            for at in range(start, stop, BATCH_ROWS):
                batches.append(_batch(queue, at, min(stop, at + BATCH_ROWS) - at, None, None, None, None,
                                      schema, topic))
            results.append(result)
            continue
        first, entries = read_entries(db, qid, start, stop)
        if len(entries):
            kept = np.searchsorted(entries["position"].astype(np.int64), min_position)  # positions grow with offsets
            first += int(kept)
            entries = entries[kept:]
        result = RangeRead(first, stop if len(entries) else max(first, start))
        entries = _follow_releases(queue, first, entries, log)
        results.append(result)
        if from_records:
            together.append((queue, first, entries))
            continue
        batches.extend(_joined_batches(log, together, schema))
        together = []
        for at in range(0, len(entries), BATCH_ROWS):
            part = entries[at:at + BATCH_ROWS]
            batches.append(_batch(queue, first + at, len(part), part, None, None, None, schema, topic))
    batches.extend(_joined_batches(log, together, schema))
    return results, batches


def _joined_batches(log: CommitLogReader, ranges: list[tuple[str, int, np.ndarray]],
                    schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The rows of ``ranges`` (queue, first offset, index entries), in order, in batches of at
    most BATCH_ROWS rows (and ``_MAX_COLUMN`` bytes of records) built one column at a time over
    all of them; each record's topic is cut out of it (the queue's name is not asked for). A
    record that is not where its entry says is reported for its own range and offset."""
    ranges = [r for r in ranges if len(r[2])]
    if not ranges:
        return
    counts = np.array([len(e) for _, _, e in ranges], np.int64)
    entries = np.concatenate([e for _, _, e in ranges])
    which = np.repeat(np.arange(len(ranges)), counts)  # each row's range
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    offsets = np.array([f for _, f, _ in ranges], np.int64)[which] + (np.arange(len(entries)) - starts[which])
    sizes = entries["size"].astype(np.int64)
    lo = 0
    while lo < len(entries):
        hi = min(len(entries), lo + BATCH_ROWS)
        while hi - lo > 1 and int(sizes[lo:hi].sum()) > _MAX_COLUMN:
            hi = lo + (hi - lo) // 2
        queues = [r[0] for r in ranges]
        try:
            yield _joined_batch(log, queues, which[lo:hi], offsets[lo:hi], entries[lo:hi], schema)
        except RecordCorruptError:  # said for the range it is in (the decoder names a batch's first)
            for k in np.unique(which[lo:hi]).tolist():
                rows = lo + np.flatnonzero(which[lo:hi] == k)
                _joined_batch(log, queues, which[rows], offsets[rows], entries[rows], schema)
            raise
        lo = hi


def _joined_batch(log: CommitLogReader, queues: list[str], which: np.ndarray, offsets: np.ndarray,
                  entries: np.ndarray, schema: pa.Schema) -> pa.RecordBatch:
    """One batch of rows of several ranges: row i of ``queues[which[i]]`` at ``offsets[i]``."""
    names = schema.names
    positions = entries["position"].astype(np.int64)
    sizes = entries["size"].astype(np.int64)
    segments = positions // log.segment_size
    rel = np.empty(len(entries), np.int64)
    pieces: list[tuple[mmap | bytes, int, int]] = []  # (buffer, lo, hi): the bytes each segment gives
    base = 0
    for segment in np.unique(segments).tolist():
        rows = np.flatnonzero(segments == segment)
        seg_start = segment * log.segment_size
        here, lengths = positions[rows] - seg_start, sizes[rows]
        low, high = int(here.min()), int((here + lengths).max())
        found: tuple[mmap | bytes, int] | None
        if high - low > 2 * int(lengths.sum()) + GATHER_GAP:  # far apart: only the records copied
            places, first = np.unique(here, return_index=True)
            copied = places.copy()
            found = _gather(log, seg_start, copied, lengths[first])  # (``copied``: their places in the copy)
            here = copied[np.searchsorted(places, here)]
        else:  # side by side (at most as many bytes between them as theirs): the segment's bytes as they are
            found = log.span(seg_start, low, high)
        if found is None:
            row = int(rows[0])
            raise RecordCorruptError(f"queue {queues[int(which[row])]} offset {int(offsets[row])}: commitlog segment "
                                     f"{seg_start} is missing or short")
        buffer, at = found
        here -= at
        low, high = int(here.min()), int((here + lengths).max())
        pieces.append((buffer, low, high))
        rel[rows] = here - low + base
        base += high - low
    if len(pieces) == 1:  # (no copy: mostly the segment's map)
        buffer, low, _ = pieces[0]
        rel += low
    else:
        buffer = b"".join(memoryview(piece)[lo:hi] for piece, lo, hi in pieces)
    built = _record_columns(queues[int(which[0])], int(offsets[0]), buffer, rel, sizes, names, None)
    if "queue" in names:
        built["queue"] = _strings([q.encode() for q in queues], which)
    if "offset" in names:
        built["offset"] = pa.array(offsets)
    if "timestamp" in names:
        built["timestamp"] = pa.array(entries["store_ts"].astype(np.int64) * 1000, pa.timestamp("us", tz="UTC"))
    return pa.RecordBatch.from_arrays([built[name] for name in names], schema=schema)


def _strings(values: list[bytes], which: np.ndarray) -> pa.Array:
    """A string column whose row i is ``values[which[i]]``."""
    lengths = np.array([len(v) for v in values], np.int64)
    row_lengths = lengths[which]
    offsets = np.concatenate(([0], np.cumsum(row_lengths))).astype(np.int32)
    runs = np.flatnonzero(np.diff(which)) + 1  # rows of one value in a row: one repeat each
    cuts = [0, *runs.tolist(), len(which)]
    data = b"".join(values[int(which[a])] * (b - a) for a, b in itertools.pairwise(cuts))
    return pa.Array.from_buffers(pa.string(), len(which), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _kept(db: Rdict, qid: int, start: int, stop: int, min_position: int) -> bool:
    """Whether offset ``start``'s entry exists and its record is still in the commitlog (then
    so are those of the offsets after it: retention works from the front)."""
    if stop <= start:
        return True
    raw = db.get(entry_key(qid, start))
    return raw is not None and ENTRY_VALUE.unpack(raw)[0] >= min_position


def read_range_live(db: Rdict, log: CommitLogReader, commitlog: CommitLog, queue: str, qid: int, start: int,
                    stop: int, schema: pa.Schema = ARROW_SCHEMA, topic: str | None = None) -> RangeRead:
    """``read_range`` for the gateway's own store, from a worker thread: ``min_position`` comes
    from the store's commitlog (the authority), new segments from ``log.refresh()``."""
    (result,), batches = read_ranges_live(db, log, commitlog, [(queue, qid, start, stop, topic)], schema)
    result.batches = batches
    return result


def read_ranges_live(db: Rdict, log: CommitLogReader, commitlog: CommitLog,
                     ranges: Iterable[tuple[str, int, int, int, str | None]],
                     schema: pa.Schema = ARROW_SCHEMA) -> tuple[list[RangeRead], list[pa.RecordBatch]]:
    """``read_ranges`` for the gateway's own store, as ``read_range_live``."""
    if log.min_position != commitlog.min_position:
        log.refresh()  # retention deleted segments: let go of their maps (they hold disk space)
    return read_ranges(db, log, ranges, commitlog.min_position, schema)


def _follow_releases(queue: str, first_offset: int, entries: np.ndarray, log: CommitLogReader) -> np.ndarray:
    """Entries whose record is a release (holds/codec.py) made to point at the held message it names
    (so a queue's rows may step back in the commitlog: ``_joined_batch`` reads by segment)."""
    sizes = entries["size"]
    indirect = np.flatnonzero(sizes & INDIRECT)
    if not len(indirect):
        return entries
    entries = entries.copy()
    for i in indirect.tolist():
        position, size = int(entries["position"][i]), int(sizes[i]) & ~INDIRECT
        seg_start = position - position % log.segment_size
        found = log.span(seg_start, position - seg_start, position - seg_start + size)
        if found is None:
            raise RecordCorruptError(f"queue {queue} offset {first_offset + i}: commitlog segment {seg_start} is missing or short")
        buffer, base = found
        at = position - seg_start - base
        body_len = int.from_bytes(buffer[at + 42:at + 46], "big")  # the header's body_len (log/record.py)
        control = ControlRecord(bytes(buffer[at + size - body_len:at + size]))
        entries["position"][i] = control.target
        entries["size"][i] = control.target_size
    return entries


def _gather(log: CommitLogReader, seg_start: int, rel: np.ndarray, sizes: np.ndarray) -> tuple[bytes, int] | None:
    """Records of one segment (at ``rel``, in order) that lie far apart, copied together: one
    read per cluster of records less than ``GATHER_GAP`` apart. As ``CommitLogReader.span``
    answers, (buffer, base), with the records now at ``rel - base`` once ``rel`` is rewritten
    to their places in the copy (done here, in place); None if the segment is short."""
    ends = rel + sizes
    apart = np.flatnonzero((rel[1:] - ends[:-1] > GATHER_GAP) | (rel[1:] < ends[:-1])) + 1
    cuts = list(itertools.pairwise([0, *apart.tolist(), len(rel)]))
    starts, stops = rel.tolist(), ends.tolist()
    clusters = log.pieces(seg_start, [(min(starts[lo:hi]), max(stops[lo:hi])) for lo, hi in cuts])
    if clusters is None:
        return None
    parts = []
    for (lo, hi), data in zip(cuts, clusters):
        if hi - lo == 1:
            parts.append(data)
            continue
        base = min(starts[lo:hi])
        parts.extend(data[at - base:end - base] for at, end in zip(starts[lo:hi], stops[lo:hi]))
    rel[:] = np.concatenate(([0], np.cumsum(sizes)[:-1])) if len(sizes) else sizes
    return b"".join(parts), 0


def _batch(queue: str, first_offset: int, n: int, entries: np.ndarray | None, buffer, rel: np.ndarray | None,
           sizes: np.ndarray | None, schema: pa.Schema, topic: str | None) -> pa.RecordBatch:
    """``n`` rows from ``first_offset`` with the columns of ``schema``: ``entries`` (their index
    entries) is None when no column needs them, ``buffer`` (the commitlog bytes, records at
    ``rel``) when no column needs a record; ``topic``: every row's (``read_range``)."""
    names = schema.names
    built: dict[str, pa.Array] = {}
    if "queue" in names:
        built["queue"] = _constant_string(queue, n)
    if "offset" in names:
        built["offset"] = pa.array(np.arange(first_offset, first_offset + n, dtype=np.int64))
    if "timestamp" in names:
        assert entries is not None
        built["timestamp"] = pa.array(entries["store_ts"].astype(np.int64) * 1000, pa.timestamp("us", tz="UTC"))
    if buffer is not None:
        assert rel is not None and sizes is not None  # (given with the buffer)
        built.update(_record_columns(queue, first_offset, buffer, rel, sizes, names, topic))
    if topic is not None and "topic" in names and "topic" not in built:
        built["topic"] = _constant_string(topic, n)
    return pa.RecordBatch.from_arrays([built[name] for name in names], schema=schema)


def _record_columns(queue: str, first_offset: int, buffer, rel: np.ndarray, sizes: np.ndarray,
                    names: list[str], topic: str | None) -> dict[str, pa.Array]:
    """The columns of ``names`` that are cut out of the records (RECORD_COLUMNS,
    ``store/log/record_columns.py``); the topic only without ``topic`` (every row's), or where a
    record's topic is not it."""
    lo = int(rel.min())  # (the first row's, but for released held messages: _follow_releases)
    hi = int((rel + sizes).max())
    fields = sum(bit for name, bit in _FIELDS.items() if name in names)
    with memoryview(buffer) as view:  # (no copy of the buffer: mostly the segment's map)
        cut = record_columns.cut(view[lo:hi], rel - lo, sizes, fields, None if topic is None else topic.encode(),
                                 queue, first_offset)
    n = len(rel)
    out: dict[str, pa.Array] = {}
    for name, column, kind in (("topic", cut[0], pa.string()), ("key", cut[1], pa.string()),
                               ("properties", cut[2], pa.binary()), ("payload", cut[3], pa.binary())):
        if column is not None:
            offsets, data, valid = column
            validity = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
            out[name] = pa.Array.from_buffers(kind, n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)])
    if "properties" in out:
        out["properties"] = _properties(out["properties"])
    if cut[4] is not None:
        out["born_timestamp"] = pa.array(cut[4] * 1000, pa.timestamp("us", tz="UTC"))
    return out


_FIELDS = {"topic": record_columns.TOPIC, "key": record_columns.KEY, "properties": record_columns.PROPERTIES,
           "payload": record_columns.PAYLOAD, "born_timestamp": record_columns.BORN}


def _constant_string(value: str, n: int) -> pa.Array:
    raw = value.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(raw)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)])


_MAP_TYPE = pa.map_(pa.string(), pa.string())


def _properties(blocks: pa.Array) -> pa.Array:
    """Encoded property blocks -> a map column, decoding each distinct block once."""
    encoded = pc.dictionary_encode(blocks)
    offsets = [0]
    names: list[str] = []
    values: list[str] = []
    for block in encoded.dictionary.to_pylist():
        props = decode_properties(block)
        names.extend(props)
        values.extend(props.values())
        offsets.append(len(names))
    unique = pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(names, pa.string()),
                                     pa.array(values, pa.string()), type=_MAP_TYPE)
    return unique.take(encoded.indices)


def arrow_stream(batches: list[pa.RecordBatch], schema: pa.Schema = ARROW_SCHEMA) -> pa.Buffer:
    """Batches as one Arrow IPC stream (schema first, also when there are no batches)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue()

