"""The store's public API through real files: ordering, multi-queue indexing, reads, offsets."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from store import (
    GetStatus,
    InvalidMessageError,
    Message,
    MessageTooLargeError,
    StoreClosedError,
    StoreLockedError,
    decode_msg_id,
    tag_hash,
)


async def read_all(store, queue: str, start: int = 0, batch: int = 64):
    out = []
    offset = start
    while True:
        res = await store.get(queue, offset, batch)
        if res.status is not GetStatus.FOUND:
            return out, res
        out.extend(res.messages)
        offset = res.next_offset


async def test_order_is_kept_per_queue_under_concurrent_puts(open_store):
    store = await open_store()

    async def producer(p: int):
        results = []
        for i in range(200):
            queue = f"orders/{p % 3}"
            res = await store.put(Message("orders", f"{p}:{i}".encode()), [queue])
            results.append((queue, res.queue_offsets[queue], f"{p}:{i}".encode()))
        return results

    produced = [r for rs in await asyncio.gather(*(producer(p) for p in range(12))) for r in rs]
    for q in range(3):
        queue = f"orders/{q}"
        messages, last = await read_all(store, queue)
        mine = sorted((off, body) for qq, off, body in produced if qq == queue)
        assert [m.queue_offset for m in messages] == list(range(len(mine)))
        assert [(m.queue_offset, m.body) for m in messages] == mine
        assert last.status is GetStatus.NO_NEW_MESSAGE and last.next_offset == len(mine)
        # each producer's own messages come back in the order it sent them
        for p in range(q, 12, 3):
            seq = [int(m.body.split(b":")[1]) for m in messages if m.body.startswith(f"{p}:".encode())]
            assert seq == sorted(seq) and len(seq) == 200


async def test_one_message_indexed_into_many_queues(open_store):
    store = await open_store()
    await store.put(Message("a/b", b"first"), ["a/b"])
    res = await store.put(
        Message("a/b", b"payload", {"content-type": "text/plain"}, key="k-1", tags="TagA"),
        ["a/b", "a/+", "a/#"],
    )
    assert res.queue_offsets == {"a/b": 1, "a/+": 0, "a/#": 0}
    for queue, offset in res.queue_offsets.items():
        got = await store.get(queue, offset, 1)
        assert got.status is GetStatus.FOUND
        m = got.messages[0]
        assert (m.msg_id, m.body, m.topic, m.key) == (res.msg_id, b"payload", "a/b", "k-1")
        assert m.properties["content-type"] == "text/plain"
        assert m.queues == [("a/b", 1), ("a/+", 0), ("a/#", 0)]
        assert m.tag_hash == tag_hash("TagA") == 2598919  # Java "TagA".hashCode()
    # write amplification is index entries only: one commitlog record for three queues
    assert store.end_position == res.position + res.size


async def test_put_batch_and_get_limits(open_store):
    store = await open_store()
    results = await store.put_batch([(Message("t", bytes([i]) * 100), ["q"]) for i in range(100)])
    assert [r.queue_offsets["q"] for r in results] == list(range(100))
    assert len({r.msg_id for r in results}) == 100
    got = await store.get("q", 10, max_messages=5)
    assert [m.queue_offset for m in got.messages] == [10, 11, 12, 13, 14] and got.next_offset == 15
    # max_bytes bounds the batch but one message always comes back
    got = await store.get("q", 0, max_messages=50, max_bytes=1)
    assert len(got.messages) == 1
    got = await store.get("q", 0, max_messages=50, max_bytes=results[0].size * 3)
    assert len(got.messages) == 3
    assert (await store.get("q", 100)).status is GetStatus.NO_NEW_MESSAGE
    over = await store.get("q", 105)
    assert over.status is GetStatus.OFFSET_OVERFLOW and over.next_offset == 100
    assert (await store.get("nope", 0)).status is GetStatus.NO_SUCH_QUEUE
    assert (await store.min_offset("q"), await store.max_offset("q")) == (0, 100)


async def test_get_by_id_and_message_id_form(open_store):
    store = await open_store(identity_host="10.1.2.3", identity_port=10911)
    res = await store.put(Message("t", b"x"), ["q"])
    res2 = await store.put(Message("t", b"y"), ["q"])
    assert decode_msg_id(res2.msg_id) == ("10.1.2.3", 10911, res2.position)
    assert len(res.msg_id) == 32 and res.msg_id == res.msg_id.upper()
    m = await store.get_by_id(res2.msg_id)
    assert m is not None and m.body == b"y" and m.position == res2.position
    # an id names a commitlog position: position 0 of this store is the first message
    assert (await store.get_by_id("00" * 16)).body == b"x"
    assert await store.get_by_id("not-an-id") is None
    assert await store.get_by_id(res.msg_id[:16] + f"{10**9:016X}") is None


async def test_offset_for_timestamp(open_store):
    store = await open_store()
    await store.put_batch([(Message("t", b"old"), ["q"]) for _ in range(5)])
    await asyncio.sleep(0.02)
    boundary = time.time_ns() // 1_000_000
    await asyncio.sleep(0.02)
    await store.put_batch([(Message("t", b"new"), ["q"]) for _ in range(7)])
    assert await store.offset_for_timestamp("q", 0) == 0
    assert await store.offset_for_timestamp("q", boundary) == 5
    assert await store.offset_for_timestamp("q", boundary + 10_000_000) == 12
    assert await store.offset_for_timestamp("missing", boundary) == 0


async def test_segments_roll_and_stay_readable(open_store):
    store = await open_store(segment_size=8192)
    results = await store.put_batch([(Message("t", os.urandom(700)), ["q"]) for _ in range(60)])
    segments = {r.position // 8192 for r in results}
    assert len(segments) > 4
    messages, _ = await read_all(store, "q")
    assert [m.msg_id for m in messages] == [r.msg_id for r in results]


async def test_light_queues_beyond_the_cache_bound(open_store, data_dir):
    store = await open_store(queue_cache_entries=64)
    names = [f"dev/{i}/state" for i in range(3000)]
    for round_ in range(3):
        await store.put_batch([(Message(n, f"{round_}".encode()), [n]) for n in names])
    assert store.index.cached_queues <= 64  # every dispatch trims the hot cache to its bound
    for n in names[::97]:
        assert await store.max_offset(n) == 3
        got = await store.get(n, 0, 10)
        assert [m.body for m in got.messages] == [b"0", b"1", b"2"]
    await store.close()
    store = await open_store(queue_cache_entries=64)
    assert await store.max_offset(names[1234]) == 3
    res = await store.put(Message("x", b"3"), [names[1234]])
    assert res.queue_offsets[names[1234]] == 3


async def test_notify_coalesces_per_queue(open_store):
    store = await open_store()
    sub = store.subscribe_notify()
    await store.put_batch([(Message("t", b"x"), ["a"]) for _ in range(50)])
    await asyncio.gather(*(store.put(Message("t", b"y"), ["a", "b"]) for _ in range(20)))
    events = {}
    while True:
        try:
            queue, offset = await asyncio.wait_for(sub.__anext__(), 0.2)
        except asyncio.TimeoutError:
            break
        assert queue not in events, "events for one queue must coalesce while the reader is busy"
        events[queue] = offset
    assert events == {"a": 70, "b": 20}
    await store.put(Message("t", b"z"), ["b"])
    assert await asyncio.wait_for(sub.__anext__(), 1) == ("b", 21)
    sub.close()


async def test_restart_keeps_messages_offsets_and_tables(open_store):
    store = await open_store()
    results = await store.put_batch([(Message("t", f"m{i}".encode()), ["q", f"q{i % 2}"]) for i in range(30)])
    await store.commit_offset("group-1", "q", 17)
    store.table("retained").put("a/b", b"retained-payload")
    store.table("sessions").put("client-1", b"session-blob")
    await store.close()

    store = await open_store()
    messages, _ = await read_all(store, "q")
    assert [m.body for m in messages] == [f"m{i}".encode() for i in range(30)]
    assert [m.msg_id for m in messages] == [r.msg_id for r in results]
    assert await store.max_offset("q1") == 15
    assert await store.get_offset("group-1", "q") == 17
    assert await store.get_offset("group-1", "other") is None
    assert store.table("retained").get("a/b") == b"retained-payload"
    assert list(store.table("sessions").items()) == [("client-1", b"session-blob")]
    store.table("retained").delete("a/b")
    assert store.table("retained").get("a/b") is None
    res = await store.put(Message("t", b"after"), ["q"])
    assert res.queue_offsets == {"q": 30}


async def test_consumer_offsets_checkpointed_periodically(open_store, data_dir):
    store = await open_store(checkpoint_interval=0.05)
    await store.commit_offset("g", "q", 5)
    await asyncio.sleep(0.3)
    assert store.meta.load_offset("g", "q") == 5


async def test_bad_input_is_refused_and_store_keeps_serving(open_store):
    store = await open_store(max_message_size=10_000)
    with pytest.raises(InvalidMessageError):
        await store.put(Message("t", b"x"), [])
    with pytest.raises(InvalidMessageError):
        await store.put(Message("t", b"x"), [""])
    with pytest.raises(MessageTooLargeError):
        await store.put(Message("t", b"x" * 20_000), ["q"])
    res = await store.put(Message("t", b"ok"), ["q"])
    assert res.queue_offsets == {"q": 0}
    await store.close()
    with pytest.raises(StoreClosedError):
        await store.put(Message("t", b"late"), ["q"])


async def test_put_each_refuses_a_bad_message_alone(open_store):
    """One message too large (or invalid) among independent ones: only it is refused."""
    store = await open_store(max_message_size=10_000)
    items = [(Message("t", b"a"), ["q"]), (Message("t", b"x" * 20_000), ["q"]), (Message("t", b"b"), []),
             (Message("t", b"c"), ["q"])]
    fut, refused = store.put_each_nowait(items)
    assert sorted(refused) == [1, 2]
    assert isinstance(refused[1], MessageTooLargeError) and isinstance(refused[2], InvalidMessageError)
    results = await fut
    assert [r.queue_offsets for r in results] == [{"q": 0}, {"q": 1}]
    assert [m.body for m in (await store.get("q", 0, 10)).messages] == [b"a", b"c"]
    # ordered streams: after a refusal, the rest of that stream is left out too, not the others
    items = [(Message("t", b"1"), ["q"]), (Message("t", b"x" * 20_000), ["q"]), (Message("t", b"2"), ["q"]),
             (Message("t", b"3"), ["q"])]
    fut, refused = store.put_each_nowait(items, groups=["s1", "s1", "s2", "s1"])
    assert sorted(refused) == [1, 3] and refused[3] is refused[1]
    assert [r.queue_offsets for r in await fut] == [{"q": 2}, {"q": 3}]


async def test_second_writer_on_same_data_dir_is_refused(open_store, data_dir):
    await open_store()
    with pytest.raises(StoreLockedError, match="in use by another process"):
        await open_store()


async def test_flag_and_pre_encoded_properties_round_trip(open_store) -> None:
    from store import encode_properties

    store = await open_store()
    encoded = encode_properties({"a": "1", "b": "2"})
    await store.put(Message("t", b"x", encoded_properties=encoded, tags="red", flag=0x1_0203), ["q"])
    await store.put(Message("t", b"y", {"c": "3"}, flag=0xFFFF_FFFF), ["q"])
    first, second = (await store.get("q", 0, 2)).messages
    assert (first.flag, first.properties) == (0x1_0203, {"a": "1", "b": "2", "TAGS": "red"})
    assert (second.flag, second.properties) == (0xFFFF_FFFF, {"c": "3"})
    with pytest.raises(InvalidMessageError):
        await store.put(Message("t", b"z", flag=1 << 32), ["q"])


async def test_queue_rows_of_an_earlier_version_still_say_where_a_queue_ends(open_store, data_dir):
    """Data dirs written before queue heads kept a queue's next offset in its name row only."""
    from rocksdict import Options, Rdict

    from store.index.consumequeue import NAME_PREFIX, QUEUE_ROW, head_key

    store = await open_store()
    results = await store.put_batch([(Message("t", f"{i}".encode()), ["legacy"]) for i in range(5)])
    qid = store.index.lookup("legacy").qid
    await store.close()
    db = Rdict(str(data_dir / "index"), Options(raw_mode=True))
    try:
        del db[head_key(qid)]  # what an earlier version wrote: the row with the offsets, no head
        db[NAME_PREFIX + b"legacy"] = QUEUE_ROW.pack(qid, 5, results[-1].position)
    finally:
        db.close()
    store = await open_store()
    assert await store.max_offset("legacy") == 5
    res = await store.put(Message("t", b"5"), ["legacy"])
    assert res.queue_offsets == {"legacy": 5}
    got = await store.get("legacy", 0, 10)
    assert [m.body for m in got.messages] == [f"{i}".encode() for i in range(6)]


