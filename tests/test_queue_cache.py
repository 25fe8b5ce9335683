"""QueueCache over the real store: fan-out from memory, bounds, statuses passed through, retention."""

from __future__ import annotations

import math
import random

import pytest

from cache import MESSAGE_OVERHEAD, WINDOW_OVERHEAD, QueueCache
from store import GetStatus, Message


async def put(store, queue: str, n: int, start: int = 0, size: int = 0) -> list[bytes]:
    """Put ``n`` messages into ``queue``; each body names its offset (padded to ``size``)."""
    bodies = []
    for i in range(start, start + n):
        body = f"{queue}:{i}".encode().ljust(size, b".")
        res = await store.put(Message(f"t/{queue}", body), [queue])
        assert res.queue_offsets == {queue: i}
        bodies.append(body)
    return bodies


class Link:
    """A source that only reads (as a gateway node's store link): the store's write-through to
    its tail readers (store/read/tail.py) and its notify events left out, for what the cache does
    on its own."""

    def __init__(self, store) -> None:
        self.get_now = store.get_now


class Unheard:
    """The store, but for its notify events: the cache reads it and takes its write-through."""

    def __init__(self, store) -> None:
        self.get_now = store.get_now
        self.add_tail_reader = store.add_tail_reader


def cost(queue: str, body: bytes) -> int:
    """What one cached message of ``put`` is accounted for: body (twice: readers keep their
    encoded copy on the message), topic, queue slot, overhead."""
    return 2 * len(body) + len(f"t/{queue}") + (2 + len(queue) + 8) + MESSAGE_OVERHEAD


def read_to_end(cache: QueueCache, queue: str, offset: int = 0, **limits):
    """One reader reading until the cache says nothing new; returns [(offset, body)] and the last result."""
    got = []
    while True:
        res = cache.read(queue, offset, **limits)
        if res.status is not GetStatus.FOUND:
            return got, res
        assert [m.queue_offset for m in res.messages] == list(range(offset, res.next_offset))
        got.extend((m.queue_offset, m.body) for m in res.messages)
        offset = res.next_offset


@pytest.mark.parametrize("interleaved", [True, False], ids=["lockstep", "one-after-another"])
async def test_a_thousand_readers_of_one_queue_cost_one_store_read_per_batch(open_store, interleaved):
    store = await open_store()
    bodies = await put(store, "hot", 200)
    cache = QueueCache(store)
    cache.on_notify("hot", 200)  # what the cache hears of the puts (here before it was made)
    readers = 1000
    offsets = [0] * readers
    got: list[list[tuple[int, bytes]]] = [[] for _ in range(readers)]
    done = [False] * readers

    def step(r: int) -> None:
        res = cache.read("hot", offsets[r])
        if res.status is GetStatus.NO_NEW_MESSAGE:
            assert (res.messages, res.next_offset, res.max_offset) == ([], 200, 200)
            done[r] = True
            return
        assert res.status is GetStatus.FOUND and res.max_offset == 200
        assert res.next_offset == offsets[r] + len(res.messages)
        got[r].extend((m.queue_offset, m.body) for m in res.messages)
        offsets[r] = res.next_offset

    if interleaved:
        while not all(done):
            for r in range(readers):
                if not done[r]:
                    step(r)
    else:
        for r in range(readers):
            while not done[r]:
                step(r)

    expected = list(enumerate(bodies))
    assert all(g == expected for g in got)
    stats = cache.stats
    assert stats.store_reads == math.ceil(200 / 32) == 7  # not 1,000 x 7
    assert stats.messages_from_store == 200
    assert (stats.misses, stats.hits) == (200, 999 * 200)
    assert stats.hit_ratio == 0.999
    assert cache.window("hot") == (0, 200)
    assert (stats.queues, stats.bytes) == (1, WINDOW_OVERHEAD + sum(cost("hot", b) for b in bodies))


async def test_without_notify_each_reader_at_the_end_asks_the_store(open_store):
    # Without on_notify (a source whose notify events the cache does not hear) the cache cannot
    # know the store has nothing new, so a reader that reaches the window's end asks the store
    # once; the batches themselves are still read once.
    store = await open_store()
    bodies = await put(store, "hot", 200)
    cache = QueueCache(Link(store))
    readers = [0] * 10
    got: list[list[bytes]] = [[] for _ in readers]
    active = set(range(10))
    while active:
        for r in sorted(active):
            res = cache.read("hot", readers[r])
            if res.status is GetStatus.FOUND:
                got[r].extend(m.body for m in res.messages)
                readers[r] = res.next_offset
            else:
                assert res.status is GetStatus.NO_NEW_MESSAGE and res.next_offset == 200
                active.discard(r)
    assert all(g == bodies for g in got)
    # 7 batches; at 192 the 9 later readers get 8 cached messages and one look past them each;
    # at 200 all 10 look once more.
    assert cache.stats.store_reads == 7 + 9 + 10
    assert cache.stats.messages_from_store == 200
    cache.on_notify("hot", 200)
    before = cache.stats.store_reads
    assert cache.read("hot", 200).status is GetStatus.NO_NEW_MESSAGE
    assert cache.stats.store_reads == before


