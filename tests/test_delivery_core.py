"""The delivery core against a real store: a cursor reads on over offsets retention removed and
reports the move; a consumer group's committed offset waits for its oldest unsettled message,
given-back messages go out again in offset order, and a group's start is on disk at once."""

from __future__ import annotations

from cache import QueueCache
from gateway.core.cursor import Cursor
from gateway.core.group import ConsumerGroup, group_start
from store import Message


async def fill(store, count: int, queue: str = "q", size: int = 700):
    return await store.put_batch([(Message("t", b"%06d" % i + b"x" * size), [queue]) for i in range(count)])


async def test_a_cursor_reads_on_past_what_retention_removed(open_store) -> None:
    store = await open_store(segment_size=8192, retention_bytes=20_000, retention_hours=0)
    await fill(store, 60)
    assert await store.apply_retention() > 0
    low = store.min_offset_now("q")
    assert low > 0
    cursor = Cursor("q", 0)
    moves: list[tuple[int, int]] = []
    result = cursor.read(QueueCache(store), 10, lambda c, start, to: moves.append((start, to)))
    assert moves == [(0, low)] and cursor.next_offset == low
    assert result is not None and result.messages[0].queue_offset == low
    cursor.next_offset = store.max_offset_now("q")
    assert cursor.read(QueueCache(store), 10) is None  # nothing new: no move, no messages
    assert cursor.next_offset == 60


async def test_a_group_commits_its_oldest_unsettled_message_and_redelivers_in_order(open_store) -> None:
    store = await open_store()
    await fill(store, 10)
    group: ConsumerGroup[str] = ConsumerGroup(store, "g", "q", group_start(store, "g", "q", resume=True))
    assert group.cursor.next_offset == 10  # a new group starts at the end...
    assert store.meta.load_offset("g", "q") == 10  # ...written through, not left to the checkpoint
    await fill(store, 5)
    result = group.cursor.read(QueueCache(store), 32)
    assert result is not None
    for message in result.messages:
        group.handed_out(message, "member")
        group.cursor.next_offset = message.queue_offset + 1
    group.settled(10)
    group.settled(12)
    assert group.committed == 11
    group.give_back([m for m in reversed(result.messages) if m.queue_offset in (11, 13)])
    assert [m.queue_offset for m in group.redeliver] == [11, 13] and group.committed == 11
    group.save()
    assert store.get_offset_now("g", "q") == 11


async def test_the_committed_offset_is_the_oldest_unsettled_even_when_taken_again_out_of_order(open_store) -> None:
    store = await open_store()
    group: ConsumerGroup[str] = ConsumerGroup(store, "g", "q", group_start(store, "g", "q", resume=True))
    await fill(store, 6)
    result = group.cursor.read(QueueCache(store), 32)
    assert result is not None
    first, second, *rest = result.messages
    for message in (first, second):
        group.handed_out(message, "a")
    group.cursor.next_offset = 2
    group.give_back([first])  # first given back, second still out
    for message in rest:  # later ones handed out meanwhile
        group.handed_out(message, "a")
    group.cursor.next_offset = 6
    group.redeliver.pop(0)
    group.handed_out(first, "b")  # taken again: held after offsets above it
    assert group.committed == 0
    group.settled(1)
    group.settled(2)
    assert group.committed == 0
    group.settled(0)
    assert group.committed == 3
    for offset in (3, 4, 5):
        group.settled(offset)
    assert group.committed == 6
    group.hold(6, "a")
    group.hold(7, "a")
    group.cursor.next_offset = 8
    group.settled(6)
    assert group.committed == 7


async def test_a_new_group_ignores_what_a_group_of_the_same_name_left(open_store) -> None:
    store = await open_store()
    await fill(store, 3)
    store.save_offset_now("g", "q", 1)
    assert group_start(store, "g", "q", resume=True) == 1
    assert group_start(store, "g", "q", resume=False) == 3
    assert store.meta.load_offset("g", "q") == 3
    assert group_start(store, "unsaved", "q", resume=True, unsaved_at_oldest=True) == 0
