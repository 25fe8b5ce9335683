"""Retention: which whole commitlog segments may go, by age and by total size, and their
deletion (held messages in them rolled forward first, the index cut below the new start).

The newest (active) segment always stays. Segments go oldest first, so the log keeps
one contiguous range of positions.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..log.commitlog import CommitLog, Segment
from ..index.consumequeue import ConsumeQueueIndex
from .policy import QueuePolicy
from .queues import QueueTrimmer

if TYPE_CHECKING:
    from ..holds.held_messages import HeldMessages
    from ..messages import StoredMessage

log = logging.getLogger("tidemq.store")


class RetentionPolicy:
    def __init__(self, max_age_hours: float, max_bytes: int) -> None:
        self.global_hours = max_age_hours
        self.max_bytes = max_bytes
        self.queues: QueuePolicy | None = None  # per-queue rules (retention/queues.py)

    @property
    def max_age_seconds(self) -> float:
        """Segments go at this age: the global one, or a longer per-queue rule's (0: never)."""
        if self.global_hours <= 0:
            return 0.0
        longest = self.queues.longest_hours if self.queues is not None else 0.0
        return max(self.global_hours, longest) * 3600.0

    @property
    def enabled(self) -> bool:
        return self.max_age_seconds > 0 or self.max_bytes > 0 or self.queues is not None

    def segments_to_delete(self, segments: Sequence[Segment], now: float) -> list[Segment]:
        old = list(segments[:-1])  # never the active one
        doomed: list[Segment] = []
        if self.max_age_seconds > 0:
            # A segment's mtime is the time of its newest record.
            while old and now - os.fstat(old[0].fd).st_mtime > self.max_age_seconds:
                doomed.append(old.pop(0))
        if self.max_bytes > 0:
            total = sum(s.length for s in segments) - sum(s.length for s in doomed)
            while old and total > self.max_bytes:
                seg = old.pop(0)
                total -= seg.length
                doomed.append(seg)
        return doomed


async def apply_retention(policy: RetentionPolicy, commitlog: CommitLog, index: ConsumeQueueIndex,
                          held: HeldMessages, read_at: Callable[[int], StoredMessage | None],
                          trimmer: QueueTrimmer) -> int:
    """Cut each queue to its own rule (retention/queues.py), delete the segments ``policy`` dooms
    (held messages in them rolled forward first, holds/held_messages.py), then the index entries below the new
    minimum; how many segments went."""
    if policy.queues is not None and policy.queues.has_rules:
        # queues without a rule follow the global age, which the segments no longer enforce
        # when a rule keeps them longer
        default = policy.global_hours if policy.max_age_seconds > policy.global_hours * 3600.0 else 0.0
        trimmed = await trimmer.trim(policy.queues, default, int(time.time() * 1000))
        if trimmed:
            log.info("per-queue retention removed entries=%d", trimmed)
    doomed = policy.segments_to_delete(commitlog.segments(), time.time())
    if not doomed:
        return 0
    cut = doomed[-1].start + commitlog.segment_size
    while holds := held.below(cut, 1024):
        rolled = await held.roll(holds, read_at)
        log.info("held messages rolled before retention count=%d below=%d", rolled, cut)
    freed = sum(commitlog.delete_segment(seg.start) for seg in doomed)
    log.info("retention deleted segments=%d bytes=%d min_position=%d", len(doomed), freed, commitlog.min_position)
    await clean_index_below(index, commitlog.min_position)
    return len(doomed)


async def clean_index_below(index: ConsumeQueueIndex, min_position: int) -> None:
    """Drop every queue's index entries that point below ``min_position`` (retention cut there)."""
    for n, (state, last_position) in enumerate(index.iter_queues()):
        first = index.first_offset(state.qid)
        if first is None:
            continue
        entry = index.entry(state.qid, first)
        if entry is not None and entry[0] >= min_position:
            continue
        keep = index.first_offset_at_or_after_position(state.qid, first, state.next_offset, min_position)
        index.delete_below(state.qid, keep, state.next_offset, last_position)
        if n % 1024 == 1023:
            await asyncio.sleep(0)
