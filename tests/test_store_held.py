"""Held messages in the store (store/holds/held_messages.py, store/holds/codec.py): written once, in no queue until
released, then read as any message; discarded ones never; all of it rebuilt after a crash."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa

from store import GetStatus, Message
from store.read import columns
from store.holds.codec import HALF, TIMER
from store.read.readonly import CommitLogReader

ROOT = Path(__file__).resolve().parent.parent


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def test_a_held_message_is_in_no_queue_until_released(open_store):
    store = await open_store()
    before = await store.put(Message("t", b"first"), ["q"])
    held = await store.held.put(Message("t", b"later", {"a": "1"}, key="k1", tags="tagA"), ["q", "q2"], TIMER,
                                now_ms() + 60_000)
    after = await store.put(Message("t", b"second"), ["q"])
    assert before.queue_offsets == {"q": 0} and after.queue_offsets == {"q": 1}
    assert held.queue_offsets == {}
    assert (await store.get("q", 0, 10)).messages[-1].body == b"second"
    assert (await store.get("q2", 0, 10)).status is GetStatus.NO_SUCH_QUEUE

    assert store.held.due(TIMER, now_ms(), 10) == []  # not due yet
    (hold,) = store.held.due(TIMER, now_ms() + 61_000, 10)
    assert hold.target == held.position and hold.queues == ("q", "q2") and hold.size == held.size
    assert store.held.next_due_ms(TIMER) == hold.due_ms
    assert store.held.count(TIMER) == 1 and store.held.count(HALF) == 0

    (released,) = await store.held.release([hold])
    assert released.queue_offsets == {"q": 2, "q2": 0}
    assert store.held.count(TIMER) == 0 and store.held.get(hold.key) is None
    got = (await store.get("q", 2, 10)).messages
    assert [m.body for m in got] == [b"later"]
    message = got[0]
    assert message.msg_id == held.msg_id and message.position == held.position
    assert message.queue == "q" and message.queue_offset == 2
    assert message.properties == {"a": "1", "TAGS": "tagA"} and message.key == "k1" and message.topic == "t"
    assert message.tag_hash == hold.tag_hash != 0
    assert (await store.get("q2", 0, 10)).messages[0].body == b"later"
    assert store.read_at(held.position).body == b"later"


async def test_reads_coalesce_released_and_plain_messages_in_any_order(open_store, data_dir):
    store = await open_store()
    helds = [await store.held.put(Message("t", f"h{i}".encode()), ["q"], TIMER, 1000 + i) for i in range(3)]
    await store.put(Message("t", b"p0"), ["q"])
    holds = store.held.due(TIMER, 2000, 10)
    assert [h.target for h in holds] == [h.position for h in helds]
    await store.held.release(list(reversed(holds)))
    await store.put(Message("t", b"p1"), ["q"])
    bodies = [m.body for m in (await store.get("q", 0, 10)).messages]
    assert bodies == [b"p0", b"h2", b"h1", b"h0", b"p1"]
    # the Arrow reader (the Spark source's) follows releases too
    qid = store.index.lookup("q").qid
    read = columns.read_range_live(store.index.db, CommitLogReader(data_dir / "commitlog"), store.commitlog, "q", qid, 0, 5)
    assert pa.Table.from_batches(read.batches).column("payload").to_pylist() == bodies


async def test_a_discarded_message_is_never_indexed(open_store):
    store = await open_store()
    await store.held.put(Message("t", b"rolled back"), ["q"], HALF, 5)
    (hold,) = store.held.due(HALF, 10, 10)
    await store.held.discard([hold])
    assert store.held.count(HALF) == 0
    assert (await store.get("q", 0, 10)).status is GetStatus.NO_SUCH_QUEUE


async def test_tail_readers_get_the_released_message(open_store):
    store = await open_store()
    await store.put(Message("t", b"p0"), ["q"])

    class Reader:
        following = {"q"}
        got: list = []

        def take_tail(self, queue, result):
            self.got.extend(m.body for m in result.messages)

    reader = Reader()
    store.tail.readers.append(reader)
    await store.held.put(Message("t", b"held"), ["q"], TIMER, 1)
    await store.held.release(store.held.due(TIMER, 2, 10))
    assert reader.got == [b"held"]


CRASHER = textwrap.dedent("""
    import asyncio, os, sys
    from store import Message, MessageStore, StoreOptions
    from store.holds.codec import HALF, TIMER

    async def main():
        store = await MessageStore.open(StoreOptions(data_dir=sys.argv[1], flush="sync", index_flush_interval=3600.0))
        for i in range(5):
            await store.held.put(Message("t", f"timer{i}".encode()), ["q"], TIMER, 100 + i)
        await store.held.put(Message("t", b"half"), ["q"], HALF, 500)
        await store.held.put(Message("t", b"gone"), ["q"], HALF, 501)
        await store.put(Message("t", b"plain"), ["q"])
        due = store.held.due(TIMER, 102, 10)
        await store.held.release(due)
        await store.held.discard([h for h in store.held.due(HALF, 1000, 10) if h.due_ms == 501])
        print("DONE", flush=True)
        os._exit(0)  # no close: the index memtable (WAL off) dies with the process

    asyncio.run(main())
