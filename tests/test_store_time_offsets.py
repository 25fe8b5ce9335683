"""Offset-for-time lookups (``ConsumeQueueIndex.offset_for_time``) on a real store: the first offset stored at or
after a time, None past the end, and only offsets still in the queue."""

from __future__ import annotations

import asyncio

from store import Message


async def test_offset_for_time_finds_the_first_offset_stored_at_or_after(open_store) -> None:
    store = await open_store()
    queue = "t:plant/1/temp"
    times: list[int] = []  # store time of offset i
    for burst in range(6):  # bursts of 5 a few ms apart: several offsets share one store time
        results = await store.put_batch([(Message("plant/1/temp", b"%d" % (burst * 5 + i)), [queue])
                                         for i in range(5)])
        times.extend(r.store_timestamp for r in results)
        await asyncio.sleep(0.005)
    assert times == sorted(times) and len(set(times)) >= 3
    state = store.index.lookup(queue)
    offset_for_time, high = store.index.offset_for_time, state.next_offset
    assert high == 30

    def expected(t: int, low: int = 0) -> int | None:
        return next((o for o in range(low, high) if times[o] >= t), None)

    for t in sorted({*times, times[0] - 1000, times[-1] + 1, *(x + 1 for x in times)}):
        assert offset_for_time(state.qid, 0, high, t) == expected(t), t
    assert offset_for_time(state.qid, 0, high, 0) == 0
    assert offset_for_time(state.qid, 0, high, times[-1] + 1) is None  # Kafka: null
    # from a later first offset (what retention left): never before it
    assert offset_for_time(state.qid, 12, high, times[0]) == 12
    assert offset_for_time(state.qid, 12, high, times[20]) == expected(times[20], 12)
    assert offset_for_time(state.qid, 5, 5, times[0]) is None  # an empty range