async def test_a_lagging_reader_is_served_from_the_store_and_leaves_the_window(open_store):
    store = await open_store()
    bodies = await put(store, "q", 200)
    cache = QueueCache(store, window_messages=64)
    cache.on_notify("q", 200)
    tail, last = read_to_end(cache, "q")
    assert tail == list(enumerate(bodies)) and last.status is GetStatus.NO_NEW_MESSAGE
    assert cache.window("q") == (136, 200)
    window_bytes = WINDOW_OVERHEAD + sum(cost("q", b) for b in bodies[136:])
    assert cache.stats.bytes == window_bytes
    reads, hits, misses = cache.stats.store_reads, cache.stats.hits, cache.stats.misses

    lagging, last = read_to_end(cache, "q", 0)
    assert lagging == list(enumerate(bodies)) and last.next_offset == 200
    # offsets 0, 32, 64, 96, 128 are below the window: five store reads, nothing cached
    assert cache.stats.store_reads == reads + 5
    assert cache.stats.misses == misses + 160
    assert cache.stats.hits == hits + 40  # 160..199 from the window
    assert cache.window("q") == (136, 200)
    assert (cache.stats.bytes, cache.stats.queues, cache.stats.evictions) == (window_bytes, 1, 0)


async def test_byte_bound_evicts_the_least_recently_read_queue(open_store):
    store = await open_store()
    bodies = {q: await put(store, q, 10, size=1000) for q in ("qa", "qb", "qc")}
    per_window = WINDOW_OVERHEAD + sum(cost("qa", b) for b in bodies["qa"])
    cache = QueueCache(store, max_bytes=2 * per_window)

    def read_all(queue: str) -> None:
        res = cache.read(queue, 0, max_messages=10)
        assert res.status is GetStatus.FOUND
        assert [m.body for m in res.messages] == bodies[queue]
        assert cache.stats.bytes <= cache.max_bytes

    read_all("qa")
    read_all("qb")
    assert (cache.stats.bytes, cache.stats.queues, cache.stats.store_reads) == (2 * per_window, 2, 2)
    read_all("qa")  # a hit: qa becomes the most recently read
    assert cache.stats.store_reads == 2
    read_all("qc")
    assert cache.window("qb") is None
    assert cache.window("qa") == cache.window("qc") == (0, 10)
    assert (cache.stats.evictions, cache.stats.queues, cache.stats.bytes) == (1, 2, 2 * per_window)
    read_all("qb")  # qa was read before qc: qa goes
    assert cache.window("qa") is None and cache.window("qb") == cache.window("qc") == (0, 10)
    assert (cache.stats.evictions, cache.stats.store_reads) == (2, 4)

    # a notify for a queue nobody reads here never pushes out a window that is read
    cache.on_notify("qx", 5)
    assert cache.window("qb") == cache.window("qc") == (0, 10)
    assert (cache.stats.evictions, cache.stats.queues, cache.stats.bytes) == (3, 2, 2 * per_window)

    # one window alone over the bound keeps its newest messages
    one = cost("qa", bodies["qa"][0])
    small = QueueCache(store, max_bytes=WINDOW_OVERHEAD + 4 * one)
    res = small.read("qa", 0, max_messages=10)
    assert [m.body for m in res.messages] == bodies["qa"]
    assert small.window("qa") == (6, 10)
    assert (small.stats.bytes, small.stats.evictions) == (WINDOW_OVERHEAD + 4 * one, 0)
    # and a message bigger than the whole cache is not kept at all
    tiny = QueueCache(store, max_bytes=WINDOW_OVERHEAD + one - 1)
    assert len(tiny.read("qa", 0, max_messages=10).messages) == 10
    assert tiny.window("qa") == (10, 10) and tiny.stats.bytes == WINDOW_OVERHEAD


