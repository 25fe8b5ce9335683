"""The gateway's one timer (gateway/core/timer.py) over the store's held messages: released at
their due time, in due order, also those that came due while it was not running."""

from __future__ import annotations

import asyncio
import time

from gateway.core.timer import TimerService
from store import GetStatus, Message
from store.holds.codec import TIMER


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def wait_for_messages(store, queue: str, count: int, timeout_s: float = 5.0) -> list:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = await store.get(queue, 0, 100)
        if got.status is GetStatus.FOUND and len(got.messages) >= count:
            return got.messages
        await asyncio.sleep(0.01)
    raise AssertionError(f"{queue}: fewer than {count} messages within {timeout_s} s")


async def test_timer_messages_are_released_at_their_due_time_in_due_order(open_store):
    store = await open_store()
    timer = TimerService(store)
    timer.start()
    try:
        start = now_ms()
        for delay, body in ((600, b"third"), (200, b"first"), (400, b"second")):
            result = await store.held.put(Message("t", body), ["q"], TIMER, start + delay)
            timer.scheduled(start + delay)
            assert result.queue_offsets == {}
        assert (await store.get("q", 0, 10)).status is GetStatus.NO_SUCH_QUEUE
        messages = await wait_for_messages(store, "q", 3)
        assert [m.body for m in messages] == [b"first", b"second", b"third"]
        assert now_ms() - start >= 600
        assert timer.released == 3 and timer.pending == 0
    finally:
        await timer.stop()


async def test_what_came_due_while_stopped_is_released_at_start(open_store):
    store = await open_store()
    await store.held.put(Message("t", b"overdue"), ["q"], TIMER, now_ms() - 5_000)
    await store.held.put(Message("t", b"later"), ["q"], TIMER, now_ms() + 60_000)
    timer = TimerService(store)
    timer.start()
    try:
        (message,) = await wait_for_messages(store, "q", 1)
        assert message.body == b"overdue" and timer.pending == 1
    finally:
        await timer.stop()


async def test_a_timer_message_put_through_any_path_is_found_without_being_announced(open_store):
    store = await open_store()
    timer = TimerService(store)
    timer.start()
    try:
        await asyncio.sleep(0.1)  # the service is asleep, nothing pending
        due = now_ms() + 150
        future, refused = store.put_each_nowait([(Message("t", b"via ingest", hold_kind=TIMER, hold_due_ms=due), ["q"])])
        assert not refused and (await future)[0].queue_offsets == {}
        (message,) = await wait_for_messages(store, "q", 1)
        assert message.body == b"via ingest" and now_ms() >= due
    finally:
        await timer.stop()


async def test_a_message_due_before_the_last_released_one_is_released_too(open_store):
    """The timer looks its keys up from where it released to (not their start: the released
    ones' tombstones lie there); a message put later with an earlier due time is found anyway."""
    store = await open_store()
    timer = TimerService(store)
    timer.start()
    try:
        await store.held.put(Message("t", b"first"), ["q"], TIMER, now_ms() + 100)
        await wait_for_messages(store, "q", 1)
        await store.held.put(Message("t", b"overdue"), ["q"], TIMER, now_ms() - 60_000)  # (a slow producer's)
        messages = await wait_for_messages(store, "q", 2)
        assert [m.body for m in messages] == [b"first", b"overdue"]
    finally:
        await timer.stop()