async def test_a_new_queue_is_created_once_whether_or_not_the_cache_holds_every_queue(open_store):
    """From an empty index until the hot cache is first trimmed, a name the cache lacks is a new
    queue (no table lookup); after a trim or a restart, names it lacks are looked up."""
    store = await open_store(queue_cache_entries=16)
    await store.put_batch([(Message("t", b"a"), [f"q{i}"]) for i in range(10)])
    assert store.queue_count == 10
    await store.put_batch([(Message("t", b"b"), [f"q{i}"]) for i in range(40)])  # trims the cache
    await store.put_batch([(Message("t", b"c"), [f"q{i}"]) for i in range(40)])
    assert store.queue_count == 40
    assert [await store.max_offset(f"q{i}") for i in (0, 9, 10, 39)] == [3, 3, 2, 2]
    await store.close()
    store = await open_store(queue_cache_entries=16)
    results = await store.put_batch([(Message("t", b"d"), [f"q{i}"]) for i in (0, 39, 40)])
    assert [r.queue_offsets for r in results] == [{"q0": 3}, {"q39": 2}, {"q40": 0}]
    assert store.queue_count == 41
    await store.close()


async def test_a_queue_ends_at_its_newest_entry_or_head_whichever_is_further(open_store, data_dir):
    """A queue's head key is written only where its newest entries are removed (retention, a
    truncation); entries written later go past it, and a data dir of an earlier version has a
    head beside every queue. Reloaded from the index, a queue ends after the furthest."""
    from rocksdict import Options, Rdict

    from store.index.consumequeue import QUEUE_HEAD, head_key

    store = await open_store()
    await store.put_batch([(Message("t", f"{i}".encode()), ["behind"]) for i in range(5)])
    await store.put_batch([(Message("t", f"{i}".encode()), ["ahead"]) for i in range(5)])
    behind, ahead = store.index.lookup("behind").qid, store.index.lookup("ahead").qid
    await store.close()
    db = Rdict(str(data_dir / "index"), Options(raw_mode=True))
    try:
        db[head_key(behind)] = QUEUE_HEAD.pack(3, 0)  # older than the entries that follow it
        db[head_key(ahead)] = QUEUE_HEAD.pack(9, 0)  # its entries 5..8 removed (retention)
    finally:
        db.close()
    store = await open_store()
    assert [await store.max_offset("behind"), await store.max_offset("ahead")] == [5, 9]
    results = await store.put_batch([(Message("t", b"n"), [name]) for name in ("behind", "ahead")])
    assert [r.queue_offsets for r in results] == [{"behind": 5}, {"ahead": 9}]