async def test_window_messages_bound_drops_the_oldest(open_store):
    store = await open_store()
    bodies = await put(store, "q", 200, size=100)
    cache = QueueCache(store, window_messages=50)
    got, _ = read_to_end(cache, "q")
    assert got == list(enumerate(bodies))
    assert cache.window("q") == (150, 200)
    assert cache.stats.bytes == WINDOW_OVERHEAD + sum(cost("q", b) for b in bodies[150:])

    fresh = QueueCache(store, window_messages=50)
    res = fresh.read("q", 0, max_messages=120)
    assert [m.body for m in res.messages] == bodies[:120]  # the reader still gets its whole batch
    assert fresh.window("q") == (70, 120)
    assert fresh.stats.bytes == WINDOW_OVERHEAD + sum(cost("q", b) for b in bodies[70:120])


async def test_statuses_are_the_stores_own(open_store):
    store = await open_store()
    await put(store, "q", 10)
    cache = QueueCache(store)
    cases = [
        ("nope", 0, GetStatus.NO_SUCH_QUEUE),
        ("q", 10, GetStatus.NO_NEW_MESSAGE),
        ("q", 11, GetStatus.OFFSET_OVERFLOW),
        ("q", 500, GetStatus.OFFSET_OVERFLOW),
        ("q", -1, GetStatus.OFFSET_TOO_SMALL),
    ]
    for queue, offset, status in cases:
        expected = store.get_now(queue, offset)
        got = cache.read(queue, offset)
        assert got.status is status
        assert got == expected
    assert (cache.stats.store_reads, cache.stats.hits, cache.stats.misses) == (5, 0, 0)
    assert cache.window("nope") is None and cache.window("q") == (10, 10)  # waiting at the end

    # below the (empty) window waiting at the end: a store read that leaves the window alone
    assert len(cache.read("q", 0, max_messages=5).messages) == 5
    assert cache.window("q") == (10, 10)
    # with messages in the window: overflow past it and nothing new at its end, still the store's answers
    cache.drop("q")
    assert cache.read("q", 0).next_offset == 10 and cache.window("q") == (0, 10)
    assert cache.read("q", 12) == store.get_now("q", 12)
    assert cache.read("q", 10) == store.get_now("q", 10)  # not notified: asked the store
    reads = cache.stats.store_reads
    cache.on_notify("q", 10)
    assert cache.read("q", 10) == store.get_now("q", 10)  # notified: answered from memory
    assert cache.stats.store_reads == reads
    assert cache.window("q") == (0, 10)

    # a notify for a queue that turns out not to exist leaves nothing behind
    queues = cache.stats.queues
    cache.on_notify("ghost", 3)
    assert cache.stats.queues == queues + 1
    assert cache.read("ghost", 0) == store.get_now("ghost", 0)
    assert cache.stats.queues == queues and cache.stats.bytes == WINDOW_OVERHEAD + 10 * cost("q", b"q:0")


async def test_limits_are_applied_like_the_store(open_store):
    store = await open_store()
    for i in range(40):
        await store.put(Message("t/q", bytes([65 + i % 26]) * (50 + 37 * (i % 7))), ["q"])
    size = store.get_now("q", 0, 40, 1 << 30).messages[0].size
    cases = [
        (0, 32, 4 << 20), (5, 3, 4 << 20), (0, 10, 1), (3, 10, 2 * size), (15, 10, 4 << 20),
        (15, 10, 1200), (19, 32, 4 << 20), (20, 32, 4 << 20), (10, 32, 3000), (25, 5, 400),
    ]
    for offset, max_messages, max_bytes in cases:
        cache = QueueCache(store)
        cache.read("q", 0, max_messages=20)  # window [0, 20): some cases run past it
        expected = store.get_now("q", offset, max_messages, max_bytes)
        got = cache.read("q", offset, max_messages, max_bytes)
        assert [m.msg_id for m in got.messages] == [m.msg_id for m in expected.messages], (offset, max_messages)
        assert (got.status, got.next_offset, got.min_offset, got.max_offset) == (
            expected.status, expected.next_offset, expected.min_offset, expected.max_offset,
        )


