"""Where each queue's readable data starts (its first offset), remembered per queue.

A queue's first offset moves when retention cuts the commitlog (its start moves: every queue is
looked up again) or cuts that queue alone (per-topic retention: ``forget``); an index seek per
read cost ~5 % of a read, so the answer is kept until then.
"""

from __future__ import annotations

from collections.abc import Callable

from .consumequeue import ConsumeQueueIndex

CACHED_QUEUES = 65_536  # queues whose first offset is remembered


class FirstOffsets:
    __slots__ = ("_floor", "_index", "_known")

    def __init__(self, index: ConsumeQueueIndex, floor: Callable[[], int]) -> None:
        self._index = index
        self._floor = floor  # the commitlog's first position
        self._known: dict[int, tuple[int, int]] = {}  # qid -> (commitlog start, first offset)

    def of(self, qid: int, next_offset: int) -> int:
        floor = self._floor()
        known = self._known.get(qid)
        if known is not None and known[0] == floor:
            return known[1]
        index = self._index
        first = index.first_offset(qid)
        if first is None:
            return next_offset  # empty: not remembered, it moves with the next put
        entry = index.entry(qid, first)
        if entry is None or entry[0] < floor:
            first = index.first_offset_at_or_after_position(qid, first, next_offset, floor)
        if len(self._known) >= CACHED_QUEUES:
            self._known.clear()
        self._known[qid] = (floor, first)
        return first

    def forget(self, qid: int) -> None:
        self._known.pop(qid, None)
