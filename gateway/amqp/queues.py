"""One AMQP queue at run time: competing consumers over its store queue.

The queue keeps a cursor (the next offset to hand out), the offsets handed out and not yet
settled, and messages given back (nack/reject with requeue, a channel closed with unacked
deliveries) that go out again first with ``redelivered`` set. Its committed offset -- the
oldest message nobody has settled -- is a consumer offset in the store (``amqp:{queue}``),
written through when the queue is created, so a restart redelivers exactly what was not
acknowledged (and, after a crash, what was acknowledged since the last offset checkpoint).

What was handed out before a restart comes back with ``redelivered`` set, as RabbitMQ does: the
offset below which messages may have been delivered is written ahead of the deliveries, in steps
of ``DELIVERED_STEP`` (one write per step, not per message); a graceful stop writes it exactly,
so after a crash up to a step of messages never delivered may carry the flag too (a hint
either way: "this message may have been delivered before").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from protocols.amqp.frames import shortstr
from store import StoredMessage, StoreError

from ..core import delivery_counts
from ..core.delivery_counts import DeliveryCounts
from ..core.group import ConsumerGroup
from ..interop import amqp_queue
from .messages import AMQPView
from .model import QueueDefinition

if TYPE_CHECKING:
    from .broker import AMQPBroker
    from .channel import Channel

log = logging.getLogger("tidemq.amqp")

PULL_BATCH = 64
DELIVERED_TABLE = "amqp.delivered"  # queue name -> the offset below which messages may have been handed out
DELIVERED_STEP = 256  # the mark is written this far ahead of the deliveries
FLUSH_EVERY = 16  # deliveries written to the socket together while a pump goes on


@dataclass(slots=True)
class Consumer:
    channel: Channel
    tag: str
    no_ack: bool
    exclusive: bool
    priority: int = 0  # basic.consume's x-priority: higher ones take messages first, while they can
    unacked: int = 0  # deliveries to it not yet settled (prefetch accounting)
    unacked_bytes: int = 0
    encoded_tag: bytes = field(init=False)  # the tag as basic.deliver carries it (a short string)

    def __post_init__(self) -> None:
        self.encoded_tag = shortstr(self.tag)


@dataclass(slots=True)
class Ready:
    """A message ready for delivery, with the flag saying whether it was delivered before."""

    message: StoredMessage
    redelivered: bool
    delivery_count: int = 0  # times given back (counted with x-delivery-limit only)
    view: AMQPView | None = None  # what the consumer is told of it, when looked up already


def _priority(consumer: Consumer) -> int:
    return consumer.priority


class QueueRuntime:
    def __init__(self, broker: AMQPBroker, definition: QueueDefinition, start_offset: int,
                 owner: object | None = None, *, restored: bool = False) -> None:
        self.broker = broker
        self.definition = definition
        self.name = definition.name
        self.store_queue = amqp_queue(definition.name)
        self.consumer_name = f"amqp:{definition.name}"
        # with x-delivery-limit, how often each message was given back (kept across restarts)
        counts = None if definition.delivery_limit is None else DeliveryCounts(
            broker.store.table(delivery_counts.TABLE), self.consumer_name, restored=restored, committed=start_offset)
        # the queue's consumers compete for its messages (the delivery core's consumer group)
        self.group: ConsumerGroup[Consumer] = ConsumerGroup(broker.store, self.consumer_name, self.store_queue,
                                                            start_offset, counts)
        self._ahead: deque[StoredMessage] = deque()  # read ahead from the store, from the cursor on
        # handed out before this run (redelivered), and how far handing out may go before the
        # mark is written further; an earlier queue's mark of the same name is not a new one's
        self._marks = broker.store.table(DELIVERED_TABLE)
        raw = self._marks.get(definition.name) if restored else None
        if raw is None and not restored:
            self._marks.delete(definition.name)
        self._seen_below = self._mark = int(raw) if raw else 0
        self.owner = owner  # the connection of an exclusive queue
        self.last_used = time.monotonic()
        self.deleted = False
        self._pump_scheduled = False
        self._prioritized = 0  # consumers with an x-priority other than 0
        self.places_taken = 0  # publishes accepted under x-overflow reject-publish, not stored yet

    @property
    def consumers(self) -> dict[object, Consumer]:
        return self.group.members

    # -- offsets -------------------------------------------------------------------------------
    def save(self, *, durable: bool = False) -> None:
        """Record the committed offset: with the store's offset checkpoint, or (``durable``) at
        once, for positions a crash must never lose (a new queue's start, a purge)."""
        self.group.save(durable=durable)

    def ready_count(self) -> int:
        group = self.group
        return max(0, self.broker.store.max_offset_now(self.store_queue) - group.cursor.next_offset) + len(group.redeliver)

    def touch(self) -> None:
        """Used now (declare, get, consume): restarts the x-expires clock."""
        self.last_used = time.monotonic()

    # -- consumers -----------------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers[(id(consumer.channel), consumer.tag)] = consumer
        self._prioritized += consumer.priority != 0
        self.touch()
        self.schedule_pump()

    def remove_consumer(self, consumer: Consumer) -> None:
        if self.consumers.pop((id(consumer.channel), consumer.tag), None) is not None:
            self._prioritized -= consumer.priority != 0
        self.touch()

    def schedule_pump(self) -> None:
        if not self._pump_scheduled and not self.deleted:
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self.pump)

    def pump(self) -> None:
        self._pump_scheduled = False
        if self.deleted or not self.consumers:
            return
        flush_soon = self.broker.flush_soon
        delivered = 0
        while True:
            ready = self.peek()
            if ready is None:
                break
            size = len(ready.message.body)
            lone = len(self.consumers) == 1
            consumer: Consumer | None
            if lone:  # (no turns to take)
                consumer = next(iter(self.consumers.values()))
                if not consumer.channel.can_deliver(consumer, size):
                    break
            else:
                consumer = self.group.next_member(lambda c: c.channel.can_deliver(c, size),
                                                  _priority if self._prioritized else None)
            if consumer is None:
                break
            channel = consumer.channel
            while True:
                self.hand_out(ready)
                channel.deliver(consumer, self, ready)
                delivered += 1
                if delivered % FLUSH_EVERY == 0:
                    # the client starts on (and acks) the first deliveries while the rest are made
                    channel.connection.flush()
                # a lone consumer takes what it has room for without taking turns
                if not lone:
                    break
                ready = self.peek()
                if ready is None or not channel.can_deliver(consumer, len(ready.message.body)):
                    break
            flush_soon(channel.connection)
            if ready is None:
                break
        self.save()

    # -- taking messages -----------------------------------------------------------------------
    def take(self) -> Ready | None:
        """The next message to hand out, handed out (expired ones are dead-lettered on the way)."""
        ready = self.peek()
        if ready is not None:
            self.hand_out(ready)
        return ready

    def peek(self) -> Ready | None:
        """The next message to hand out, not handed out yet (``hand_out`` does, as long as nothing
        else took or gave back a message in between); expired ones are dead-lettered on the way."""
        group = self.group
        cursor = group.cursor
        while True:
            if group.redeliver:
                message = group.redeliver[0]
                return Ready(message, True, group.counts.count(message.queue_offset) if group.counts else 0)
            ahead = self._ahead
            if not ahead or ahead[0].queue_offset != cursor.next_offset:
                ahead.clear()
                result = cursor.read(self.broker.cache, PULL_BATCH)
                if result is None:
                    return None
                ahead.extend(result.messages)
            message = ahead[0]
            view = self.broker.view(message)
            if view.expired(message, self.definition.message_ttl_ms):
                ahead.popleft()
                cursor.next_offset = message.queue_offset + 1
                self.broker.dead_letter(self, message, "expired")
                continue
            # (given back before a restart: a counted message comes from the store again)
            return Ready(message, message.queue_offset < self._seen_below,
                         group.counts.count(message.queue_offset) if group.counts else 0, view)

    def hand_out(self, ready: Ready) -> None:
        """The message ``peek`` returned goes to a consumer."""
        group = self.group
        message = ready.message
        if group.redeliver and group.redeliver[0] is message:
            group.redeliver.pop(0)
        else:
            offset = message.queue_offset
            if offset >= self._mark:  # written ahead of the delivery's bytes
                self._write_mark(offset + DELIVERED_STEP)
            self._ahead.popleft()
            group.cursor.next_offset = offset + 1
        group.handed_out(message)

    def _write_mark(self, offset: int) -> None:
        self._mark = offset
        try:
            self._marks.put_hint(self.name, str(offset).encode())  # (a hint: no fsync on the loop in sync mode)
        except StoreError:  # (a full disk, logged by the store) after a crash, "redelivered" may be missing
            pass

    def close(self) -> None:
        """The node stops: the committed offset, and the exact delivered mark (nothing handed out
        from here on)."""
        self.save()
        self._write_mark(self.group.cursor.next_offset)

    def expire_head(self) -> None:
        """Dead-letter the expired messages at the head (take() does it on its way)."""
        if not self.group.redeliver:
            self.peek()
            self.save()

    # -- settling ------------------------------------------------------------------------------
    def settle(self, offset: int) -> None:
        """An acknowledged (or dropped) delivery."""
        self.group.settled(offset)
        self._pump_if_ready()

    def settle_sent(self, offset: int) -> None:
        """A no-ack delivery, settled as it goes out: the pump that made it goes on by itself."""
        self.group.settled(offset)

    def settle_many(self, offsets: list[int]) -> None:
        """Acknowledged deliveries (a ``multiple`` ack), then the committed offset recorded."""
        settled = self.group.settled
        for offset in offsets:
            settled(offset)
        self._pump_if_ready()
        self.save()

    def _pump_if_ready(self) -> None:
        """A settle made room: pump if a message waits for it. With none ready, the commit that
        stores the next one pumps (a pump after every ack would only find the queue's end)."""
        if self.ready_count():
            self.schedule_pump()

    def requeue(self, message: StoredMessage) -> None:
        """Given back: delivered again first, with ``redelivered`` set (kept in offset order);
        given back more often than x-delivery-limit, dead-lettered (or dropped) instead."""
        if self.deleted:
            return  # (its messages went with it)
        for over in self.group.give_back([message], self.definition.delivery_limit):
            self.broker.dead_letter(self, over, "delivery_limit")
        self.schedule_pump()

    def purge(self) -> int:
        count = self.ready_count()
        self.group.cursor.next_offset = self.broker.store.max_offset_now(self.store_queue)
        self._ahead.clear()
        for message in self.group.redeliver:
            self.group.settled(message.queue_offset)  # (its delivery count goes)
        self.group.redeliver.clear()
        self.save(durable=True)
        return count

    def enforce_max_length(self) -> None:
        """x-max-length with drop-head: the oldest ready messages go (dead-lettered if set up)."""
        limit = self.definition.max_length
        if limit is None or self.definition.overflow != "drop-head":
            return
        excess = self.ready_count() - limit
        while excess > 0:
            ready = self.take()
            if ready is None:
                break
            self.group.settled(ready.message.queue_offset)
            self.broker.dead_letter(self, ready.message, "maxlen")
            excess -= 1
        self.save()

    def take_place(self) -> bool:
        """x-max-length with reject-publish: hold a place for a publish on its way to the store,
        or False when the ready messages and those on their way fill the queue already."""
        limit = self.definition.max_length
        if limit is not None and self.ready_count() + self.places_taken >= limit:
            return False
        self.places_taken += 1
        return True

    def give_place_back(self) -> None:
        """The publish is stored (then counted as ready) or failed."""
        self.places_taken -= 1


def take_places(queues: list[QueueRuntime]) -> tuple[list[QueueRuntime], list[QueueRuntime] | tuple[()]]:
    """The queues that take a message, and the places it holds in those with x-max-length and
    reject-publish (a full one refuses it; the others still take it, as RabbitMQ)."""
    for queue in queues:  # (a loop, not any(): this runs for every publish)
        d = queue.definition
        if d.max_length is not None and d.overflow == "reject-publish":
            break
    else:
        return queues, ()
    taking, places = [], []
    for queue in queues:
        d = queue.definition
        if d.max_length is None or d.overflow != "reject-publish":
            taking.append(queue)
        elif queue.take_place():
            taking.append(queue)
            places.append(queue)
    return taking, places
