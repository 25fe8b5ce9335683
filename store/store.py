"""MessageStore: the unified store's public API (put, get, offsets, notify, KV tables).

Writes go through one committer task (group commit, write/committer.py): every ``put`` waiting when
the committer wakes is encoded, appended to the commitlog in one write, indexed in one RocksDB
WriteBatch and announced on notify; it is acknowledged once durable per the flush mode (in
``sync`` mode after an fdatasync, while readers may already have it from the page cache).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable, Hashable, Iterable, Sequence

from .write.batching import PreparedMessage
from .log.commitlog import CommitLog
from .write.committer import GroupCommitter, prepare_each
from .write.idempotence import Producer, check_producer, find, forget_before
from .index.consumequeue import ConsumeQueueIndex, QueueState
from .index.dispatcher import Dispatcher
from .index.first_offsets import FirstOffsets
from .errors import (
    InvalidMessageError,
    MessageTooLargeError,
    StoreClosedError,
    StoreError,
    StoreWriteError,
)
from .holds.codec import HELD
from .holds.held_messages import HeldMessages
from .index.keyindex import scan as scan_keys
from .index.keyindex import scan_every_topic
from .clock import now_ms
from .lock import DirectoryLock
from .log_limit import RateLimitedLog
from .messages import (
    GetResult,
    GetStatus,
    Message,
    PutResult,
    StoredMessage,
)
from .meta.tables import KvTable, MetaStore
from .log.msgid import decode_msg_id, make_store_identity, msg_id_prefix
from .index.notify import NotifyHub, NotifySubscription
from .meta.offsets import ConsumerOffsets
from .options import StoreOptions
from .read.queue_reads import read_queue
from .read.reads import record_at
from .log.recovery import RecoveryReport, recover
from .retention.policy import QueuePolicy
from .retention.queues import QueueTrimmer
from .retention.reclaim import QueueReclaimer
from .retention.segments import RetentionPolicy, apply_retention
from .rocks import RocksMemory, property_sum, raw_items, release_free_memory
from .stats import LatencyHistogram
from .read.tail import TailHandoff, TailReader
from .meta.journal import MetaReplay
from .replica.epochs import EpochHistory
from .replica.seed import install_seed

log = logging.getLogger("tidemq.store")

_READ_AHEAD = 4096


OFFSETS_SOON_S = 0.05  # committed consumer offsets are written this soon after the first of them (async flush)


class MessageStore:
    """Open with ``await MessageStore.open(options)``; close with ``await store.close()``."""

    def __init__(self, options: StoreOptions) -> None:
        self.options = options
        self._lock = DirectoryLock(options.data_dir)
        self._identity = make_store_identity(options.identity_host, options.identity_port)
        self._id_prefix = msg_id_prefix(self._identity)
        self.notify = NotifyHub()
        self._log_limited = RateLimitedLog(log)  # failures that repeat with every commit (a full disk)
        self.committer: GroupCommitter | None = None  # the writer (write/committer.py), once the files are open
        self.get_latency = LatencyHistogram()  # get_now, reads the index and the commitlog
        self.memory_release_latency = LatencyHistogram()  # release_free_memory, on the event loop
        self._closed = False
        self._offsets_timer: asyncio.TimerHandle | None = None  # committed offsets to be written (_offsets_soon)
        self._tasks: list[asyncio.Task[None]] = []
        self.recovery: RecoveryReport | None = None
        self.meta_position = 0  # where the last meta change record ends (a replicated leader's)
        self.retention = RetentionPolicy(options.retention_hours, options.retention_bytes)
        self.tail = TailHandoff(self._id_prefix, lambda qid, end: self.first_offsets.of(qid, end),
                                lambda at, n: self.commitlog.read(at, n))

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
            if install_seed(opts.data_dir):  # (a replica seeded by its leader: replica/seed.py)
                log.warning("store files replaced by the seed its replication leader sent data_dir=%s", opts.data_dir)
            self.commitlog = CommitLog(opts.data_dir / "commitlog", opts.segment_size)
            self.epochs = EpochHistory(opts.data_dir)
            self.rocks_memory = RocksMemory(opts.rocksdb_cache_bytes, opts.rocksdb_write_buffer_bytes)
            self.index = ConsumeQueueIndex(opts.data_dir / "index", cache_entries=opts.queue_cache_entries,
                                           memory=self.rocks_memory)
            sync = opts.flush == "sync"
            self.meta = MetaStore(opts.data_dir / "meta", sync=sync, memory=self.rocks_memory,
                                  before_write=self._flush_delivered if sync else None)
            self.dispatcher = Dispatcher(self.index, self.notify)
            self.dispatcher.on_drop = lambda names, position: self.meta.delete_offsets_of(set(names), position)
            started = time.monotonic()
            meta = self.meta
            self.meta_replay = MetaReplay(lambda batch: meta.writes.apply(batch, journal=False))
            self.recovery = recover(self.commitlog, self.index, self.dispatcher, repair=opts.repair,
                                    on_meta=self.meta_replay.apply_records, index_tail=not opts.replicated)
            self.meta_replay.applied = self.commitlog.end_position
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
        self.offsets = ConsumerOffsets(self.meta)
        if opts.flush == "async":  # (sync: an offset waits for the fdatasync of what it names, at the checkpoint)
            self.offsets.soon = self._offsets_soon
        self.first_offsets = FirstOffsets(self.index, lambda: self.commitlog.min_position)
        self.trimmer = QueueTrimmer(self.index, self.first_offsets.forget, lambda at, n: self.commitlog.read(at, n))
        self.dispatcher.on_drop = lambda names, position: self.offsets.forget_queues(set(names), position)
        self.committer = GroupCommitter(self.commitlog, self.index, self.dispatcher, sync=opts.flush == "sync",
                                        id_prefix=self._id_prefix, log_limited=self._log_limited, tail=self.tail,
                                        notify=self.notify)
        self.committer.apply_marks = lambda marks: meta.writes.apply(marks, sync=False)
        # numbered puts not yet answered: their future, or (future, index) for one message of a put
        self._numbered: dict[Producer, asyncio.Future[Sequence[PutResult]] | tuple[asyncio.Future[Sequence[PutResult]], int]] = {}
        self.reclaimer = QueueReclaimer(self.index, self.commitlog, self.dispatcher, self.committer_writable,
                                        self.committer.refuse_writes)
        self.held = HeldMessages(self.index, self._submit, opts.max_message_size, self.dispatcher.hold_changes,
                                 self.dispatcher.hold_earliest)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self.committer.run(), name="store-committer"))
        if opts.flush == "async":
            self._tasks.append(loop.create_task(self._every(opts.flush_interval, self._flush_commitlog)))
        self._tasks.append(loop.create_task(self._every(opts.checkpoint_interval, self._checkpoint_offsets)))
        self._tasks.append(loop.create_task(self._every(60.0, self._forget_marks)))
        self._tasks.append(loop.create_task(self._every(opts.index_flush_interval, self._flush_index)))
        self._tasks.append(loop.create_task(self._every(opts.retention_check_interval, self.apply_retention)))
        self._tasks.append(loop.create_task(self._every(opts.queue_idle_check_interval, self.reclaimer.run)))
        if opts.memory_release_interval:
            self._tasks.append(loop.create_task(self._every(opts.memory_release_interval, self._release_memory)))

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
        assert self.committer is not None
        self.committer.close()
        if self._offsets_timer is not None:
            self._offsets_timer.cancel()
        committer, periodic = self._tasks[0], self._tasks[1:]
        for task in periodic:
            task.cancel()
        await asyncio.gather(*periodic, return_exceptions=True)
        await committer
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self.commitlog.flush)
            await loop.run_in_executor(None, self.index.flush)
            try:
                self._checkpoint_offsets_now()
                self.meta.flush()
            except StoreWriteError as exc:  # (offsets read since the last checkpoint are read again)
                log.error("offsets not saved at close error=%s", exc)
        finally:
            self.notify.close()
            self._log_limited.flush()
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
            except Exception as exc:
                name = getattr(job, "__name__", str(job))
                self._log_limited.log(logging.ERROR, f"{name}:{type(exc).__name__}", "store maintenance job failed job=%s",
                                      name, exc_info=not isinstance(exc, StoreWriteError))

    # -- writing -----------------------------------------------------------------------------
    async def put(self, message: Message, queues: Sequence[str]) -> PutResult:
        """Store one message, indexed into every queue in ``queues``; durable when it returns."""
        return (await self._submit([PreparedMessage(message, queues, self.options.max_message_size)]))[0]

    async def put_batch(self, items: Iterable[tuple[Message, Sequence[str]]]) -> Sequence[PutResult]:
        return await self.put_batch_nowait(items)

    def put_batch_nowait(self, items: Iterable[tuple[Message, Sequence[str]]], *, producer: Producer | None = None,
                         resent: bool = True) -> asyncio.Future[Sequence[PutResult]]:
        """Submit messages for one group commit and return at once; the future resolves when
        they are durable per the flush mode. Futures resolve in submission order, so a
        gateway can acknowledge in the order its client sent (no task per message).

        ``producer``: (id, sequence number) of an idempotent put (write/idempotence.py): a put
        of a number already written is answered as the first time, and not written again.
        ``resent`` False: the producer knows this number was never sent before (it is marked,
        not looked for).

        Raises InvalidMessageError / MessageTooLargeError before anything is submitted.
        """
        if producer is not None and not resent:
            check_producer(producer)
        elif producer is not None:
            answered = self._answered(producer)
            if answered is not None:
                return answered
        limit = self.options.max_message_size
        prepared = [PreparedMessage(m, q, limit) for m, q in items]
        if not prepared:
            done: asyncio.Future[Sequence[PutResult]] = asyncio.get_running_loop().create_future()
            done.set_result([])
            return done
        fut = self._submit(prepared)
        if producer is not None:
            assert self.committer is not None
            self.committer.marks.numbered[fut] = producer
            self._numbered[producer] = fut
            fut.add_done_callback(lambda _: self._numbered.pop(producer, None))
        return fut

    def _answered(self, producer: Producer) -> asyncio.Future[Sequence[PutResult]] | None:
        """A numbered put sent again: the first one's future while it is not answered, or its
        results from its mark once this store holds them as it promises; None: a new put."""
        check_producer(producer)
        if self.committer is not None and (failure := self.committer.failure()) is not None:
            raise failure  # (a follower, or writes refused: not answered from what it holds)
        first = self._numbered.get(producer)
        if isinstance(first, tuple):
            return _one_of(*first)
        if first is not None:
            return first
        db = self.meta.db
        results = find(lambda start: raw_items(db, start), producer, now_ms(), self._id_prefix)
        if results is None:
            return None
        results = [self._with_queue_offsets(result) for result in results]
        answered: asyncio.Future[Sequence[PutResult]] = asyncio.get_running_loop().create_future()
        settling = self.meta_settling()
        if settling is None:
            answered.set_result(results)
        else:
            def settled(f: asyncio.Future[None]) -> None:
                if answered.done():
                    return
                if f.cancelled():
                    answered.cancel()
                elif (exc := f.exception()) is not None:
                    answered.set_exception(exc)
                else:
                    answered.set_result(results)
            settling.add_done_callback(settled)
        return answered

    def _with_queue_offsets(self, result: PutResult) -> PutResult:
        """``result`` with the queue offsets its record was given, as first answered (none for
        a held message, given its offsets when released, nor for a record retention removed)."""
        message = self.read_at(result.position)
        if message is None or message.position != result.position:
            return result
        offsets = {queue: offset for queue, offset in message.queues if offset != HELD}
        return PutResult(result.id_prefix, result.position, result.size, result.store_timestamp, offsets)

    def put_each_nowait(self, items: Sequence[tuple[Message, Sequence[str]]], groups: Sequence[Hashable] | None = None
                        ) -> tuple[asyncio.Future[Sequence[PutResult]], dict[int, StoreError]]:
        """As ``put_batch_nowait``, for callers whose messages are independent (one client's
        publishes read together): a message the store cannot take (too large, invalid) is left
        out alone and named in the second value (its index in ``items`` -> the error); the
        others go to one group commit, whose results follow their order in ``items``. With
        ``groups`` (one key per item: ordered streams, such as an AMQP channel), the later
        messages of a refused message's group are left out too, with the same error, so a
        stream never has a gap. ``put_batch_nowait`` stays all-or-nothing for batches that are
        one unit (a remoting SEND_BATCH). A put of one message to an idle store is committed
        before this returns (write/committer.py: its deliveries leave in the caller's turn)."""
        return self._put_each(items, groups, at_once=True)

    def _put_each(self, items: Sequence[tuple[Message, Sequence[str]]], groups: Sequence[Hashable] | None, *,
                  at_once: bool) -> tuple[asyncio.Future[Sequence[PutResult]], dict[int, StoreError]]:
        limit = self.options.max_message_size
        try:  # every message can be taken, the usual case: one pass, as put_batch_nowait
            prepared = [PreparedMessage(m, q, limit) for m, q in items]
            refused: dict[int, StoreError] = {}
        except (InvalidMessageError, MessageTooLargeError):
            prepared, refused = prepare_each(items, groups, limit)
        if not prepared:
            done: asyncio.Future[Sequence[PutResult]] = asyncio.get_running_loop().create_future()
            done.set_result([])
            return done, refused
        return self._submit(prepared, at_once=at_once), refused

    def put_numbered_nowait(self, items: Sequence[tuple[Message, Sequence[str]]], producers: Sequence[Producer],
                            groups: Sequence[Hashable] | None = None
                            ) -> tuple[asyncio.Future[Sequence[PutResult]], dict[int, StoreError]]:
        """``put_each_nowait`` for messages that are each an idempotent put of its own (one number
        each, never sent before: marked, not looked for), in one group commit; a message sent
        again is looked for alone (``put_batch_nowait``)."""
        for producer in producers:
            check_producer(producer)
        fut, refused = self._put_each(items, groups, at_once=False)  # (marked after the submission: never committed in it)
        kept = [p for i, p in enumerate(producers) if i not in refused] if refused else list(producers)
        if not kept:
            return fut, refused
        assert self.committer is not None
        self.committer.marks.numbered[fut] = kept
        numbered = self._numbered
        for index, producer in enumerate(kept):
            numbered[producer] = (fut, index)
        fut.add_done_callback(lambda _: [numbered.pop(producer, None) for producer in kept])
        return fut, refused

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
        return property_sum((self.index.db, self.meta.db), "rocksdb.cur-size-all-mem-tables")

    @property
    def block_cache_bytes(self) -> int:
        """What RocksDB's block cache holds (one cache for index and meta): data, index and
        filter blocks, within ``rocksdb_cache_bytes`` but for the pinned level-0 ones."""
        return property_sum((self.index.db,), "rocksdb.block-cache-usage")

    @property
    def dispatch_lag_bytes(self) -> int:
        """Commitlog bytes written and not yet in the consume-queue index."""
        return self.commitlog.end_position - self.index.dispatched_position

    @property
    def backlog(self) -> int:
        """Messages submitted and not yet durable: how far the writer is behind its callers."""
        return self.committer.backlog if self.committer is not None else 0

    @property
    def put_latency(self) -> LatencyHistogram:
        """Submit -> durable (or failed), per put call."""
        assert self.committer is not None
        return self.committer.put_latency

    def _submit(self, prepared: list[PreparedMessage], *, at_once: bool = False) -> asyncio.Future[Sequence[PutResult]]:
        if self.committer is None:
            raise StoreClosedError("the store is not open")
        return self.committer.submit(prepared, at_once=at_once)

    def disk_free_bytes(self) -> int:
        """Free space on the file system holding the data directory."""
        return shutil.disk_usage(self.options.data_dir).free

    async def _flush_commitlog(self) -> None:
        if self.commitlog.end_position > self.commitlog.flushed_position:
            await asyncio.get_running_loop().run_in_executor(None, self.commitlog.flush)

    def _flush_delivered(self) -> None:
        # Sync mode, before a durable metadata write: readers get messages before their fdatasync
        # (write/committer.py), so offsets and sessions may name messages a machine crash loses, whose
        # offsets other messages would then get, and their readers skip.
        if self.commitlog.flushed_position < self.commitlog.end_position:
            self.commitlog.flush()

    async def _flush_index(self) -> None:
        loop = asyncio.get_running_loop()
        durable = self.index.dispatched_position  # (at least this far once the flush returns)
        await loop.run_in_executor(None, self.commitlog.flush)
        await loop.run_in_executor(None, self.index.flush)
        self.meta.forget_drops_below(durable)

    async def _release_memory(self) -> None:
        started = time.perf_counter()
        if release_free_memory():
            self.memory_release_latency.observe(time.perf_counter() - started)

    # -- replication (store/replica/roles.py: following, leading) ----------------------------
    async def meta_settled(self) -> None:
        """Returns once every meta change made so far is held as the store promises (a
        replicated leader in ``sync`` mode: by its in-sync replicas; raises NotReplicatedError
        or NotLeaderError when that fails). Await it before acknowledging what a client asked to
        keep (a declaration, a subscription, an offset)."""
        settling = self.meta_settling()
        if settling is not None:
            await settling

    def meta_settling(self, shown: bool = False) -> asyncio.Future[None] | None:
        """``meta_settled`` for callers that must not await: None when nothing is left to settle
        (always, unless this store leads a group in ``sync`` mode), else a future. ``shown``: for a
        reply that changed nothing and only shows state: once every in-sync replica holds the
        changes before it, however many replicas are in sync (as messages are shown)."""
        release = self.committer.replicated if self.committer is not None else None
        if release is not None and self.meta_position > (release.shown if shown else release.confirmed):
            return release.reached(self.meta_position, shown)
        return None

    def reply_settling(self, meta_before: int) -> asyncio.Future[None] | None:
        """``meta_settling`` for a reply to a request begun when ``meta_position`` was
        ``meta_before``: a reply after changes waits until they are acknowledged; one that
        changed nothing, until what it shows is held (``shown``)."""
        return self.meta_settling(shown=self.meta_position == meta_before)

    # -- reading -----------------------------------------------------------------------------
    async def get(self, queue: str, offset: int, max_messages: int = 32, max_bytes: int = 4 << 20,
                  tag_hashes: frozenset[int] | None = None) -> GetResult:
        """Read up to ``max_messages`` (at least one, at most ``max_bytes`` after the first)."""
        return self.get_now(queue, offset, max_messages, max_bytes, tag_hashes)

    def get_now(self, queue: str, offset: int, max_messages: int = 32, max_bytes: int = 4 << 20,
                tag_hashes: frozenset[int] | None = None) -> GetResult:
        """``get`` without awaiting. With ``tag_hashes``, only messages whose tag hash is in the
        set are read (RocketMQ's consume-queue filter: the commitlog is not touched for the
        others); when a scan of up to ``read.queue_reads.FILTER_SCAN`` entries matches nothing, the status is
        NO_MATCHED_MESSAGE and ``next_offset`` moves past what was scanned."""
        started = time.perf_counter()
        try:
            return self._get_now(queue, offset, max_messages, max_bytes, tag_hashes)
        finally:
            self.get_latency.observe(time.perf_counter() - started)

    def _get_now(self, queue: str, offset: int, max_messages: int, max_bytes: int,
                 tag_hashes: frozenset[int] | None) -> GetResult:
        return read_queue(self.index, self.commitlog, self.first_offsets, self._id_prefix, queue, offset, max_messages,
                          max_bytes, tag_hashes)

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

    def query_by_key_in_every_topic(self, key: str, *, max_messages: int = 32,
                                    max_topics: int = 100_000) -> tuple[list[StoredMessage], bool]:
        """Messages of any topic stored with ``key``, at most ``max_messages``; and False when
        more than ``max_topics`` topics have keys (the others were not searched)."""
        positions, stale, complete = scan_every_topic(self.index.db, key, min_position=self.commitlog.min_position,
                                                      limit=max_messages, max_topics=max_topics)
        if stale:
            self.index.delete_keys(stale)
        found = (self.read_at(position) for position in positions)
        return [m for m in found if m is not None and m.key and key in m.key.split(" ")], complete

    def read_at(self, position: int) -> StoredMessage | None:
        """The message stored at ``position``, or None (removed by retention, or no record there)."""
        return record_at(self.commitlog, self._id_prefix, position)

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
        return self.first_offsets.of(state.qid, state.next_offset)

    async def offset_for_timestamp(self, queue: str, timestamp_ms: int) -> int:
        """The first offset whose message was stored at or after ``timestamp_ms`` (max offset if none)."""
        state = self.index.lookup(queue)
        if state is None:
            return 0
        low = self._min_offset(state)
        return self.index.first_offset_at_or_after_time(state.qid, low, state.next_offset, timestamp_ms)

    def add_tail_reader(self, reader: TailReader) -> None:
        """Hand ``reader`` the messages of every commit to the queues it follows (read/tail.py):
        a reader at a queue's end gets them without reading them back."""
        self.tail.readers.append(reader)

    def remove_tail_reader(self, reader: TailReader) -> None:
        if reader in self.tail.readers:
            self.tail.readers.remove(reader)

    def subscribe_notify(self) -> NotifySubscription:
        """Coalesced ``(queue, max_offset)`` events, after each dispatch."""
        return self.notify.subscribe()

    def listen_notify(self, listener: Callable[[dict[str, int]], None]) -> None:
        """Call ``listener`` with each dispatch's ``{queue: max_offset}`` events as they are
        published, before any subscription is woken (the queue cache)."""
        self.notify.listen(listener)

    def unlisten_notify(self, listener: Callable[[dict[str, int]], None]) -> None:
        self.notify.unlisten(listener)

    def after_commit(self, callback: Callable[[], None]) -> None:
        """For a notify listener: run ``callback()`` once the commit it heard of is complete, at
        the end of the committer's turn (``NotifyHub.after_commit``)."""
        self.notify.after_commit(callback)

    # -- consumer offsets and tables ----------------------------------------------------------
    async def commit_offset(self, consumer: str, queue: str, offset: int) -> None:
        """Remember a consumer's position; persisted by the periodic checkpoint and on close."""
        self.commit_offset_now(consumer, queue, offset)

    def commit_offset_now(self, consumer: str, queue: str, offset: int) -> None:
        self.offsets.commit(consumer, queue, offset)

    def save_offset_now(self, consumer: str, queue: str, offset: int) -> None:
        """``commit_offset_now``, written through at once (the meta store's WAL): for where a new
        reader starts, which must survive a crash that comes before the next checkpoint."""
        self.offsets.save(consumer, queue, offset)

    def get_offset_now(self, consumer: str, queue: str) -> int | None:
        return self.offsets.get(consumer, queue)

    async def get_offset(self, consumer: str, queue: str) -> int | None:
        return self.get_offset_now(consumer, queue)

    async def _checkpoint_offsets(self) -> None:
        if self.meta.failed is not None:
            self.meta.probe()  # (StoreWriteError: still failing; else it took writes again)
        self._checkpoint_offsets_now()

    async def _forget_marks(self) -> None:
        """Idempotent puts' marks too old to be asked for again (write/idempotence.py)."""
        self.meta.writes.apply(forget_before(now_ms()), sync=False, journal=False)

    def _offsets_soon(self) -> None:
        """The first offset committed since the last write: written within OFFSETS_SOON_S (in
        ``async`` flush mode), so a crash or a failover gives back only what was acknowledged
        in that moment (at least once), not since the last checkpoint."""
        if self._offsets_timer is None:
            self._offsets_timer = asyncio.get_running_loop().call_later(OFFSETS_SOON_S, self._write_offsets_soon)

    def _write_offsets_soon(self) -> None:
        self._offsets_timer = None
        try:
            self._checkpoint_offsets_now()
        except StoreError as exc:  # (kept dirty: the periodic checkpoint tries again)
            self._log_limited.log(logging.ERROR, "offsets", "offsets not saved error=%s", exc)

    def _checkpoint_offsets_now(self) -> None:
        self.offsets.checkpoint()

    def table(self, name: str) -> KvTable:
        """A durable str -> bytes table (retained messages, sessions, metadata)."""
        return self.meta.table(name)

    # -- retention -----------------------------------------------------------------------------
    async def apply_retention(self) -> int:
        """Delete whole segments by age/size (held messages in them rolled forward first), then
        drop index entries below the new minimum; how many segments went."""
        if not self.retention.enabled:
            return 0
        return await apply_retention(self.retention, self.commitlog, self.index, self.held, self.read_at, self.trimmer)

    def write_failure(self) -> StoreError | None:
        """Why the store refuses writes now, None when it takes them: until a restart after a
        failed fdatasync or index write; until meta recovers (checked with the offset
        checkpoint) after a failed meta write. A full commitlog disk alone is no such reason
        (a put that fits once space is free is stored)."""
        failure = self.committer.failure() if self.committer is not None else None
        return failure or self.meta.failed

    def committer_writable(self) -> bool:
        return self.committer is not None and not self.committer.closing and self.committer.failure() is None

    def set_queue_policy(self, policy: QueuePolicy | None) -> None:
        """The gateway's per-queue settings: per-topic retention (retention/queues.py) and idle
        light queues removed (retention/reclaim.py)."""
        self.reclaimer.policy = policy
        self.retention.queues = policy

    # -- introspection -------------------------------------------------------------------------
    @property
    def end_position(self) -> int:
        return self.commitlog.end_position

    @property
    def min_position(self) -> int:
        return self.commitlog.min_position


def _one_of(put: asyncio.Future[Sequence[PutResult]], index: int) -> asyncio.Future[Sequence[PutResult]]:
    """The result of message ``index`` of ``put``, as the results of a put of its own."""
    one: asyncio.Future[Sequence[PutResult]] = asyncio.get_running_loop().create_future()

    def done(f: asyncio.Future[Sequence[PutResult]]) -> None:
        if one.done():
            return
        if f.cancelled():
            one.cancel()
        elif (exc := f.exception()) is not None:
            one.set_exception(exc)
        else:
            one.set_result([f.result()[index]])
    put.add_done_callback(done)
    return one
