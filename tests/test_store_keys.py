"""The message-key index and tag-filtered reads: query by key (several space-separated keys per message), time
bounds, limits, rebuilt by recovery when the index lost its unflushed writes, and entries
that retention made stale are skipped."""

from __future__ import annotations

import asyncio
import shutil

from store import Message


async def test_query_by_key_finds_each_key_of_a_message(open_store):
    store = await open_store()
    await store.put_batch([
        (Message("orders", b"o1", key="order-1 customer-7"), ["q"]),
        (Message("orders", b"o2", key="order-2 customer-7"), ["q"]),
        (Message("refunds", b"r1", key="order-1"), ["r"]),
        (Message("orders", b"none"), ["q"]),
    ])
    assert [m.body for m in store.query_by_key("orders", "order-1")] == [b"o1"]
    assert [m.body for m in store.query_by_key("orders", "customer-7")] == [b"o1", b"o2"]
    assert [m.body for m in store.query_by_key("refunds", "order-1")] == [b"r1"]
    assert store.query_by_key("orders", "order-3") == []
    assert store.query_by_key("orders", "order") == []  # whole keys only, not prefixes
    assert [m.body for m in store.query_by_key("orders", "customer-7", max_messages=1)] == [b"o2"]


async def test_query_by_key_in_every_topic_says_when_it_searched_only_some(open_store):
    store = await open_store()
    await store.put_batch([
        (Message("a", b"a1", key="id-1"), ["q"]),
        (Message("ab", b"ab1", key="other id-1x"), ["q"]),
        (Message("b", b"b1", key="x id-1"), ["q"]),
        (Message("b/c", b"bc", key="id-2"), ["q"]),
        (Message("c", b"c1", key="id-1"), ["q"]),
    ])
    found, complete = store.query_by_key_in_every_topic("id-1")
    assert [m.body for m in found] == [b"a1", b"b1", b"c1"] and complete  # whole keys only
    assert store.query_by_key_in_every_topic("id-3") == ([], True)
    found, complete = store.query_by_key_in_every_topic("id-1", max_topics=2)  # topics a and ab
    assert [m.body for m in found] == [b"a1"] and not complete
    found, complete = store.query_by_key_in_every_topic("id-1", max_messages=2)
    assert [m.body for m in found] == [b"a1", b"b1"] and complete
    found, complete = store.query_by_key_in_every_topic("id-1", max_topics=5)  # every topic, just so
    assert len(found) == 3 and complete


async def test_query_by_key_honours_the_time_range(open_store):
    store = await open_store()
    first = await store.put(Message("t", b"a", key="k"), ["q"])
    await asyncio.sleep(0.005)
    second = await store.put(Message("t", b"b", key="k"), ["q"])
    assert first.store_timestamp < second.store_timestamp
    found = store.query_by_key("t", "k", begin_ms=second.store_timestamp, end_ms=second.store_timestamp)
    assert [m.msg_id for m in found] == [second.msg_id]
    assert store.query_by_key("t", "k", end_ms=first.store_timestamp - 1) == []


async def test_key_index_is_rebuilt_from_the_commitlog(open_store, data_dir):
    store = await open_store()
    result = await store.put(Message("t", b"kept", key="find-me"), ["q"])
    await store.close()
    shutil.rmtree(data_dir / "index")  # as if the index lost everything since its last flush
    store = await open_store()
    assert [m.msg_id for m in store.query_by_key("t", "find-me")] == [result.msg_id]


async def test_retention_leaves_no_stale_key_hits(open_store):
    store = await open_store(segment_size=8192, retention_bytes=10_000, retention_hours=0)
    results = await store.put_batch([(Message("t", bytes(1000), key="same"), ["q"]) for _ in range(40)])
    assert await store.apply_retention() > 0
    found = store.query_by_key("t", "same", max_messages=100)
    kept = [r.msg_id for r in results if r.position >= store.min_position]
    assert 0 < len(kept) < len(results)
    assert [m.msg_id for m in found] == kept


async def test_get_filtered_by_tag_hash_skips_other_tags_without_reading_them(open_store):
    from store import GetStatus, tag_hash

    store = await open_store()
    tags = ["A", "B", "A", "C", "B", "A"]
    await store.put_batch([(Message("t", f"{i}{t}".encode(), tags=t), ["q"]) for i, t in enumerate(tags)])
    wanted = frozenset({tag_hash("A"), tag_hash("C")})
    got = store.get_now("q", 0, 2, tag_hashes=wanted)
    assert got.status is GetStatus.FOUND
    assert [(m.queue_offset, m.body) for m in got.messages] == [(0, b"0A"), (2, b"2A")]
    assert got.next_offset == 3
    got = store.get_now("q", got.next_offset, 32, tag_hashes=wanted)
    assert [m.body for m in got.messages] == [b"3C", b"5A"] and got.next_offset == 6
    only_b = store.get_now("q", 5, 32, tag_hashes=frozenset({tag_hash("B")}))
    assert only_b.status is GetStatus.NO_MATCHED_MESSAGE and only_b.next_offset == 6
    assert store.get_now("q", 6, 32, tag_hashes=wanted).status is GetStatus.NO_NEW_MESSAGE
