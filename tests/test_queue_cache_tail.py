"""The store's write-through to the queue cache (store/read/tail.py, QueueCache.take_tail): readers at a
queue's end get what is committed without a store read, the same messages a read returns, and
nothing changes for readers elsewhere (lagging, after retention, queues nobody reads)."""

from __future__ import annotations

import random

import pytest

from cache import WINDOW_OVERHEAD, QueueCache, message_cost
from store import GetStatus, Message


def bodies_of(result) -> list[bytes]:
    return [m.body for m in result.messages]


async def test_a_reader_at_the_end_takes_new_messages_without_a_store_read(open_store):
    store = await open_store()
    cache = QueueCache(store)
    assert cache.read("q", 0).status is GetStatus.NO_SUCH_QUEUE and "q" not in cache.following
    await store.put(Message("t/q", b"first"), ["q"])
    assert bodies_of(cache.read("q", 0)) == [b"first"]
    assert cache.read("q", 1).status is GetStatus.NO_NEW_MESSAGE
    assert cache.following == {"q"}
    reads = cache.stats.store_reads

    # one commit of messages to "q" and other queues, with tags, keys and properties
    items = [(Message("t/q", f"m{i}".encode(), tags="red" if i % 2 else None, key=f"k{i}",
                      properties={"p": str(i)}), ["q", "other"] if i % 3 else ["q"]) for i in range(10)]
    await store.put_batch(items)
    cache.on_notify("q", 11)
    got = cache.read("q", 1, max_messages=100)
    assert cache.stats.store_reads == reads and cache.stats.messages_written_through == 10
    # exactly what a read of the store returns: every field, the bounds, the status
    assert got == store.get_now("q", 1, max_messages=100)
    assert [m.queue_offset for m in got.messages] == list(range(1, 11))
    assert cache.read("q", 11).status is GetStatus.NO_NEW_MESSAGE and cache.stats.store_reads == reads
    assert cache.window("other") is None  # a queue nobody reads here: nothing built for it


async def test_several_caches_over_one_store_each_take_their_queues(open_store):
    store = await open_store()
    await store.put(Message("t/a", b"0"), ["a", "b"])
    one, two = QueueCache(store), QueueCache(store)
    for cache, queue in ((one, "a"), (two, "a"), (two, "b")):
        assert cache.read(queue, 0).status is GetStatus.FOUND and cache.read(queue, 1).status is GetStatus.NO_NEW_MESSAGE
    await store.put_batch([(Message("t/a", f"{i}".encode()), ["a", "b"]) for i in range(1, 5)])
    assert (one.following, two.following) == ({"a"}, {"a", "b"})
    assert (one.stats.messages_written_through, two.stats.messages_written_through) == (4, 8)
    for cache, queue in ((one, "a"), (two, "a"), (two, "b")):
        cache.on_notify(queue, 5)
        reads = cache.stats.store_reads
        assert cache.read(queue, 1) == store.get_now(queue, 1) and cache.stats.store_reads == reads


async def test_a_window_no_reader_keeps_up_with_is_not_written_through(open_store):
    store = await open_store()
    cache = QueueCache(store, window_messages=8)
    await store.put(Message("t/q", b"0"), ["q"])
    assert bodies_of(cache.read("q", 0)) == [b"0"]
    for i in range(1, 21):  # nobody reads: at most 8 unread messages are written through
        await store.put(Message("t/q", f"{i}".encode()), ["q"])
    assert cache.stats.messages_written_through == 8 and "q" not in cache.following
    assert cache.window("q") == (1, 9)  # (the message read made room)
    offset, got = 1, []
    for _ in range(10):  # the reader catches up: the window, then the store, then the tail again
        res = cache.read("q", offset, max_messages=5)
        if res.status is not GetStatus.FOUND:
            break
        got += bodies_of(res)
        offset = res.next_offset
    assert got == [f"{i}".encode() for i in range(1, 21)] and "q" in cache.following
    await store.put(Message("t/q", b"21"), ["q"])
    assert cache.stats.messages_written_through == 9


async def test_writing_through_never_evicts_another_window(open_store):
    # Over max_bytes, the written window's read head goes first, then the write-through stops;
    # the window of another queue, least recently read, stays (its reader is about to read it).
    store = await open_store()
    await store.put(Message("t/b", b"b00"), ["b"])
    await store.put(Message("t/a", b"a00"), ["a"])
    cost = message_cost(store.get_now("a", 0).messages[0])  # every message here costs the same
    cache = QueueCache(store, max_bytes=2 * WINDOW_OVERHEAD + 6 * cost)
    for queue in ("b", "a"):
        assert cache.read(queue, 0).status is GetStatus.FOUND and cache.read(queue, 1).status is GetStatus.NO_NEW_MESSAGE
    assert cache.following == {"a", "b"}
    offset = 1
    for i in range(1, 12):  # a reader keeping up with "a": its read head makes room
        await store.put(Message("t/a", f"a{i:02d}".encode()), ["a"])
        res = cache.read("a", offset)
        assert bodies_of(res) == [f"a{i:02d}".encode()]
        offset = res.next_offset
    assert cache.stats.messages_written_through == 11 and cache.stats.evictions == 0
    assert cache.window("b") == (0, 1) and cache.stats.bytes <= cache.max_bytes
    for i in range(12, 20):  # nobody reads "a" now: room for 5 unread, then no more written through
        await store.put(Message("t/a", f"a{i:02d}".encode()), ["a"])
    assert cache.stats.messages_written_through == 16 and "a" not in cache.following
    assert cache.window("b") == (0, 1) and cache.stats.evictions == 0 and cache.stats.bytes <= cache.max_bytes
    got = []
    for _ in range(20):
        res = cache.read("a", offset)
        if res.status is not GetStatus.FOUND:
            break
        got += bodies_of(res)
        offset = res.next_offset
    assert got == [f"a{i:02d}".encode() for i in range(12, 20)]