""")


async def test_holds_releases_and_discards_are_rebuilt_after_a_crash(open_store, data_dir):
    proc = subprocess.run([sys.executable, "-c", CRASHER, str(data_dir)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr
    store = await open_store()
    assert store.recovery.records_redispatched > 0
    bodies = [m.body for m in (await store.get("q", 0, 10)).messages]
    assert bodies == [b"plain", b"timer0", b"timer1", b"timer2"]
    assert [h.due_ms for h in store.held.due(TIMER, 10_000, 10)] == [103, 104]
    assert [h.due_ms for h in store.held.due(HALF, 10_000, 10)] == [500]
    await store.held.release(store.held.due(TIMER, 10_000, 10))
    assert [m.body for m in (await store.get("q", 0, 10)).messages][-2:] == [b"timer3", b"timer4"]


async def test_a_hold_ends_once_however_often_it_is_settled(open_store):
    store = await open_store()
    await store.held.put(Message("t", b"once"), ["q"], TIMER, 1)
    (hold,) = store.held.due(TIMER, 2, 10)
    first = store.held.release([hold])
    assert store.held.due(TIMER, 2, 10) == []  # being released: not due again
    again = store.held.release([hold])
    dropped = store.held.discard([hold])
    assert len(await first) == 1 and await again == [] and await dropped == []
    assert [m.body for m in (await store.get("q", 0, 10)).messages] == [b"once"]


async def test_retention_rolls_held_messages_forward_before_deleting_their_segment(open_store):
    store = await open_store(segment_size=64 << 10, retention_hours=0, retention_bytes=128 << 10)
    held = await store.held.put(Message("t", b"far future", {"p": "v"}, key="k", tags="tg"), ["q"], TIMER, 10**12)
    for i in range(12):  # fill segments past the byte limit
        await store.put_batch([(Message("t", b"x" * 1000), ["filler"]) for _ in range(20)])
    (before,) = store.held.below(1 << 62, 10)
    assert before.target == held.position
    assert await store.apply_retention() > 0
    assert store.commitlog.min_position > held.position  # its segment is gone
    (after,) = store.held.due(TIMER, 10**12, 10)
    assert after.target > held.position and after.due_ms == 10**12 and after.tag_hash == before.tag_hash
    await store.held.release([after])
    (message,) = (await store.get("q", 0, 10)).messages
    assert (message.body, message.properties, message.key) == (b"far future", {"p": "v", "TAGS": "tg"}, "k")


async def test_counts_and_due_times_of_held_messages(open_store):
    store = await open_store()
    await store.held.put(Message("t", b"a"), ["q"], TIMER, 500)
    assert store.held.count(TIMER) == 1  # (walked once here)
    for due in (1_000, 2_500, 9_000):
        await store.held.put(Message("t", b"b"), ["q"], TIMER, due)
    await store.held.put(Message("t", b"c"), ["q"], HALF, 1)
    assert (store.held.count(TIMER), store.held.count(HALF)) == (4, 1)
    await store.held.release(store.held.due(TIMER, 600, 10))
    assert store.held.count(TIMER) == 3
    assert store.held.due_within(TIMER, 0, [1.0, 3.0, 10.0], 100) == [1, 2, 3]
    assert store.held.due_within(TIMER, 0, [1.0, 3.0, 10.0], 1) == [1, 1, 1]  # (a walk of one key)
