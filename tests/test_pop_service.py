"""The protocol-neutral pop service (gateway/core/pop.py) over a real store: state that survives
closing the store, revive order, and a dead letter on its way that an ack or a change of
invisible time cannot end or move."""

from __future__ import annotations

import asyncio

from gateway.core.pop import PopService
from store import Message
from store.meta.popstate import CheckPoint

QUEUE = "r:Jobs:0"


def reader(store):
    return lambda queue, offset, n: store.get_now(queue, offset, n)


async def test_pop_state_survives_reopening_the_store(open_store) -> None:
    store = await open_store()
    for body in (b"a", b"b", b"c"):
        await store.put(Message("Jobs", body), [QUEUE])
    service = PopService(store, dead_letter=None, max_attempts=lambda group: 16)  # type: ignore[arg-type]
    first = service.pop("g", QUEUE, 2, 60_000, reader(store))
    assert [m.body for m in first.messages] == [b"a", b"b"] and first.next_offset == 2
    assert service.ack("g", QUEUE, 0, first.due_ms) and not service.ack("g", QUEUE, 0, first.due_ms)
    await store.close()
    store = await open_store()
    service = PopService(store, dead_letter=None, max_attempts=lambda group: 16)  # type: ignore[arg-type]
    assert [(cp.offset, cp.due_ms) for cp in service.outstanding()] == [(1, first.due_ms)]
    again = service.pop("g", QUEUE, 32, 60_000, reader(store))
    assert [m.body for m in again.messages] == [b"c"]  # the pop offset was kept
    assert service.pop("other", QUEUE, 32, 0, reader(store)).next_offset == 3  # groups are independent


async def test_revived_messages_come_first_with_one_attempt_more(open_store) -> None:
    store = await open_store()
    for body in (b"a", b"b"):
        await store.put(Message("Jobs", body), [QUEUE])
    service = PopService(store, dead_letter=None, max_attempts=lambda group: 16)  # type: ignore[arg-type]
    service.pop("g", QUEUE, 1, 0, reader(store))  # "a", visible again at once
    assert await service.revive_due() == 1
    popped = service.pop("g", QUEUE, 32, 60_000, reader(store))
    assert [(m.body, cp.attempts) for m, cp in zip(popped.messages, popped.points)] == [(b"a", 1), (b"b", 0)]
    assert [m.queue_offset for m in popped.messages] == [0, 1]


async def test_a_dead_letter_on_its_way_is_not_acked_or_moved(open_store) -> None:
    store = await open_store()
    await store.put(Message("Jobs", b"poison"), [QUEUE])
    letters: list[tuple[CheckPoint, bytes, int]] = []
    let_go = asyncio.Event()

    async def dead_letter(cp: CheckPoint, message, attempts: int) -> None:
        await let_go.wait()
        letters.append((cp, message.body, attempts))

    service = PopService(store, dead_letter, max_attempts=lambda group: 0)
    popped = service.pop("g", QUEUE, 1, 0, reader(store))
    reviving = asyncio.create_task(service.revive_due())
    await asyncio.sleep(0.05)
    assert not reviving.done()
    assert not service.ack("g", QUEUE, 0, popped.due_ms)
    assert service.change("g", QUEUE, 0, popped.due_ms, 60_000) is None
    assert service.ack_many("g", QUEUE, [0], popped.due_ms) == []
    let_go.set()
    assert await reviving == 1
    assert [(body, attempts) for _, body, attempts in letters] == [(b"poison", 1)]
    assert service.outstanding() == [] and service.dead_lettered == 1
