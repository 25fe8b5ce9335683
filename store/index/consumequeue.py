"""Consume-queue index in RocksDB (WAL off: the commitlog is the log).

Key spaces of the index database:

    b"q" + qid u32 + offset u64   -> position u64, size u32, tag_hash i64, store_ts i64
    b"q" + qid u32 + 2**64-1      -> the queue's head: next_offset u64, last_position u64
    b"n" + queue name (UTF-8)     -> qid u32, next_offset u64, last_position u64
    b"\\x00checkpoint"            -> dispatched position u64, next qid u32

Queue ids are compact integers handed out on first write (light queues: no
registration), so entry keys stay 13 bytes whatever the queue name. The name row is
written once, when the queue is created (data dirs of earlier versions also kept the
queue's offsets in it, rewritten with every batch). Where a queue ends is said by its
newest entry; when retention removes that entry (or a truncation cuts the queue back), it
writes the queue's head key first, which sorts after every entry of the queue, so that a
queue whose entries are all gone still knows its next offset. ``queue_end`` takes the
largest of the three (row, head, newest entry). Writing the head with every batch, as
earlier versions did, cost one more key per message at random queues (1,000,000 random
queues: 0.4 us of the loop's CPU and 1.2 us of RocksDB's compactions per message).

Entries, new rows and the checkpoint go in ONE WriteBatch; RocksDB applies a
batch atomically and, with one column family and no WAL, flushes whole batches, so after
a crash the checkpoint names exactly the commitlog position up to which entries exist.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Iterator

from rocksdict import Rdict, ReadOptions, WriteBatch, WriteOptions

from ..rocks import INDEX_SHARE, RocksMemory, raw_items, raw_keys, raw_multi_get

ENTRY_PREFIX = b"q"
NAME_PREFIX = b"n"
CHECKPOINT_KEY = b"\x00checkpoint"
# reads of this many entries or more go through one iterator instead of a multi-get
RANGE_READ_FROM = 4

ENTRY_KEY = struct.Struct(">cIQ")
ENTRY_VALUE = struct.Struct(">QIqq")
QUEUE_ROW = struct.Struct(">IQQ")
QUEUE_HEAD = struct.Struct(">QQ")
HEAD_OFFSET = (1 << 64) - 1  # the head key's offset field: past every real offset
CHECKPOINT = struct.Struct(">QI")
_QID = struct.Struct(">I")


def entry_key(qid: int, offset: int) -> bytes:
    return ENTRY_KEY.pack(ENTRY_PREFIX, qid, offset)


def head_key(qid: int) -> bytes:
    return ENTRY_KEY.pack(ENTRY_PREFIX, qid, HEAD_OFFSET)


def queue_prefix(qid: int) -> bytes:
    return ENTRY_PREFIX + _QID.pack(qid)


def queue_end(db: Rdict, qid: int, row: bytes) -> tuple[int, int]:
    """(next offset, position of the newest entry) of a queue not held in memory: the largest
    of what its newest entry, its head key (retention, truncation) and, for a queue last
    written by an earlier version, its name row say."""
    _, next_offset, last_position = QUEUE_ROW.unpack(row)
    prefix = queue_prefix(qid)
    it = db.iter()
    it.seek_for_prev(head_key(qid))
    while it.valid():  # the head if there is one, then the newest entry
        key = it.key()
        if not key.startswith(prefix):
            break
        offset = ENTRY_KEY.unpack(key)[2]
        if offset == HEAD_OFFSET:
            found, position = QUEUE_HEAD.unpack(it.value())
        else:
            found, position = offset + 1, ENTRY_VALUE.unpack_from(it.value())[0]
        if found > next_offset:
            next_offset, last_position = found, position
        if offset != HEAD_OFFSET:
            break
        it.prev()
    return next_offset, last_position


class QueueState:
    """A read-side view of one queue: its compact id and the offset the next message gets."""

    __slots__ = ("qid", "name", "next_offset")

    def __init__(self, qid: int, name: str, next_offset: int) -> None:
        self.qid = qid
        self.name = name
        self.next_offset = next_offset  # offsets below this are dispatched (visible)


def pack_state(qid: int, next_offset: int) -> int:
    """Hot-queue cache value. A plain int, so a cache of a million queues holds no object
    the garbage collector must walk (a QueueState per queue made full collections crawl)."""
    return next_offset << 32 | qid


QID_MASK = 0xFFFF_FFFF


class ConsumeQueueIndex:
    def __init__(self, path: Path, *, cache_entries: int, memory: RocksMemory) -> None:
        path.mkdir(parents=True, exist_ok=True)
        # A put to a queue the hot cache does not hold looks its row up first; for a brand-new
        # light queue that lookup misses, and a bloom filter (of the tables and the memtable)
        # answers a miss without touching the table files (measured: 2.5 -> 0.7 us per miss
        # with a million queues).
        opts = memory.options(share=INDEX_SHARE, bloom=True)
        opts.set_max_background_jobs(2)
        self._db = Rdict(str(path), opts)
        wo = WriteOptions()
        wo.disable_wal = True  # type: ignore[method-assign, assignment]  # (a property: rocksdict's stub calls it a method)
        self._db.set_write_options(wo)
        # name -> pack_state(qid, next_offset); the dispatcher and committer use it directly.
        self.cache: dict[str, int] = {}
        self.created: list[tuple[str, int]] = []  # (name, qid) of queues whose row is not written yet
        self._cache_entries = max(16, cache_entries)
        raw = self._db.get(CHECKPOINT_KEY)
        self.dispatched_position, self._next_qid = CHECKPOINT.unpack(raw) if raw else (0, 1)
        # True while the cache holds every queue of the database (from an empty index until the
        # first trim): a name it lacks is then a new queue, known without a database lookup
        # (1,000,000 random queues, ~630,000 of them new: 1.7 us per message in those misses).
        self._cache_complete = self._next_qid == 1

    @property
    def db(self) -> Rdict:
        return self._db

    # -- queue table ---------------------------------------------------------------------
    def _load(self, name: str) -> int | None:
        packed = self.cache.get(name)
        if packed is None:
            if self._cache_complete:
                return None
            raw = self._db.get(NAME_PREFIX + name.encode())
            if raw is None:
                return None
            qid = _QID.unpack_from(raw)[0]
            packed = self.cache[name] = pack_state(qid, queue_end(self._db, qid, raw)[0])
        return packed

    def lookup_packed(self, name: str) -> int | None:
        """pack_state() of the queue, or None when no queue has that name."""
        return self._load(name)

    def lookup(self, name: str) -> QueueState | None:
        packed = self._load(name)
        if packed is None:
            return None
        return QueueState(packed & QID_MASK, name, packed >> 32)

    def resolve(self, name: str) -> int:
        """pack_state() of the queue, created (light queue: no registration) if it is new.

        A new queue's row reaches the database with the next dispatch.
        """
        packed = self._load(name)
        if packed is None:
            qid = self._next_qid
            packed = self.cache[name] = pack_state(qid, 0)
            self.created.append((name, qid))
            self._next_qid += 1
        return packed

    @property
    def queues_created(self) -> int:
        return self._next_qid - 1

    def trim_cache(self) -> None:
        """Keep the hot-queue cache bounded: drop the oldest-loaded tenth when it is full.

        Only called between dispatches, when every cached state is also in the database
        (queue heads and rows of created queues are written by then).
        """
        cache = self.cache
        if len(cache) > self._cache_entries:
            drop = len(cache) - self._cache_entries + self._cache_entries // 10
            self._cache_complete = False
            for name in [n for n, _ in zip(cache, range(drop))]:
                del cache[name]

    @property
    def cached_queues(self) -> int:
        return len(self.cache)

    def iter_names(self, prefix: str = "", after: str = "") -> Iterator[str]:
        """The names of the queues (rows in the database) starting with ``prefix``, in name
        order, from the first one past ``after`` (a listing's cursor): keys only, no seek per
        queue, for listings that look at names before offsets."""
        start = NAME_PREFIX + prefix.encode()
        first = max(start, NAME_PREFIX + after.encode() + b"\x00") if after else start
        for key in raw_keys(self._db, first):
            if not key.startswith(start):
                break
            yield key[1:].decode()

    def iter_queues(self, prefix: str = "") -> Iterator[tuple[QueueState, int]]:
        """Every queue (whose name starts with ``prefix``) in the table, in name order, with the
        position of its newest entry (database rows)."""
        start = NAME_PREFIX + prefix.encode()
        for key, raw in raw_items(self._db, start):
            if not key.startswith(start):
                break
            qid = _QID.unpack_from(raw)[0]
            name = key[1:].decode()
            next_offset, last_position = queue_end(self._db, qid, raw)
            cached = self.cache.get(name)
            if cached is not None:
                next_offset = cached >> 32
            yield QueueState(qid, name, next_offset), last_position

    # -- writing ---------------------------------------------------------------------------
    def new_batch(self) -> WriteBatch:
        return WriteBatch(raw_mode=True)

    def commit(self, batch: WriteBatch, dispatched_position: int) -> None:
        """Write a batch of entries with the checkpoint that covers them, atomically (and the
        rows of queues created since the last batch)."""
        if self.created:
            for name, qid in self.created:
                batch.put(NAME_PREFIX + name.encode(), QUEUE_ROW.pack(qid, 0, 0))
            self.created = []
        batch.put(CHECKPOINT_KEY, CHECKPOINT.pack(dispatched_position, self._next_qid))
        self._db.write(batch)
        self.dispatched_position = dispatched_position

    def flush(self) -> None:
        """Persist the memtable so recovery restarts from the newest checkpoint."""
        self._db.flush(True)

    # -- reading ---------------------------------------------------------------------------
    def entries(self, qid: int, offset: int, count: int) -> list[bytes | None]:
        """The entries of offsets ``offset`` to ``offset + count`` (None where there is none).
        Several are read with one bounded iterator: consecutive keys, a third of a multi-get's
        cost an entry from four entries on (docs/benchmarks/2026-11-30.md)."""
        if count < RANGE_READ_FROM:
            return raw_multi_get(self._db, [ENTRY_KEY.pack(ENTRY_PREFIX, qid, o) for o in range(offset, offset + count)])
        bounds = ReadOptions()
        bounds.set_iterate_upper_bound(ENTRY_KEY.pack(ENTRY_PREFIX, qid, offset + count))
        found = list(raw_items(self._db, ENTRY_KEY.pack(ENTRY_PREFIX, qid, offset), bounds))
        if len(found) == count:  # (no offset missing: the keys are exactly the range's)
            return [value for _, value in found]
        placed: list[bytes | None] = [None] * count  # (a hole: each value at its own offset)
        for key, value in found:
            placed[ENTRY_KEY.unpack(key)[2] - offset] = value
        return placed

    def entry(self, qid: int, offset: int) -> tuple[int, int, int, int] | None:
        raw = self._db.get(ENTRY_KEY.pack(ENTRY_PREFIX, qid, offset))
        return ENTRY_VALUE.unpack(raw) if raw is not None else None

    def first_offset(self, qid: int) -> int | None:
        """Offset of the first entry still in the index for the queue (may be stale)."""
        prefix = queue_prefix(qid)
        it = self._db.iter()
        it.seek(prefix)
        if it.valid():
            key = it.key()
            if key.startswith(prefix):
                offset = ENTRY_KEY.unpack(key)[2]
                return None if offset == HEAD_OFFSET else offset
        return None

    def first_offset_at_or_after_position(self, qid: int, lo: int, hi: int, position: int) -> int:
        """Binary search [lo, hi) for the first offset whose entry points at or after ``position``."""
        return self._bisect(qid, lo, hi, 0, position)

    def first_offset_at_or_after_time(self, qid: int, lo: int, hi: int, timestamp: int) -> int:
        """Binary search [lo, hi) for the first offset stored at or after ``timestamp`` (ms).

        Store times do not decrease along a queue (one dispatcher writes its entries in
        commitlog order) while the host's clock does not step back; like Kafka's time index,
        the lookup relies on that. An entry found missing (retention) counts as earlier."""
        return self._bisect(qid, lo, hi, 3, timestamp)

    def offset_for_time(self, qid: int, lo: int, hi: int, timestamp: int) -> int | None:
        """Kafka's ``offsetsForTimes`` over [lo, hi): the first offset stored at or after
        ``timestamp``, or None when every one of them is earlier (Kafka answers null there)."""
        found = self.first_offset_at_or_after_time(qid, lo, hi, timestamp)
        return found if found < hi else None

    def _bisect(self, qid: int, lo: int, hi: int, field: int, value: int) -> int:
        # Both position and store time grow with the offset inside one queue.
        while lo < hi:
            mid = (lo + hi) // 2
            e = self.entry(qid, mid)
            if e is None or e[field] < value:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # -- cutting -----------------------------------------------------------------------------
    def delete_below(self, qid: int, offset: int, next_offset: int, last_position: int) -> None:
        """Remove the queue's entries below ``offset`` (retention) with one range delete; when
        that takes its newest entry, its head (``next_offset``, ``last_position``) is written
        first, so that where the queue ends is never lost (WAL off: a crash keeps a prefix of
        these writes, or none)."""
        if offset >= next_offset:
            self._db.put(head_key(qid), QUEUE_HEAD.pack(next_offset, last_position))
        self._db.delete_range(entry_key(qid, 0), entry_key(qid, offset))

    def delete_keys(self, keys: list[bytes]) -> None:
        batch = WriteBatch(raw_mode=True)
        for key in keys:
            batch.delete(key)
        self._db.write(batch)

    def truncate_beyond(self, position: int) -> int:
        """Remove every entry pointing at or past ``position`` (the commitlog was cut there).

        Needed only when the index got ahead of the durable commitlog (a repair, or an OS
        crash in async flush mode). Walks the queue table; returns entries removed.
        """
        removed = 0
        batch = self.new_batch()
        for state, last_position in self.iter_queues():
            if last_position < position or state.next_offset == 0:
                continue
            offset = state.next_offset
            last_position = 0
            while offset > 0:
                e = self.entry(state.qid, offset - 1)
                if e is None:
                    break
                if e[0] < position:
                    last_position = e[0]
                    break
                offset -= 1
            removed += state.next_offset - offset
            self._db.delete_range(entry_key(state.qid, offset), entry_key(state.qid, state.next_offset))
            # the row too: a data dir of an earlier version may hold a larger offset there
            batch.put(NAME_PREFIX + state.name.encode(), QUEUE_ROW.pack(state.qid, offset, last_position))
            batch.put(head_key(state.qid), QUEUE_HEAD.pack(offset, last_position))
            self.cache[state.name] = pack_state(state.qid, offset)
        self.commit(batch, min(self.dispatched_position, position))
        return removed

    def close(self) -> None:
        self._db.close()

