"""Competing consumers of one queue (MQTT shared subscriptions, AMQP queue consumers): one
cursor for the whole group; each message goes to one member, round robin among those that can
take it; messages a member gives back (it left, or asked) go out again first, in offset order.

The group's committed offset -- the oldest message no member has settled -- is a consumer offset
in the store. A new group's start is written through before anyone is told the group exists: a
message acknowledged to its publisher a moment later is delivered after any crash; later
progress is saved with the store's offset checkpoint (after a crash, what was settled since is
delivered again).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from typing import Generic, Protocol, TypeVar

from store import StoredMessage

from .cursor import Cursor
from .delivery_counts import DeliveryCounts

Member = TypeVar("Member")


class OffsetStore(Protocol):
    """The store's consumer offsets (``store.MessageStore`` is one)."""

    def get_offset_now(self, consumer: str, queue: str) -> int | None: ...

    def commit_offset_now(self, consumer: str, queue: str, offset: int) -> None: ...

    def save_offset_now(self, consumer: str, queue: str, offset: int) -> None: ...

    def max_offset_now(self, queue: str) -> int: ...

    def min_offset_now(self, queue: str) -> int: ...


def group_start(store: OffsetStore, consumer: str, queue: str, *, resume: bool, unsaved_at_oldest: bool = False
                ) -> int:
    """Where a group's cursor starts, written through when it is not the saved offset. ``resume``:
    at the group's saved offset, if it has one; otherwise (or without ``resume``: a new group,
    for which what an earlier group of the same name left is not its own) at the queue's end,
    or with ``unsaved_at_oldest`` at its oldest message (a group known to exist whose start an
    earlier version kept only in memory: delivered again rather than lost)."""
    saved = store.get_offset_now(consumer, queue) if resume else None
    if saved is not None:
        return saved
    start = store.min_offset_now(queue) if resume and unsaved_at_oldest else store.max_offset_now(queue)
    store.save_offset_now(consumer, queue, start)
    return start


class ConsumerGroup(Generic[Member]):
    def __init__(self, store: OffsetStore, consumer: str, queue: str, start_offset: int,
                 counts: DeliveryCounts | None = None) -> None:
        self.store = store
        self.counts = counts  # how often messages were given back (a delivery limit), if counted
        self.consumer = consumer  # the name of its offset in the store
        self.cursor = Cursor(queue, start_offset)
        self.redeliver: list[StoredMessage] = []  # given back, in offset order
        self.members: dict[object, Member] = {}
        self._rotation = 0
        self._saved = start_offset
        self._written: int | None = None  # the committed offset last written through (save durable)
        # an offset was held below one still unsettled (given back and taken again): the oldest
        # unsettled one is no longer the first in ``cursor.unacked``
        self._out_of_order = False

    @property
    def queue(self) -> str:
        return self.cursor.queue

    @property
    def committed(self) -> int:
        low = self.cursor.next_offset
        unacked = self.cursor.unacked
        if unacked:
            low = min(low, min(unacked) if self._out_of_order else next(iter(unacked)))
        if self.redeliver:
            low = min(low, self.redeliver[0].queue_offset)
        return low

    @property
    def idle(self) -> bool:
        """No member, nothing handed out or given back: the committed offset is all its state,
        so the group can be dropped and made again from the store when a member comes."""
        return not self.members and not self.cursor.unacked and not self.redeliver

    def save(self, *, durable: bool = False) -> None:
        """Record the committed offset: with the store's checkpoint, or (``durable``) at once."""
        committed = self.committed
        if durable:
            self._saved = committed
            if committed != self._written:  # (the committed offset never goes back: written already)
                self._written = committed
                self.store.save_offset_now(self.consumer, self.queue, committed)
        elif committed != self._saved:
            self._saved = committed
            self.store.commit_offset_now(self.consumer, self.queue, committed)

    # -- members ---------------------------------------------------------------------------------
    def next_member(self, can_take: Callable[[Member], bool],
                    priority: Callable[[Member], int] | None = None) -> Member | None:
        """The next member in turn that can take a message now, or None; with ``priority``,
        one of the highest priority that can (in turn among equals)."""
        members = list(self.members.values())
        count = len(members)
        if priority is not None:
            ranked = sorted(((members[(self._rotation + i) % count], (self._rotation + i) % count)
                             for i in range(count)), key=lambda pair: priority(pair[0]), reverse=True)
            for member, index in ranked:
                if can_take(member):
                    self._rotation = (index + 1) % count
                    return member
            return None
        for i in range(count):
            member = members[(self._rotation + i) % count]
            if can_take(member):
                self._rotation = (self._rotation + i + 1) % count
                return member
        return None

    # -- handing out and settling ----------------------------------------------------------------
    def handed_out(self, message: StoredMessage, holder: object = None) -> None:
        """``message`` went to a member and waits to be settled."""
        self.hold(message.queue_offset, holder)

    def hold(self, offset: int, holder: object = None) -> None:
        """``offset`` waits to be settled by ``holder``."""
        unacked = self.cursor.unacked
        if unacked and offset < next(reversed(unacked)):
            self._out_of_order = True
        unacked[offset] = holder

    def settled(self, offset: int) -> None:
        unacked = self.cursor.unacked
        unacked.pop(offset, None)
        if not unacked:
            self._out_of_order = False
        if self.counts:
            self.counts.forget(offset)

    def give_back(self, messages: Iterable[StoredMessage], limit: int | None = None) -> list[StoredMessage]:
        """Messages a member did not settle go out again first, in offset order; with a
        delivery ``limit`` (and counts), those given back more often than that are settled
        instead and returned (the caller dead-letters or drops them)."""
        over = []
        for message in messages:
            offset = message.queue_offset
            # (counted while still handed out: were the count to raise, the message is not lost)
            counted = limit is not None and self.counts is not None and self.counts.given_back(offset) > limit
            self.cursor.unacked.pop(offset, None)  # (order: a later hold says; an emptied dict is in order)
            if counted:
                over.append(message)
                self.settled(offset)
                continue
            bisect.insort(self.redeliver, message, key=_offset)
        return over


def _offset(message: StoredMessage) -> int:
    return message.queue_offset
