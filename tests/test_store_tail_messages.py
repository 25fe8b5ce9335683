"""Differential: what the store hands its tail readers (store/read/tail.py, built from what the
committer holds of each message: batching.tail_message) is what a read of the same queue and
offset returns (decoded from the commitlog record), field for field, for any message a producer
can hand in: topics and keys in any script, properties given as a dict or already encoded, tags,
flags, birth times, one or several queues, bodies given as bytes, bytearray or memoryview, and
timer messages released into their queue (read back from the held record)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import GetResult, Message, MessageStore, StoreOptions, encode_properties, receipt_messages, receipt_tails
from store.holds.codec import HOLD_TOPIC, TIMER

QUEUES = ["q1", "q2", "q3"]
text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
props = st.dictionaries(text, st.text(st.characters(blacklist_categories=("Cs",)), max_size=8), max_size=3)
bodies = st.binary(max_size=64).flatmap(lambda b: st.sampled_from([b, bytearray(b), memoryview(b)]))


class Topic(str):
    """A str subclass (an application's own string type): stored, and read back, as a str."""


@st.composite
def messages(draw: st.DrawFn) -> tuple[Message, list[str]]:
    properties = draw(st.none() | props)
    encoded = draw(st.booleans()) and properties is not None
    as_type = draw(st.sampled_from([bytes, bytearray, memoryview]))
    message = Message(
        # (not the store's reserved control topic, which a put refuses: test_store_held covers it)
        topic=draw((text.map(Topic) | text).filter(lambda t: t != HOLD_TOPIC)), body=draw(bodies),
        properties=None if encoded else properties,
        encoded_properties=as_type(encode_properties(properties)) if encoded else None,
        key=draw(st.none() | text.map(Topic) | text), tags=draw(st.none() | text),
        born_timestamp=draw(st.none() | st.integers(0, 1 << 45)), flag=draw(st.integers(0, 0xFFFF_FFFF)),
    )
    return message, draw(st.lists(st.sampled_from(QUEUES), min_size=1, max_size=3, unique=True))


class Recorder:
    """A tail reader following every queue: what each commit hands it."""

    def __init__(self) -> None:
        self.following = set(QUEUES)
        self.taken: list[tuple[str, GetResult]] = []

    def take_tail(self, queue: str, result: GetResult) -> None:
        self.taken.append((queue, result))


async def handed_and_read(batches: list[list[tuple[Message, list[str]]]], timed: bool) -> list[tuple]:
    with tempfile.TemporaryDirectory() as data_dir:
        store = await MessageStore.open(StoreOptions(data_dir=Path(data_dir)))
        try:
            recorder = Recorder()
            store.add_tail_reader(recorder)
            for batch in batches:
                await store.put_batch(batch)
            if timed:  # a timer message, released into its queues: its message is the held record
                held = Message("timed/topic", b"held body", properties={"a": "b"}, key="k", tags="t", flag=7)
                await store.held.put(held, ["q1", "q2"], TIMER, 1)
                await store.held.release(store.held.due(TIMER, 2, 10))
            pairs = []
            for queue, result in recorder.taken:
                first = result.messages[0].queue_offset
                read = store.get_now(queue, first, max_messages=len(result.messages))
                pairs.append((queue, result, read))
            return pairs
        finally:
            await store.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(st.lists(messages(), min_size=1, max_size=5), min_size=1, max_size=3), timed=st.booleans())
def test_tail_readers_get_exactly_what_a_read_returns(batches: list, timed: bool) -> None:
    pairs = asyncio.run(handed_and_read(batches, timed))
    handed = sum(len(r.messages) for _, r, _ in pairs)
    assert handed == sum(len(q) for batch in batches for _, q in batch) + (2 if timed else 0)
    for queue, result, read in pairs:
        assert result.messages == read.messages, queue  # every field (StoredMessage.__eq__), msg_id included
        assert [m.msg_id for m in result.messages] == [m.msg_id for m in read.messages]
        assert [m.properties for m in result.messages] == [m.properties for m in read.messages]
        assert result.next_offset == read.next_offset


async def test_encoded_properties_given_with_tags_are_not_changed(open_store):
    """The tags pair follows a message's encoded properties in its record; the caller's encoding
    (shared by every message of a publisher) is not extended in place, whatever its type."""
    store = await open_store()
    for kind in (bytes, bytearray, memoryview):
        shared = kind(encode_properties({"a": "1"}))
        before = bytes(shared)
        for i in range(3):
            await store.put(Message("t", f"{i}".encode(), encoded_properties=shared, tags="red"), ["q"])
        assert bytes(shared) == before, kind
    read = store.get_now("q", 0, max_messages=10)
    assert [m.properties for m in read.messages] == [{"a": "1", "TAGS": "red"}] * 9


async def receipts_and_reads(batches: list[list[tuple[Message, list[str]]]]) -> list[tuple]:
    with tempfile.TemporaryDirectory() as data_dir:
        store = await MessageStore.open(StoreOptions(data_dir=Path(data_dir)))
        try:
            out = []
            for batch in batches:
                results = await store.put_batch(batch)
                tails = receipt_tails(batch, results, {"q1", "q2"})
                for queue in ("q1", "q2"):  # (the followed queues' messages, in put order)
                    expected = []
                    for (message, queues), result in zip(batch, results):
                        if queue in queues:
                            expected += receipt_messages(message, result, [queue]) or []
                    assert tails.get(queue, []) == expected, queue
                assert tails.keys() <= {"q1", "q2"}
                for (message, queues), result in zip(batch, results):
                    reads = [store.get_now(q, result.queue_offsets[q], max_messages=1).messages[0] for q in queues]
                    out.append((message, queues, receipt_messages(message, result, queues), reads))
            return out
        finally:
            await store.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(st.lists(messages(), min_size=1, max_size=5), min_size=1, max_size=3))
def test_a_put_receipt_builds_exactly_what_a_read_returns(batches: list) -> None:
    """A gateway node hands its queue cache its own publishes from their receipts (store.receipt_messages):
    what it builds is what reads return, every field, or nothing when it cannot know (born time
    left to the store, a string subclass or a body not given as bytes)."""
    for message, queues, built, reads in asyncio.run(receipts_and_reads(batches)):
        plain = (type(message.topic) is str and type(message.key or "") is str and type(message.body) is bytes)
        if message.born_timestamp is None or not plain:
            assert built is None
            continue
        assert built == reads, queues
        assert [m.msg_id for m in built] == [m.msg_id for m in reads]
        assert [m.queues for m in built] == [m.queues for m in reads]


async def test_a_receipt_of_a_queue_named_twice_builds_nothing(open_store):
    """A message whose queue list names a queue twice has two slots in its record and one offset
    in its receipt: it cannot be built from the receipt, so nothing is."""
    store = await open_store()
    message = Message("t", b"x", born_timestamp=1)
    (result,) = await store.put_batch([(message, ["q", "q"])])
    assert receipt_messages(message, result, ["q"]) is None
    assert store.get_now("q", 0, max_messages=5).messages  # (the store did take it)
