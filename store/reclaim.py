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

A removal is a control record (holds.py ``DROP``: qid, next offset, name) appended to the
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
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .consumequeue import ConsumeQueueIndex
from .holds import HOLD_TOPIC, drop_body
from .policy import QueuePolicy
from .record import encode_record

if TYPE_CHECKING:
    from .commitlog import CommitLog
    from .dispatcher import Dispatcher

log = logging.getLogger("tidemq.store")

ReaderCheck = Callable[[str], bool]  # queue name -> is it read (would a removal lose a reader's place)?
SCAN_YIELD = 256  # queues examined between two yields to the event loop (~5 ms)
REMOVE_BATCH = 1024  # queues removed in one step


class QueueReclaimer:
    def __init__(self, index: ConsumeQueueIndex, commitlog: CommitLog, dispatcher: Dispatcher) -> None:
        self._index = index
        self._commitlog = commitlog
        self._dispatcher = dispatcher
        self.policy: QueuePolicy | None = None  # None: nothing is reclaimed
        self.checks: list[ReaderCheck] = []
        self.on_removed: list[Callable[[str], None]] = []  # caches keyed by queue name forget it
        self._empty_since: dict[int, float] = {}  # qid -> when it was first seen without entries
        self.removed_total = 0

    def is_read(self, name: str) -> bool:
        return any(check(name) for check in self.checks)

    async def run(self, now: float | None = None) -> int:
        """Find the queues idle past their time with no reader and remove them; how many went."""
        policy = self.policy
        if policy is None:
            return 0
        now = time.time() if now is None else now
        found: list[tuple[str, int, int]] = []
        removed = 0
        seen_empty: set[int] = set()
        queues = (row for prefix in policy.light_prefixes for row in self._index.iter_queues(prefix))
        for n, (state, _) in enumerate(queues):
            ttl = policy.idle_ttl_s(state.name)
            if ttl > 0 and self._idle_since(state.qid, state.next_offset, now, seen_empty) <= now - ttl \
                    and not self.is_read(state.name):
                found.append((state.name, state.qid, state.next_offset))
                if len(found) >= REMOVE_BATCH:
                    removed += self.remove_now(found)
                    found = []
            if n % SCAN_YIELD == SCAN_YIELD - 1:
                await asyncio.sleep(0)
        if found:
            removed += self.remove_now(found)
        for qid in [q for q in self._empty_since if q not in seen_empty]:
            del self._empty_since[qid]
        return removed

    def _idle_since(self, qid: int, next_offset: int, now: float, seen_empty: set[int]) -> float:
        """When the queue's newest message was stored; for a queue without entries (retention took
        them), when that was first seen (a restart forgets it: the queue then waits longer)."""
        if next_offset:
            entry = self._index.entry(qid, next_offset - 1)
            if entry is not None:
                return entry[3] / 1000.0
        seen_empty.add(qid)
        return self._empty_since.setdefault(qid, now)

    def remove_now(self, queues: list[tuple[str, int, int]]) -> int:
        """Remove the queues (name, qid, next offset) that are still as found and still unread:
        their drop records appended and indexed at once (see the module's docstring)."""
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
        self._dispatcher.drop([(qid, name) for qid, _, name in doomed], self._commitlog.end_position)
        for qid, _, name in doomed:
            self._empty_since.pop(qid, None)
            for forget in self.on_removed:
                forget(name)
        self.removed_total += len(doomed)
        log.info("idle queues removed count=%d first=%s", len(doomed), doomed[0][2])
        return len(doomed)