async def test_new_messages_extend_the_window_after_their_notify(open_store):
    store = await open_store()
    bodies = await put(store, "q", 20)
    cache = QueueCache(Link(store))
    cache.on_notify("q", 20)
    res = cache.read("q", 0)
    assert [m.body for m in res.messages] == bodies and res.next_offset == 20
    assert cache.read("q", 20).status is GetStatus.NO_NEW_MESSAGE
    assert cache.stats.store_reads == 1

    bodies += await put(store, "q", 5, start=20)
    # The notify for the new messages is still on its way: the cache answers from what it knows
    # (the store itself would have answered the same a moment earlier); that notify wakes the reader.
    assert cache.read("q", 20).status is GetStatus.NO_NEW_MESSAGE
    assert cache.stats.store_reads == 1

    cache.on_notify("q", 25)
    res = cache.read("q", 10)  # ten from the window, the rest with one store read from its end
    assert [(m.queue_offset, m.body) for m in res.messages] == list(enumerate(bodies))[10:]
    assert (res.status, res.next_offset, res.max_offset) == (GetStatus.FOUND, 25, 25)
    assert cache.window("q") == (0, 25)
    assert (cache.stats.store_reads, cache.stats.hits, cache.stats.misses) == (2, 10, 25)
    res = cache.read("q", 20)
    assert [m.body for m in res.messages] == bodies[20:] and res.next_offset == 25
    assert cache.read("q", 25).status is GetStatus.NO_NEW_MESSAGE
    assert (cache.stats.store_reads, cache.stats.hits, cache.stats.misses) == (2, 15, 25)

    cache.clear()
    assert (cache.stats.queues, cache.stats.bytes, cache.window("q")) == (0, 0, None)
    assert [m.body for m in cache.read("q", 0, max_messages=100).messages] == bodies
    assert cache.stats.store_reads == 3


async def test_retention_trims_the_window_and_drops_one_it_emptied(open_store):
    store = await open_store(segment_size=8192, retention_bytes=20_000, retention_hours=0)
    old = await put(store, "old", 8, size=700)
    bodies = await put(store, "q", 60, size=700)
    cache = QueueCache(Link(store), window_messages=40)  # (told of "q" only: "old" is not trusted at its end)
    assert [b for _, b in read_to_end(cache, "old")[0]] == old
    assert [b for _, b in read_to_end(cache, "q")[0]] == bodies
    cache.on_notify("q", 60)
    assert cache.window("old") == (0, 8) and cache.window("q") == (20, 60)

    assert await store.apply_retention() > 0
    low = await store.min_offset("q")
    assert 20 < low < 60 and await store.min_offset("old") == 8

    # a lagging reader learns the new minimum; the window keeps what the store still has
    res = cache.read("q", 0)
    assert res == store.get_now("q", 0) and res.status is GetStatus.OFFSET_TOO_SMALL
    assert res.next_offset == low
    assert cache.window("q") == (low, 60)
    got, _ = read_to_end(cache, "q", low)
    assert got == list(enumerate(bodies))[low:]

    # "old": the store read at the window's end says everything in it is gone
    reads = cache.stats.store_reads
    res = cache.read("old", 8)
    assert res == store.get_now("old", 8) and res.status is GetStatus.NO_NEW_MESSAGE
    assert cache.stats.store_reads == reads + 1
    assert cache.window("old") is None
    assert cache.read("old", 0).status is GetStatus.OFFSET_TOO_SMALL and cache.window("old") is None
    assert cache.stats.queues == 1
    assert cache.stats.bytes == WINDOW_OVERHEAD + sum(cost("q", b) for b in bodies[low:])


@pytest.mark.parametrize("notify", [True, False], ids=["notified", "unnotified"])
async def test_random_reads_match_the_store(open_store, notify):
    # Every answer equals the store's: hearing the store's notify events (as the cache does by
    # itself) and not (then the cache asks the store whenever a reader reaches a window's end).
    rng = random.Random(7)
    store = await open_store()
    queues = ["r0", "r1", "r2"]
    ends = dict.fromkeys(queues, 0)
    cache = QueueCache(store if notify else Unheard(store), max_bytes=24 * MESSAGE_OVERHEAD, window_messages=7)
    readers = {(q, k): 0 for q in queues for k in range(4)}
    for _ in range(600):
        if rng.random() < 0.3:
            q = rng.choice(queues)
            await store.put(Message(f"t/{q}", bytes(rng.randrange(1, 300))), [q])
            ends[q] += 1
            continue
        key = rng.choice(list(readers))
        q = key[0]
        offset = readers[key] if rng.random() < 0.9 else rng.randrange(-1, ends[q] + 3)
        max_messages, max_bytes = rng.choice([1, 2, 5, 32]), rng.choice([1, 200, 700, 4 << 20])
        expected = store.get_now(q, offset, max_messages, max_bytes)
        got = cache.read(q, offset, max_messages, max_bytes)
        assert (got.status, got.next_offset, got.min_offset) == (
            expected.status, expected.next_offset, expected.min_offset,
        )
        assert [m.msg_id for m in got.messages] == [m.msg_id for m in expected.messages]
        if notify:
            assert got.max_offset == expected.max_offset
        else:  # from memory: the max as of the cache's last store read
            assert got.next_offset <= got.max_offset <= expected.max_offset
        assert cache.stats.bytes <= cache.max_bytes
        if got.status is GetStatus.FOUND:
            readers[key] = got.next_offset
    assert cache.stats.hits > 0 and cache.stats.evictions > 0
