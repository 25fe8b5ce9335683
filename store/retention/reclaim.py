"""Light queues reclaimed: a queue with no new message for its idle time and no reader is removed
from the index -- its entries, head key, name row and cached state -- so that a million device
topics seen once do not stay in the index for ever (RocketMQ's light message queues are cleaned
the same way). The messages stay in the commitlog until retention takes their segment; the name,
written again, starts a new queue (a new qid, offsets from 0).

Which queues may go and after how long is the gateway's to say (``QueuePolicy.idle_ttl_s``: 0 =
never, for queues that are not light) and who reads a queue too: every protocol registers a
reader check (MQTT subscriptions and persistent sessions, Spark holds of a filter, declared AMQP
queues; remoting topics are never light). Consumer offsets left on a removed queue (a deleted
AMQP queue's cursor) go with it (the dispatcher's ``on_drop``, at run time and in re-dispatch
alike): a new queue of that name starts with none.

A removal is a control record (holds/codec.py ``DROP``: qid, next offset, name) appended to the
commitlog and indexed in ONE synchronous step with the checks, between two commits of the group
committer: every record before it is indexed already, every later one (a publish to the same
name) is placed after it and starts the new queue. Re-dispatch after a crash meets the same
records in the same order and so rebuilds the same queues and offsets; without the record, a
removal lost with the memtable (WAL off) would let a later queue of that name continue the old
one's offsets after a restart.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..index.consumequeue import ConsumeQueueIndex
from ..holds.codec import HOLD_TOPIC, drop_body
from .policy import QueuePolicy
from ..log.record import encode_record

if TYPE_CHECKING:
    from ..log.commitlog import CommitLog
    from ..index.dispatcher import Dispatcher

log = logging.getLogger("tidemq.store")

ReaderCheck = Callable[[str], bool]  # queue name -> is it read (would a removal lose a reader's place)?
SCAN_YIELD = 256  # queues examined between two yields to the event loop (~5 ms)
REMOVE_BATCH = 256  # queues removed in one step (~10 ms of the loop)


UNREAD_PREFIX = b"u"  # index db: qid u32 -> when the queue was first seen idle and unread (ms)
_UNREAD = struct.Struct(">cI")
_MS = struct.Struct(">Q")


class QueueReclaimer:
    """``run`` every ``queue_idle_check_interval``. A queue goes when its newest message is older
    than its idle time AND no scan has seen it read for as long: the first scan that finds it idle
    and unread marks it (a key in the index database, so a million idle queues cost no memory;
    WAL off: a crash forgets marks, which only delays removals), a scan that finds it read or
    written clears the mark. A reader that comes and goes between two scans is not seen."""

    def __init__(self, index: ConsumeQueueIndex, commitlog: CommitLog, dispatcher: Dispatcher,
                 writable: Callable[[], bool], refuse_writes: Callable[[BaseException], Exception]) -> None:
        self._index = index
        self._commitlog = commitlog
        self._dispatcher = dispatcher
        self._writable = writable  # the committer takes writes (no index or fsync failure, not closing)
        self._refuse_writes = refuse_writes
        self.policy: QueuePolicy | None = None  # None: nothing is reclaimed
        self.checks: list[ReaderCheck] = []
        self.on_removed: list[Callable[[str], None]] = []  # caches keyed by queue name forget it
        self.removed_total = 0

    def is_read(self, name: str) -> bool:
        return any(check(name) for check in self.checks)

    async def run(self, now: float | None = None) -> int:
        """Find the queues idle and unread past their time and remove them; how many went."""
        policy = self.policy
        if policy is None:
            return 0
        now_ms = int((time.time() if now is None else now) * 1000)
        db = self._index.db
        found: list[tuple[str, int, int]] = []
        removed = 0
        queues = (row for prefix in policy.light_prefixes for row in self._index.iter_queues(prefix))
        for n, (state, _) in enumerate(queues):
            if n % SCAN_YIELD == SCAN_YIELD - 1:
                await asyncio.sleep(0)
            ttl_ms = int(policy.idle_ttl_s(state.name) * 1000)
            if not ttl_ms:
                continue
            mark_key = _UNREAD.pack(UNREAD_PREFIX, state.qid)
            last = self._newest_ms(state.qid, state.next_offset)
            if now_ms - last < ttl_ms or self.is_read(state.name):
                if db.get(mark_key) is not None:
                    db.delete(mark_key)
                continue
            mark = db.get(mark_key)
            if mark is None:
                db.put(mark_key, _MS.pack(now_ms))  # unread from now on, as far as we know
                continue
            if now_ms - max(last, _MS.unpack(mark)[0]) >= ttl_ms:
                found.append((state.name, state.qid, state.next_offset))
                if len(found) >= REMOVE_BATCH:
                    removed += self.remove_now(found)
                    found = []
        if found:
            removed += self.remove_now(found)
        return removed

    def _newest_ms(self, qid: int, next_offset: int) -> int:
        """When the queue's newest message was stored (0: it has none left, retention took them)."""
        if next_offset:
            entry = self._index.entry(qid, next_offset - 1)
            if entry is not None:
                return entry[3]
        return 0

    def remove_now(self, queues: list[tuple[str, int, int]]) -> int:
        """Remove the queues (name, qid, next offset) that are still as found and still unread:
        their drop records appended and indexed at once (see the module's docstring)."""
        if not self._writable():
            return 0  # (the committer refuses writes: nothing may be appended past what it lost)
        doomed = []
        for name, qid, next_offset in queues:
            packed = self._index.lookup_packed(name)
            if packed is None or packed != next_offset << 32 | qid or self.is_read(name):
                continue  # written, recreated or read since it was found
            doomed.append((qid, next_offset, name))
        if not doomed:
            return 0
        now_ms = int(time.time() * 1000)
        records = [encode_record(topic=HOLD_TOPIC.encode(), key=b"", properties=b"", queues=[], offsets=[],
                                 body=drop_body(qid, next_offset, name), born_ts=now_ms, store_ts=now_ms)
                   for qid, next_offset, name in doomed]
        self._commitlog.append(records)  # StoreWriteError: nothing written, nothing removed
        for qid, _, name in doomed:  # the caches first: nothing may serve the old queue's messages
            for forget in self.on_removed:
                forget(name)
        try:
            self._index.delete_keys([_UNREAD.pack(UNREAD_PREFIX, qid) for qid, _, _ in doomed])
            self._dispatcher.drop([name for _, _, name in doomed], self._commitlog.end_position)
        except Exception as exc:
            raise self._refuse_writes(exc) from exc  # (as a failed commit's dispatch: write/committer.py)
        self.removed_total += len(doomed)
        log.info("idle queues removed count=%d first=%s", len(doomed), doomed[0][2])
        return len(doomed)
