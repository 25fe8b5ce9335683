"""Per-queue retention: a queue's own age and size limits (per-topic rules of the gateway's
configuration), on top of the global retention of commitlog segments.

The commitlog is one log for every queue, so a segment goes only when every message in it may
go: segments are kept for the longest age any rule or the global setting gives (retention/segments.py),
and each queue is cut in the index to its own limits here -- a command topic kept for hours
stops being readable after hours even while telemetry beside it is kept for months. (Its bytes
stay on disk until their segment goes.) Size limits count a queue's message sizes, newest
first, like Kafka's retention.bytes per partition.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..index.consumequeue import ENTRY_KEY, ENTRY_VALUE, ConsumeQueueIndex, entry_key
from ..holds.codec import INDIRECT, ControlRecord
from .policy import QueuePolicy
from ..log.record import RecordView

SCAN_YIELD = 256  # queues examined between two yields to the event loop


class QueueTrimmer:
    """Cuts each queue to its rule; the global age applies to queues without one whenever the
    segments are kept longer than it (``default_hours``)."""

    def __init__(self, index: ConsumeQueueIndex, forget_first: Callable[[int], None],
                 read: Callable[[int, int], bytes]) -> None:
        self._index = index
        self._forget_first = forget_first
        self._read = read  # the commitlog's: a release entry's record says its message's size
        self.on_cut: list[Callable[[str], None]] = []  # caches keyed by queue name forget what was cut
        # qid -> (start, end, bytes of the entries in [start, end)): a size rule's running sum,
        # so each check reads only the entries written since the last one
        self._sizes: dict[int, tuple[int, int, int]] = {}

    async def trim(self, rules: QueuePolicy, default_hours: float, now_ms: int) -> int:
        """Cut every queue to its limits; how many entries went."""
        removed = 0
        index = self._index
        live: set[int] = set()
        for n, (state, last_position) in enumerate(index.iter_queues()):
            if n % SCAN_YIELD == SCAN_YIELD - 1:
                await asyncio.sleep(0)
            rule = rules.retention(state.name)
            hours, max_bytes = rule if rule is not None else (default_hours, 0)
            if hours <= 0 and max_bytes <= 0:
                continue
            qid, end = state.qid, state.next_offset
            first = index.first_offset(qid)
            if first is None:
                continue
            cut = first
            if hours > 0:
                cut = index.first_offset_at_or_after_time(qid, first, end, now_ms - int(hours * 3_600_000))
            if max_bytes > 0:
                live.add(qid)
                cut = await self._size_cut(qid, first, cut, end, max_bytes)
            if cut > first:
                index.delete_below(qid, cut, end, last_position)
                self._forget_first(qid)
                for forget in self.on_cut:
                    forget(state.name)
                removed += cut - first
        for qid in [q for q in self._sizes if q not in live]:
            del self._sizes[qid]
        return removed

    async def _size_cut(self, qid: int, first: int, floor: int, end: int, max_bytes: int) -> int:
        """The first offset (``floor`` or later: the age rule's cut) to keep so that the queue
        holds at most ``max_bytes``."""
        start, known_end, total = self._sizes.get(qid, (first, first, 0))
        if start < first or not start <= known_end <= end:  # cut below us (global retention): count again
            start, known_end, total = first, first, 0
        async for _, size in self._sizes_from(qid, known_end, end):
            total += size
        if start < floor:  # what the age rule cuts leaves the sum (read before it is deleted)
            async for _, size in self._sizes_from(qid, start, floor):
                total -= size
            start = floor
        if total > max_bytes:
            async for offset, size in self._sizes_from(qid, start, end):
                total -= size
                start = offset + 1
                if total <= max_bytes:
                    break
        self._sizes[qid] = (start, end, total)
        return start

    async def _sizes_from(self, qid: int, offset: int, end: int):
        """(offset, message size) of the queue's entries in [offset, end), in order; a released
        held message's entry points at its small release record, whose body gives the size."""
        it = self._index.db.iter()
        it.seek(entry_key(qid, offset))
        n = 0
        while it.valid():
            key = it.key()
            if len(key) != ENTRY_KEY.size:
                return
            _, q, at = ENTRY_KEY.unpack(key)
            if q != qid or at >= end:
                return
            position, size = ENTRY_VALUE.unpack(it.value())[:2]
            if size & INDIRECT:
                size &= ~INDIRECT
                record = self._read(position, size)
                size = ControlRecord(RecordView(record, 0).body).target_size if len(record) == size else 0
            yield at, size
            n += 1
            if n % 4096 == 0:
                await asyncio.sleep(0)  # (a long queue's first count must not stall the loop)
            it.next()
