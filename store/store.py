"""MessageStore: the unified store's public API (put, get, offsets, notify, KV tables).

Writes go through one committer task (group commit): every ``put`` waiting when the
committer wakes is encoded, appended to the commitlog in one write, made durable per
the flush mode (one fdatasync for the whole group in ``sync`` mode), indexed in one
RocksDB WriteBatch, and only then acknowledged and announced on notify.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Iterable, Sequence

from .commitlog import CommitLog
from .consumequeue import (
    ENTRY_VALUE,
    QID_MASK,
    ConsumeQueueIndex,
    QueueState,
)
from .dispatcher import Dispatcher
from .errors import (
    InvalidMessageError,
    MessageTooLargeError,
    RecordCorruptError,
    StoreClosedError,
    StoreError,
    StoreWriteError,
)
from .keyindex import key_prefixes
from .keyindex import scan as scan_keys
from .lock import DirectoryLock
from .message import (
    TAGS_PROPERTY,
    GetResult,
    GetStatus,
    Message,
    PutResult,
    StoredMessage,
    tag_hash,
)
from .meta import KvTable, MetaStore
from .msgid import decode_msg_id, make_store_identity, msg_id_prefix
from .notify import NotifyHub, NotifySubscription
from .options import StoreOptions
from .record import (
    FIXED_SIZE,
    HEADER_SIZE,
    RecordView,
    assemble,
    encode_properties,
    encode_static,
    queue_slots_of,
)
from .recovery import RecoveryReport, recover
from .retention import RetentionPolicy
from .rocks import RocksMemory
from .stats import LatencyHistogram

log = logging.getLogger("tidemq.store")

_READ_AHEAD = 4096


class _Prepared:
    """A message encoded as far as it can be before the committer gives it queue offsets."""

    __slots__ = ("body", "born", "flag", "index_keys", "queues", "size", "slots", "static", "tag_hash")

    def __init__(self, message: Message, queues: Sequence[str], max_size: int) -> None:
        if not queues:
            raise InvalidMessageError("a message needs at least one target queue")
        body = message.body
        if type(body) is not bytes:
            if not isinstance(body, (bytearray, memoryview)):
                raise InvalidMessageError("message body must be bytes")
            body = bytes(body)
        props = message.properties
        encoded = message.encoded_properties
        if encoded is not None:
            props = None
        if message.tags:
            if encoded is not None:  # an encoding is a run of pairs: the tags pair can follow
                encoded += encode_properties({TAGS_PROPERTY: message.tags})
            else:
                props = {**(props or {}), TAGS_PROPERTY: message.tags}
            self.tag_hash = tag_hash(message.tags)
        else:
            self.tag_hash = 0
        self.slots, slots_len = queue_slots_of(queues)
        self.static = static = encode_static(
            message.topic.encode(), message.key.encode() if message.key else b"",
            encoded if encoded is not None else encode_properties(props) if props else b"", len(queues), len(body),
        )
        self.body = body
        self.born = message.born_timestamp if message.born_timestamp is not None else time.time_ns() // 1_000_000
        if not 0 <= message.flag <= 0xFFFF_FFFF:
            raise InvalidMessageError("message flag must fit in 32 bits")
        self.flag = message.flag
        self.index_keys = key_prefixes(message.topic, message.key) if message.key else ()
        self.queues = queues
        self.size = FIXED_SIZE + len(static) + slots_len + len(body)
        if self.size > max_size:
            raise MessageTooLargeError(f"message of {self.size} bytes exceeds the limit of {max_size}")


MIN_OFFSET_CACHE = 65_536  # queues whose first offset is remembered
# entries a filtered get examines at most (RocketMQ scans 16,000 bytes of consume queue: 800)
FILTER_SCAN = 800


class MessageStore:
    """Open with ``await MessageStore.open(options)``; close with ``await store.close()``."""

    def __init__(self, options: StoreOptions) -> None:
        self.options = options
        self._lock = DirectoryLock(options.data_dir)
        self._identity = make_store_identity(options.identity_host, options.identity_port)
        self._id_prefix = msg_id_prefix(self._identity)
        self.notify = NotifyHub()
        self._pending: list[tuple[list[_Prepared], asyncio.Future[list[PutResult]]]] = []
        self._backlog = 0  # messages submitted and not yet durable (or failed)
        self._pending_since: list[float] = []  # perf_counter() of each entry of _pending
        self.put_latency = LatencyHistogram()  # submit -> durable (or failed), per put call
        self.get_latency = LatencyHistogram()  # get_now, reads the index and the commitlog
        self._wakeup = asyncio.Event()
        self._closing = False
        self._closed = False
        self._write_failure: StoreError | None = None
        self._dirty_offsets: dict[tuple[str, str], int] = {}
        self._min_offsets: dict[int, tuple[int, int]] = {}  # qid -> (commitlog start, first offset)
        self._tasks: list[asyncio.Task[None]] = []
        self.recovery: RecoveryReport | None = None
        self.retention = RetentionPolicy(options.retention_hours, options.retention_bytes)

    # -- lifecycle ---------------------------------------------------------------------------
    @classmethod
    async def open(cls, options: StoreOptions) -> MessageStore:
        store = cls(options)
        store._open_files()
        return store

    def _open_files(self) -> None:
        opts = self.options
        opts.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        try:
            self.commitlog = CommitLog(opts.data_dir / "commitlog", opts.segment_size)
            self.rocks_memory = RocksMemory(opts.rocksdb_cache_bytes, opts.rocksdb_write_buffer_bytes)
            self.index = ConsumeQueueIndex(opts.data_dir / "index", cache_entries=opts.queue_cache_entries,
                                           memory=self.rocks_memory)
            self.meta = MetaStore(opts.data_dir / "meta", sync=opts.flush == "sync", memory=self.rocks_memory)
            self.dispatcher = Dispatcher(self.index, self.notify)
            started = time.monotonic()
            self.recovery = recover(self.commitlog, self.index, self.dispatcher, repair=opts.repair)
            if self.recovery.records_redispatched or self.recovery.torn_bytes_dropped:
                self.commitlog.flush()
                self.index.flush()
            log.info(
                "store opened data_dir=%s end_position=%d redispatched=%d seconds=%.2f",
                opts.data_dir, self.commitlog.end_position, self.recovery.records_redispatched,
                time.monotonic() - started,
            )
        except BaseException:
            self._close_files()
            raise
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._run_committer(), name="store-committer"))
        if opts.flush == "async":
            self._tasks.append(loop.create_task(self._every(opts.flush_interval, self._flush_commitlog)))
        self._tasks.append(loop.create_task(self._every(opts.checkpoint_interval, self._checkpoint_offsets)))
        self._tasks.append(loop.create_task(self._every(opts.index_flush_interval, self._flush_index)))
        if self.retention.enabled:
            self._tasks.append(loop.create_task(self._every(opts.retention_check_interval, self.apply_retention)))

    def _close_files(self) -> None:
        for name in ("meta", "index", "commitlog"):
            part = getattr(self, name, None)
            if part is not None:
                part.close()
        self._lock.release()

    async def close(self) -> None:
        """Stop accepting puts, finish the pending ones, flush, checkpoint and close."""
        if self._closed:
            return
        self._closing = True
        self._wakeup.set()
        committer, periodic = self._tasks[0], self._tasks[1:]
        for task in periodic:
            task.cancel()
        await asyncio.gather(*periodic, return_exceptions=True)
        await committer
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self.commitlog.flush)
            await loop.run_in_executor(None, self.index.flush)
            self._checkpoint_offsets_now()
            self.meta.flush()
        finally:
            self.notify.close()
            self._close_files()
            self._closed = True
            log.info("store closed data_dir=%s", self.options.data_dir)

    async def _every(self, interval: float, job) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await job()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("store maintenance job failed job=%s", getattr(job, "__name__", job))

    # -- writing -----------------------------------------------------------------------------
    async def put(self, message: Message, queues: Sequence[str]) -> PutResult:
        """Store one message, indexed into every queue in ``queues``; durable when it returns."""
        return (await self._submit([_Prepared(message, queues, self.options.max_message_size)]))[0]

    async def put_batch(self, items: Iterable[tuple[Message, Sequence[str]]]) -> list[PutResult]:
        return await self.put_batch_nowait(items)

    def put_batch_nowait(self, items: Iterable[tuple[Message, Sequence[str]]]) -> asyncio.Future[list[PutResult]]:
        """Submit messages for one group commit and return at once; the future resolves when
        they are durable per the flush mode. Futures resolve in submission order, so a
        gateway can acknowledge in the order its client sent (no task per message).

        Raises InvalidMessageError / MessageTooLargeError before anything is submitted.
        """
        limit = self.options.max_message_size
        prepared = [_Prepared(m, q, limit) for m, q in items]
        if not prepared:
            done: asyncio.Future[list[PutResult]] = asyncio.get_running_loop().create_future()
            done.set_result([])
            return done
        return self._submit(prepared)

    def _submit(self, prepared: list[_Prepared]) -> asyncio.Future[list[PutResult]]:
        if self._closing:
            raise StoreClosedError("the store is closing")
        if self._write_failure is not None:
            raise StoreWriteError(f"the store refuses writes after an index failure: {self._write_failure}")
        fut: asyncio.Future[list[PutResult]] = asyncio.get_running_loop().create_future()
        self._pending.append((prepared, fut))
        self._pending_since.append(time.perf_counter())
        self._backlog += len(prepared)
        self._wakeup.set()
        return fut

    async def _run_committer(self) -> None:
        while True:
            if not self._pending:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch, self._pending = self._pending, []
            since, self._pending_since = self._pending_since, []
            try:
                await self._commit(batch)
            except Exception as exc:  # never let one bad batch stop the committer
                log.exception("commit failed")
                _fail(batch, exc if isinstance(exc, StoreError) else StoreWriteError(str(exc)))
            finally:
                self._backlog -= sum(len(prepared) for prepared, _ in batch)
                now = time.perf_counter()
                observe = self.put_latency.observe
                for submitted in since:
                    observe(now - submitted)

    @property
    def msg_id_prefix(self) -> str:
        """The first half of every message id of this store (``prefix + f"{position:016X}"``)."""
        return self._id_prefix

    @property
    def queue_count(self) -> int:
        """Queues ever created (ids are never reused)."""
        return self.index.queues_created

    @property
    def memtable_bytes(self) -> int:
        """Memory RocksDB holds in write buffers (index and metadata): it grows until a buffer
        is flushed, so a process's memory saw-tooths with it; bounded by their configuration."""
        total = 0
        for db in (self.index.db, self.meta.db):
            try:
                total += db.property_int_value("rocksdb.cur-size-all-mem-tables") or 0
            except Exception:  # a closed database, or no such property: nothing to count
                pass
        return total

    @property
    def dispatch_lag_bytes(self) -> int:
        """Commitlog bytes written and not yet in the consume-queue index."""
        return self.commitlog.end_position - self.index.dispatched_position

    @property
    def backlog(self) -> int:
        """Messages submitted and not yet durable: how far the writer is behind its callers."""
        return self._backlog

    def disk_free_bytes(self) -> int:
        """Free space on the file system holding the data directory."""
        return shutil.disk_usage(self.options.data_dir).free

    async def _commit(self, batch: list[tuple[list[_Prepared], asyncio.Future[list[PutResult]]]]) -> None:
        store_ts = _now_ms()
        cache_get = self.index.cache.get
        resolve = self.index.resolve
        assigned: dict[str, int] = {}  # queue -> pack_state() for the next message in this batch
        records: list[bytes] = []
        placed: list[tuple[_Prepared, list[tuple[str, int, int]], list[int]]] = []
        for prepared, _ in batch:
            for p in prepared:
                targets = []
                offsets = []
                for name in p.queues:
                    packed = assigned.get(name) or cache_get(name) or resolve(name)
                    assigned[name] = packed + (1 << 32)
                    offset = packed >> 32
                    targets.append((name, packed & QID_MASK, offset))
                    offsets.append(offset)
                records.append(assemble(p.size, p.static, p.slots, offsets, p.body, p.born, store_ts, p.flag))
                placed.append((p, targets, offsets))

        positions = self.commitlog.append(records)  # StoreWriteError: nothing was written
        if self.options.flush == "sync":
            try:
                await asyncio.get_running_loop().run_in_executor(None, self.commitlog.flush)
            except StoreWriteError:
                self.commitlog.truncate(positions[0])
                raise
        items = [
            (pos, p.size, p.tag_hash, store_ts, targets, p.index_keys) for pos, (p, targets, _) in zip(positions, placed)
        ]
        try:
            self.dispatcher.dispatch(items, self.commitlog.end_position, assigned)
        except Exception as exc:
            # The records are in the commitlog; a restart re-dispatches them. Until then the
            # index cannot advance in order, so refuse further writes rather than reorder.
            self._write_failure = StoreWriteError(f"index write failed: {exc}")
            log.error("index write failed; refusing writes until restart error=%s", exc)
            raise self._write_failure from exc

        id_prefix = self._id_prefix
        i = 0
        for prepared, fut in batch:
            results = []
            for p in prepared:
                pos = positions[i]
                offsets = placed[i][2]
                queues = p.queues
                results.append(
                    PutResult(
                        f"{id_prefix}{pos:016X}", pos, p.size, store_ts,
                        {queues[0]: offsets[0]} if len(offsets) == 1 else dict(zip(queues, offsets)),
                    )
                )
                i += 1
            if not fut.done():
                fut.set_result(results)

    async def _flush_commitlog(self) -> None:
        if self.commitlog.end_position > self.commitlog.flushed_position:
            await asyncio.get_running_loop().run_in_executor(None, self.commitlog.flush)

    async def _flush_index(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.commitlog.flush)
        await loop.run_in_executor(None, self.index.flush)

    # -- reading -----------------------------------------------------------------------------
    async def get(self, queue: str, offset: int, max_messages: int = 32, max_bytes: int = 4 << 20,
                  tag_hashes: frozenset[int] | None = None) -> GetResult:
        """Read up to ``max_messages`` (at least one, at most ``max_bytes`` after the first)."""
        return self.get_now(queue, offset, max_messages, max_bytes, tag_hashes)

    def get_now(self, queue: str, offset: int, max_messages: int = 32, max_bytes: int = 4 << 20,
                tag_hashes: frozenset[int] | None = None) -> GetResult:
        """``get`` without awaiting. With ``tag_hashes``, only messages whose tag hash is in the
        set are read (RocketMQ's consume-queue filter: the commitlog is not touched for the
        others); when a scan of up to FILTER_SCAN entries matches nothing, the status is
        NO_MATCHED_MESSAGE and ``next_offset`` moves past what was scanned."""
        started = time.perf_counter()
        try:
            return self._get_now(queue, offset, max_messages, max_bytes, tag_hashes)
        finally:
            self.get_latency.observe(time.perf_counter() - started)

    def _get_now(self, queue: str, offset: int, max_messages: int, max_bytes: int,
                 tag_hashes: frozenset[int] | None) -> GetResult:
        state = self.index.lookup(queue)
        if state is None:
            return GetResult(GetStatus.NO_SUCH_QUEUE, [], 0, 0, 0)
        qid = state.qid
        max_offset = state.next_offset
        if offset >= max_offset or offset < 0:
            if offset < 0:
                low = self._min_offset(state)
                return GetResult(GetStatus.OFFSET_TOO_SMALL, [], low, low, max_offset)
            status = GetStatus.NO_NEW_MESSAGE if offset == max_offset else GetStatus.OFFSET_OVERFLOW
            return GetResult(status, [], max_offset, self._min_offset(state), max_offset)
        if tag_hashes is not None:
            return self._get_filtered(state, queue, offset, max_messages, max_bytes, tag_hashes)
        count = min(max_messages, max_offset - offset)
        raws = self.index.entries(qid, offset, count)
        min_position = self.commitlog.min_position
        unpack = ENTRY_VALUE.unpack
        entries = []
        for raw in raws:
            if raw is None:
                break
            entry = unpack(raw)
            if entry[0] < min_position:
                break
            entries.append(entry)
        if not entries:
            low = self._min_offset(state)
            if offset < low:
                return GetResult(GetStatus.OFFSET_TOO_SMALL, [], low, low, max_offset)
            return GetResult(GetStatus.NO_NEW_MESSAGE, [], offset, low, max_offset)
        messages = self._read_entries(queue, range(offset, offset + len(entries)), entries, max_bytes)
        return GetResult(GetStatus.FOUND, messages, offset + len(messages), self._min_offset(state), max_offset)

    def _get_filtered(self, state: QueueState, queue: str, offset: int, max_messages: int, max_bytes: int,
                      tag_hashes: frozenset[int]) -> GetResult:
        max_offset = state.next_offset
        low = self._min_offset(state)
        if offset < low:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, [], low, low, max_offset)
        raws = self.index.entries(state.qid, offset, min(FILTER_SCAN, max_offset - offset))
        unpack = ENTRY_VALUE.unpack
        offsets: list[int] = []
        entries = []
        scanned_to = offset
        for i, raw in enumerate(raws):
            if raw is None:
                break
            entry = unpack(raw)
            scanned_to = offset + i + 1
            if entry[2] in tag_hashes:
                offsets.append(offset + i)
                entries.append(entry)
                if len(entries) >= max_messages:
                    break
        if not entries:
            return GetResult(GetStatus.NO_MATCHED_MESSAGE, [], scanned_to, low, max_offset)
        messages = self._read_entries(queue, offsets, entries, max_bytes)
        if len(messages) < len(entries):  # cut short by max_bytes: go on after the last one read
            scanned_to = messages[-1].queue_offset + 1
        return GetResult(GetStatus.FOUND, messages, scanned_to, low, max_offset)

    def _read_entries(
        self, queue: str, offsets: Sequence[int], entries: list[tuple[int, int, int, int]], max_bytes: int
    ) -> list[StoredMessage]:
        # Coalesce entries that sit back to back in the commitlog into one pread.
        spans: list[tuple[int, int, int]] = []  # (position, end, entry count)
        total = 0
        for position, size, _, _ in entries:
            if spans and total + size > max_bytes:
                break
            total += size
            if spans and spans[-1][1] == position:
                start, _, n = spans[-1]
                spans[-1] = (start, position + size, n + 1)
            else:
                spans.append((position, position + size, 1))
        id_prefix = self._id_prefix
        messages: list[StoredMessage] = []
        i = 0
        for start, end, n in spans:
            buf = self.commitlog.read(start, end - start)
            at = 0
            for _ in range(n):
                position, size, tag, _ = entries[i]
                try:
                    view = RecordView(buf, at)
                except (RecordCorruptError, IndexError, ValueError) as exc:
                    raise RecordCorruptError(
                        f"record at commitlog position {position} of queue {queue} offset {offsets[i]}: {exc}"
                    ) from None
                messages.append(_stored(view, id_prefix, position, queue, offsets[i], tag))
                at += size
                i += 1
        return messages

    async def get_by_id(self, msg_id: str) -> StoredMessage | None:
        """The message a message id names, or None (unknown, or removed by retention)."""
        try:
            _, _, position = decode_msg_id(msg_id)
        except ValueError:
            return None
        return self.read_at(position)

    def query_by_key(self, topic: str, key: str, *, max_messages: int = 32, begin_ms: int = 0,
                     end_ms: int = 1 << 62) -> list[StoredMessage]:
        """Messages of ``topic`` stored with ``key`` (one of their space-separated keys) within
        [begin_ms, end_ms], oldest first, at most ``max_messages`` (the newest ones)."""
        positions, stale = scan_keys(self.index.db, topic, key, min_position=self.commitlog.min_position,
                                     begin_ms=begin_ms, end_ms=end_ms, limit=max_messages)
        if stale:
            self.index.delete_keys(stale)
        found = (self.read_at(position) for position in positions)
        # (a repair that cut the commitlog can leave entries naming re-used positions: check)
        return [m for m in found if m is not None and m.topic == topic and key in m.key.split(" ")]

    def read_at(self, position: int) -> StoredMessage | None:
        if position < self.commitlog.min_position or position >= self.commitlog.end_position:
            return None
        buf = self.commitlog.read(position, _READ_AHEAD)
        if len(buf) < HEADER_SIZE:
            return None
        size = int.from_bytes(buf[:4], "big")
        if size > len(buf):
            buf = self.commitlog.read(position, size)
        try:
            view = RecordView(buf, 0)
        except (RecordCorruptError, IndexError, ValueError):
            return None
        return _stored(view, self._id_prefix, position, "", -1, 0)

    async def max_offset(self, queue: str) -> int:
        return self.max_offset_now(queue)

    def max_offset_now(self, queue: str) -> int:
        """The offset the queue's next message will get (0 for a queue never written)."""
        state = self.index.lookup(queue)
        return state.next_offset if state is not None else 0

    async def min_offset(self, queue: str) -> int:
        return self.min_offset_now(queue)

    def min_offset_now(self, queue: str) -> int:
        """The first offset still readable (0 for a queue never written)."""
        state = self.index.lookup(queue)
        return self._min_offset(state) if state is not None else 0

    def _min_offset(self, state: QueueState) -> int:
        # A queue's first offset moves only when retention cuts the commitlog: remembered per
        # queue until the commitlog's start moves (an index seek per read cost ~5 % of a read).
        floor = self.commitlog.min_position
        known = self._min_offsets.get(state.qid)
        if known is not None and known[0] == floor:
            return known[1]
        first = self.index.first_offset(state.qid)
        if first is None:
            return state.next_offset  # empty: not remembered, it moves with the next put
        entry = self.index.entry(state.qid, first)
        if entry is None or entry[0] < floor:
            first = self.index.first_offset_at_or_after_position(state.qid, first, state.next_offset, floor)
        if len(self._min_offsets) >= MIN_OFFSET_CACHE:
            self._min_offsets.clear()
        self._min_offsets[state.qid] = (floor, first)
        return first

    async def offset_for_timestamp(self, queue: str, timestamp_ms: int) -> int:
        """The first offset whose message was stored at or after ``timestamp_ms`` (max offset if none)."""
        state = self.index.lookup(queue)
        if state is None:
            return 0
        low = self._min_offset(state)
        return self.index.first_offset_at_or_after_time(state.qid, low, state.next_offset, timestamp_ms)

    def subscribe_notify(self) -> NotifySubscription:
        """Coalesced ``(queue, max_offset)`` events, after each dispatch."""
        return self.notify.subscribe()

    # -- consumer offsets and tables ----------------------------------------------------------
    async def commit_offset(self, consumer: str, queue: str, offset: int) -> None:
        """Remember a consumer's position; persisted by the periodic checkpoint and on close."""
        self.commit_offset_now(consumer, queue, offset)

    def commit_offset_now(self, consumer: str, queue: str, offset: int) -> None:
        if not 0 <= offset < 1 << 63:
            raise ValueError(f"a consumer offset is a non-negative 63-bit number, not {offset}")
        self._dirty_offsets[(consumer, queue)] = offset

    def get_offset_now(self, consumer: str, queue: str) -> int | None:
        offset = self._dirty_offsets.get((consumer, queue))
        if offset is None:
            offset = self.meta.load_offset(consumer, queue)
        return offset

    async def get_offset(self, consumer: str, queue: str) -> int | None:
        return self.get_offset_now(consumer, queue)

    async def _checkpoint_offsets(self) -> None:
        self._checkpoint_offsets_now()

    def _checkpoint_offsets_now(self) -> None:
        if self._dirty_offsets:
            dirty, self._dirty_offsets = self._dirty_offsets, {}
            try:
                self.meta.save_offsets(dirty)
            except Exception:
                dirty.update(self._dirty_offsets)
                self._dirty_offsets = dirty
                raise

    def table(self, name: str) -> KvTable:
        """A durable str -> bytes table (retained messages, sessions, metadata)."""
        return self.meta.table(name)

    # -- retention -----------------------------------------------------------------------------
    async def apply_retention(self) -> int:
        """Delete whole segments by age/size, then drop index entries below the new minimum."""
        doomed = self.retention.segments_to_delete(self.commitlog.segments(), time.time())
        if not doomed:
            return 0
        freed = sum(self.commitlog.delete_segment(seg.start) for seg in doomed)
        log.info(
            "retention deleted segments=%d bytes=%d min_position=%d",
            len(doomed), freed, self.commitlog.min_position,
        )
        await self._clean_index_below(self.commitlog.min_position)
        return len(doomed)

    async def _clean_index_below(self, min_position: int) -> None:
        for n, (state, _) in enumerate(self.index.iter_queues()):
            first = self.index.first_offset(state.qid)
            if first is None:
                continue
            entry = self.index.entry(state.qid, first)
            if entry is not None and entry[0] >= min_position:
                continue
            keep = self.index.first_offset_at_or_after_position(state.qid, first, state.next_offset, min_position)
            self.index.delete_below(state.qid, keep)
            if n % 1024 == 1023:
                await asyncio.sleep(0)

    # -- introspection -------------------------------------------------------------------------
    @property
    def end_position(self) -> int:
        return self.commitlog.end_position

    @property
    def min_position(self) -> int:
        return self.commitlog.min_position


def _stored(view: RecordView, id_prefix: str, position: int, queue: str, offset: int, tag: int) -> StoredMessage:
    return StoredMessage(
        f"{id_prefix}{position:016X}",
        position,
        view.size,
        view.topic,
        view.key,
        view.body,
        view.born_ts,
        view.store_ts,
        view.raw_properties,
        view.raw_queues,
        view.queue_count,
        queue,
        offset,
        tag,
        view.flags,
    )


def _fail(batch, exc: BaseException) -> None:
    for _, fut in batch:
        if not fut.done():
            fut.set_exception(exc)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000

