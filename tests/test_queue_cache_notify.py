"""The queue cache hears the store's notify events itself (``listen_notify``), before any
subscription is woken by them: no protocol's notify handler has to tell it, and a reader woken by
an event finds the queue's new end known."""

from __future__ import annotations

import logging

from cache import QueueCache
from store import GetStatus, Message


async def test_the_cache_knows_a_queues_new_end_without_being_told(open_store):
    store = await open_store()
    cache = QueueCache(store)
    await store.put(Message("t/q", b"first"), ["q"])
    assert cache.read("q", 0).status is GetStatus.FOUND
    assert cache.read("q", 1).status is GetStatus.NO_NEW_MESSAGE

    await store.put_batch([(Message("t/q", f"m{i}".encode()), ["q", "other"]) for i in range(10)])
    reads = cache.stats.store_reads
    got = cache.read("q", 1, max_messages=100)  # no on_notify call: the cache heard the event
    assert [m.queue_offset for m in got.messages] == list(range(1, 11))
    assert cache.read("q", 11).status is GetStatus.NO_NEW_MESSAGE
    assert cache.stats.store_reads == reads  # the end was known: no store read to find it
    assert cache.window("other") is None and cache.stats.queues == 1  # a queue nobody reads: nothing kept


async def test_a_woken_subscriber_finds_the_new_end_known(open_store):
    store = await open_store()
    cache = QueueCache(store)
    await store.put(Message("t/q", b"0"), ["q"])
    assert cache.read("q", 1).status is GetStatus.NO_NEW_MESSAGE
    notify = store.subscribe_notify()
    await store.put(Message("t/q", b"1"), ["q"])
    queue, max_offset = await anext(notify)
    assert (queue, max_offset) == ("q", 2)
    reads = cache.stats.store_reads
    result = cache.read("q", 1)
    assert [m.body for m in result.messages] == [b"1"] and result.max_offset == 2
    assert cache.read("q", 2).status is GetStatus.NO_NEW_MESSAGE and cache.stats.store_reads == reads
    notify.close()


async def test_a_failing_listener_leaves_the_store_and_the_subscribers_alone(open_store, caplog):
    store = await open_store()
    notify = store.subscribe_notify()

    def broken(events: dict[str, int]) -> None:
        raise RuntimeError("listener bug")

    store.listen_notify(broken)
    with caplog.at_level(logging.ERROR, logger="tidemq.store"):
        await store.put(Message("t/q", b"0"), ["q"])
        assert await anext(notify) == ("q", 1)
        await store.put(Message("t/q", b"1"), ["q"])  # the store still writes
    assert store.get_now("q", 0).next_offset == 2
    assert "notify listener failed" in caplog.text
    notify.close()
