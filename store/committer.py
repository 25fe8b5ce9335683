"""The store's writer: every put waiting when it wakes is encoded, appended to the commitlog in
one write, made durable per the flush mode (one fdatasync for the whole group in ``sync`` mode),
indexed in one RocksDB WriteBatch, and only then acknowledged (group commit, as RocketMQ's
GroupCommitService). Futures resolve in submission order.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Hashable, Sequence

from .commitlog import CommitLog
from .consumequeue import QID_MASK, ConsumeQueueIndex
from .dispatcher import Dispatcher
from .errors import InvalidMessageError, MessageTooLargeError, StoreClosedError, StoreError, StoreWriteError
from .keyindex import key_prefixes
from .log_limit import RateLimitedLog
from .message import TAGS_PROPERTY, Message, PutResult, tag_hash
from .record import FIXED_SIZE, assemble, encode_properties, encode_static, queue_slots_of
from .stats import LatencyHistogram
from .tail import TailHandoff

log = logging.getLogger("tidemq.store")

Batch = list[tuple[list["PreparedMessage"], asyncio.Future[list[PutResult]]]]


class PreparedMessage:
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


class GroupCommitter:
    """Run ``run()`` as one task; ``submit`` from the event loop; ``close()`` lets it finish
    what was submitted and return."""

    def __init__(self, commitlog: CommitLog, index: ConsumeQueueIndex, dispatcher: Dispatcher, *, sync: bool,
                 id_prefix: str, log_limited: RateLimitedLog, tail: TailHandoff) -> None:
        self.commitlog = commitlog
        self.index = index
        self.dispatcher = dispatcher
        self.sync = sync  # fdatasync before acknowledging (flush mode "sync")
        self._id_prefix = id_prefix
        self._log_limited = log_limited  # failures that repeat with every commit (a full disk)
        self.tail = tail  # readers at queues' ends, handed each commit's messages (tail.py)
        self._pending: Batch = []
        self._pending_since: list[float] = []  # perf_counter() of each entry of _pending
        self.backlog = 0  # messages submitted and not yet durable (or failed)
        self.put_latency = LatencyHistogram()  # submit -> durable (or failed), per put call
        self._wakeup = asyncio.Event()
        self.closing = False
        self._write_failure: StoreError | None = None

    def close(self) -> None:
        self.closing = True
        self._wakeup.set()

    def submit(self, prepared: list[PreparedMessage]) -> asyncio.Future[list[PutResult]]:
        if self.closing:
            raise StoreClosedError("the store is closing")
        if self._write_failure is not None:
            raise StoreWriteError(f"the store refuses writes after an index failure: {self._write_failure}")
        fut: asyncio.Future[list[PutResult]] = asyncio.get_running_loop().create_future()
        self._pending.append((prepared, fut))
        self._pending_since.append(time.perf_counter())
        self.backlog += len(prepared)
        self._wakeup.set()
        return fut

    async def run(self) -> None:
        while True:
            if not self._pending:
                if self.closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch, self._pending = self._pending, []
            since, self._pending_since = self._pending_since, []
            try:
                await self._commit(batch)
            except Exception as exc:  # never let one bad batch stop the committer
                if isinstance(exc, StoreWriteError):  # the disk refused (full, I/O error): says why, no traceback
                    self._log_limited.log(logging.ERROR, str(exc), "commit failed")
                else:
                    self._log_limited.log(logging.ERROR, type(exc).__name__, "commit failed", exc_info=True)
                _fail(batch, exc if isinstance(exc, StoreError) else StoreWriteError(str(exc)))
            finally:
                self.backlog -= sum(len(prepared) for prepared, _ in batch)
                now = time.perf_counter()
                observe = self.put_latency.observe
                for submitted in since:
                    observe(now - submitted)

    async def _commit(self, batch: Batch) -> None:
        store_ts = _now_ms()
        cache_get = self.index.cache.get
        resolve = self.index.resolve
        assigned: dict[str, int] = {}  # queue -> pack_state() for the next message in this batch
        records: list[bytes] = []
        placed: list[tuple[PreparedMessage, list[tuple[str, int, int]], list[int]]] = []
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
        if self.sync:
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
        if self.tail.readers:
            # After the acknowledgements: the messages are committed whatever happens here.
            try:
                self.tail.hand(items, records, assigned)
            except Exception:
                self._log_limited.log(logging.ERROR, "tail", "hand-off to tail readers failed", exc_info=True)

def prepare_each(items: Sequence[tuple[Message, Sequence[str]]], groups: Sequence[Hashable] | None,
                  limit: int) -> tuple[list[PreparedMessage], dict[int, StoreError]]:
    """``put_each_nowait``'s messages one by one: those the store can take, and the refused."""
    prepared: list[PreparedMessage] = []
    refused: dict[int, StoreError] = {}
    stopped: dict[Hashable, StoreError] = {}
    for i, (message, queues) in enumerate(items):
        group = groups[i] if groups is not None else i
        if group in stopped:
            refused[i] = stopped[group]
            continue
        try:
            prepared.append(PreparedMessage(message, queues, limit))
        except (InvalidMessageError, MessageTooLargeError) as exc:
            refused[i] = stopped[group] = exc
    return prepared, refused


def _fail(batch: Batch, exc: BaseException) -> None:
    for _, fut in batch:
        if not fut.done():
            fut.set_exception(exc)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