async def test_a_queue_is_followed_only_while_its_window_ends_at_the_queue_end(open_store):
    store = await open_store()
    await store.put_batch([(Message("t/q", f"{i}".encode()), ["q"]) for i in range(10)])
    cache = QueueCache(store)
    assert bodies_of(cache.read("q", 0, max_messages=4)) == [b"0", b"1", b"2", b"3"]
    assert "q" not in cache.following  # the window stops short of the queue's end
    await store.put(Message("t/q", b"10"), ["q"])
    assert cache.stats.messages_written_through == 0
    cache.drop("q")
    assert cache.read("q", 11).status is GetStatus.NO_NEW_MESSAGE and "q" in cache.following
    cache.drop("q")
    assert "q" not in cache.following
    cache.read("q", 11)
    cache.clear()
    assert not cache.following


async def test_after_retention_a_written_through_window_gives_the_stores_answers(open_store):
    store = await open_store(segment_size=8192, retention_bytes=20_000, retention_hours=0)
    cache = QueueCache(store, window_messages=4096)
    assert cache.read("q", 0).status is GetStatus.NO_SUCH_QUEUE
    await store.put(Message("t/q", b"x" * 700), ["q"])
    assert cache.read("q", 0).status is GetStatus.FOUND
    offset = 1
    for i in range(1, 60):  # one reader keeps up at the tail: everything written through
        await store.put(Message("t/q", f"{i}".encode().ljust(700, b".")), ["q"])
        res = cache.read("q", offset)
        assert [m.queue_offset for m in res.messages] == [i]
        offset = res.next_offset
    assert cache.stats.messages_written_through == 59 and cache.window("q") == (0, 60)
    assert await store.apply_retention() > 0
    low = await store.min_offset("q")
    assert 0 < low < 60

    await store.put(Message("t/q", b"60"), ["q"])  # the hand-off says where the queue now starts
    assert cache.window("q") == (low, 61)
    for at in (0, low - 1):
        res = cache.read("q", at)
        assert res == store.get_now("q", at) and res.status is GetStatus.OFFSET_TOO_SMALL
    res = cache.read("q", low, max_messages=100)
    assert res == store.get_now("q", low, max_messages=100) and res.messages[-1].body == b"60"


async def test_a_failing_tail_reader_does_not_fail_the_put(open_store):
    store = await open_store()

    class Broken:
        def __init__(self) -> None:
            self.following = {"q"}

        def take_tail(self, queue, result):
            raise RuntimeError("broken reader")

    store.add_tail_reader(Broken())
    res = await store.put(Message("t/q", b"kept"), ["q"])
    assert res.queue_offsets == {"q": 0}
    assert bodies_of(store.get_now("q", 0)) == [b"kept"]


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_random_commits_and_readers_match_the_store(open_store, seed):
    # Readers at the tail, lagging and jumping, with commits of several messages to several
    # queues between reads and the gateway's notify after each: every answer is the store's.
    rng = random.Random(seed)
    store = await open_store()
    queues = ["r0", "r1", "r2"]
    cache = QueueCache(store, max_bytes=200_000, window_messages=rng.choice([4, 16, 4096]))
    readers = {(q, k): 0 for q in queues for k in range(3)}
    for _ in range(300):
        if rng.random() < 0.3:
            items = [(Message("t", bytes(rng.randrange(1, 200))), rng.sample(queues, rng.randrange(1, 4)))
                     for _ in range(rng.randrange(1, 6))]
            await store.put_batch(items)
            for q in queues:
                cache.on_notify(q, store.max_offset_now(q))
            continue
        key = rng.choice(list(readers))
        q = key[0]
        offset = readers[key] if rng.random() < 0.9 else rng.randrange(0, store.max_offset_now(q) + 2)
        max_messages = rng.choice([1, 3, 32])
        expected = store.get_now(q, offset, max_messages)
        got = cache.read(q, offset, max_messages)
        assert got == expected
        if got.status is GetStatus.FOUND:
            readers[key] = got.next_offset
        # the accounting: what each window holds, at what it costs (a head dropped is subtracted
        # from running totals, not costed again)
        held = [WINDOW_OVERHEAD + sum(map(message_cost, w.messages[w.head:])) for w in cache._windows.values()]
        assert [w.bytes for w in cache._windows.values()] == held and cache.stats.bytes == sum(held)
    assert cache.stats.messages_written_through > 0 and cache.stats.evictions + cache.stats.hits > 0


async def test_a_closed_cache_no_longer_hears_the_store(open_store):
    """A store node makes a queue cache each time it leads, on the same store: the cache of a
    spell that ended neither takes commits' messages nor hears notify events any more."""
    store = await open_store()
    cache = QueueCache(store)
    await store.put(Message("t/q", b"first"), ["q"])
    assert bodies_of(cache.read("q", 0)) == [b"first"] and cache.following == {"q"}
    await store.put(Message("t/q", b"second"), ["q"])
    assert cache.stats.messages_written_through == 1 and store.notify.active
    cache.close()
    await store.put(Message("t/q", b"third"), ["q"])
    assert cache.stats.messages_written_through == 1
    assert not store.notify.active  # (nothing else listened)
