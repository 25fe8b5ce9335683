"""A queue's consume-queue entries read as one range (``ConsumeQueueIndex.entries``: one bounded
iterator from four entries on, a multi-get below): the same answer as a multi-get of each offset,
in a real store, with entries missing at the start, in the middle and at the end of the range."""

from __future__ import annotations

import random

from store import Message
from store.index.consumequeue import ENTRY_KEY, ENTRY_PREFIX, RANGE_READ_FROM
from store.rocks import raw_multi_get


def _reference(index, qid: int, offset: int, count: int) -> list[bytes | None]:
    return raw_multi_get(index._db, [ENTRY_KEY.pack(ENTRY_PREFIX, qid, o) for o in range(offset, offset + count)])


async def test_a_range_of_entries_reads_as_a_multi_get_of_each_offset(open_store) -> None:
    store = await open_store()
    queue = "t:range/1"
    await store.put_batch([(Message("range/1", b"%d" % i), [queue]) for i in range(300)])
    await store.put_batch([(Message("range/2", b"x"), ["t:range/2"]) for _ in range(5)])  # (the next qid's keys)
    index = store.index
    qid = index.lookup(queue).qid
    rng = random.Random(7)
    ranges = [(o, n) for o in (0, 1, 100, 236, 290, 299, 300) for n in (1, RANGE_READ_FROM - 1, RANGE_READ_FROM, 64, 200)]
    for offset, count in ranges:  # every entry there
        got = index.entries(qid, offset, count)
        assert got == _reference(index, qid, offset, count)
        assert [raw is not None for raw in got] == [o < 300 for o in range(offset, offset + count)]
    missing = {0, 1, 2, 50, 51, 120, 199, 263, 299}
    missing |= set(rng.sample(range(300), 20))
    batch = index.new_batch()
    for o in missing:
        batch.delete(ENTRY_KEY.pack(ENTRY_PREFIX, qid, o))
    index._db.write(batch)
    for offset, count in [*ranges, *((rng.randrange(300), rng.randrange(1, 80)) for _ in range(200))]:
        got = index.entries(qid, offset, count)
        assert got == _reference(index, qid, offset, count), (offset, count)
        assert [raw is None for raw in got] == [o in missing or o >= 300 for o in range(offset, offset + count)]
