"""One AMQP queue at run time: competing consumers over its store queue.

The queue keeps a cursor (the next offset to hand out), the offsets handed out and not yet
settled, and messages given back (nack/reject with requeue, a channel closed with unacked
deliveries) that go out again first with ``redelivered`` set. Its committed offset -- the
oldest message nobody has settled -- is a consumer offset in the store (``amqp:{queue}``),
written through when the queue is created, so a restart redelivers exactly what was not
acknowledged (and, after a crash, what was acknowledged since the last offset checkpoint).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from store import GetStatus, StoredMessage

from ..interop import amqp_queue
from .model import QueueDefinition

if TYPE_CHECKING:
    from .broker import AMQPBroker
    from .channel import Channel

log = logging.getLogger("tidemq.amqp")

PULL_BATCH = 64
FLUSH_EVERY = 16  # deliveries written to the socket together while a pump goes on


@dataclass(slots=True)
class Consumer:
    channel: Channel
    tag: str
    no_ack: bool
    exclusive: bool
    unacked: int = 0  # deliveries to it not yet settled (prefetch accounting)
    unacked_bytes: int = 0


@dataclass(slots=True)
class Ready:
    """A message ready for delivery, with the flag saying whether it was delivered before."""

    message: StoredMessage
    redelivered: bool


class QueueRuntime:
    def __init__(self, broker: AMQPBroker, definition: QueueDefinition, start_offset: int,
                 owner: object | None = None) -> None:
        self.broker = broker
        self.definition = definition
        self.name = definition.name
        self.store_queue = amqp_queue(definition.name)
        self.consumer_name = f"amqp:{definition.name}"
        self.next_offset = start_offset
        self.unacked: dict[int, None] = {}
        self.redeliver: deque[StoredMessage] = deque()
        self._ahead: deque[StoredMessage] = deque()  # read ahead from the store, from next_offset on
        self.consumers: OrderedDict[tuple[int, str], Consumer] = OrderedDict()
        self.owner = owner  # the connection of an exclusive queue
        self.last_used = time.monotonic()
        self.deleted = False
        self._rotation = 0
        self._pump_scheduled = False
        self._committed = -1

    # -- offsets -------------------------------------------------------------------------------
    @property
    def committed(self) -> int:
        low = self.next_offset
        for offset in self.unacked:
            low = min(low, offset)
        for message in self.redeliver:
            low = min(low, message.queue_offset)
        return low

    def save(self, *, durable: bool = False) -> None:
        """Record the committed offset: with the store's offset checkpoint, or (``durable``) at
        once, for positions a crash must never lose (a new queue's start, a purge)."""
        committed = self.committed
        if durable:
            self._committed = committed
            self.broker.store.save_offset_now(self.consumer_name, self.store_queue, committed)
        elif committed != self._committed:
            self._committed = committed
            self.broker.store.commit_offset_now(self.consumer_name, self.store_queue, committed)

    def ready_count(self) -> int:
        return max(0, self.broker.store.max_offset_now(self.store_queue) - self.next_offset) + len(self.redeliver)

    def touch(self) -> None:
        """Used now (declare, get, consume): restarts the x-expires clock."""
        self.last_used = time.monotonic()

    # -- consumers -----------------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers[(id(consumer.channel), consumer.tag)] = consumer
        self.touch()
        self.schedule_pump()

    def remove_consumer(self, consumer: Consumer) -> None:
        self.consumers.pop((id(consumer.channel), consumer.tag), None)
        self.touch()

    def schedule_pump(self) -> None:
        if not self._pump_scheduled and not self.deleted:
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self.pump)

    def _next_consumer(self, message: StoredMessage) -> Consumer | None:
        consumers = list(self.consumers.values())
        for i in range(len(consumers)):
            consumer = consumers[(self._rotation + i) % len(consumers)]
            if consumer.channel.can_deliver(consumer, len(message.body)):
                self._rotation = (self._rotation + i + 1) % len(consumers)
                return consumer
        return None

    def pump(self) -> None:
        self._pump_scheduled = False
        if self.deleted or not self.consumers:
            return
        touched: set[Channel] = set()
        delivered = 0
        while True:
            ready = self.take(peek_only=True)
            if ready is None:
                break
            consumer = self._next_consumer(ready.message)
            if consumer is None:
                break
            self.take()  # commit the peeked message to this delivery
            consumer.channel.deliver(consumer, self, ready)
            touched.add(consumer.channel)
            delivered += 1
            if delivered % FLUSH_EVERY == 0:
                # the client starts on (and acks) the first deliveries while the rest are made
                for channel in touched:
                    channel.connection.flush()
        for channel in touched:
            channel.connection.flush()
        self.save()

    # -- taking messages -----------------------------------------------------------------------
    def take(self, *, peek_only: bool = False) -> Ready | None:
        """The next message to hand out (expired ones are dead-lettered on the way)."""
        while True:
            if self.redeliver:
                message = self.redeliver[0]
                if peek_only:
                    return Ready(message, True)
                self.redeliver.popleft()
                self.unacked[message.queue_offset] = None
                return Ready(message, True)
            ahead = self._ahead
            if not ahead or ahead[0].queue_offset != self.next_offset:
                ahead.clear()
                result = self.broker.cache.read(self.store_queue, self.next_offset, PULL_BATCH)
                if result.status != GetStatus.FOUND:
                    if result.status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW):
                        self.next_offset = result.next_offset
                        continue
                    return None
                ahead.extend(result.messages)
            message = ahead[0]
            view = self.broker.view(message)
            if view.expired(message, self.definition.message_ttl_ms):
                ahead.popleft()
                self.next_offset = message.queue_offset + 1
                self.broker.dead_letter(self, message, "expired")
                continue
            if peek_only:
                return Ready(message, False)
            ahead.popleft()
            self.next_offset = message.queue_offset + 1
            self.unacked[message.queue_offset] = None
            return Ready(message, False)

    def expire_head(self) -> None:
        """Dead-letter the expired messages at the head (take() does it on its way)."""
        if not self.redeliver:
            self.take(peek_only=True)
            self.save()

    # -- settling ------------------------------------------------------------------------------
    def settle(self, offset: int) -> None:
        """An acknowledged (or dropped) delivery."""
        self.unacked.pop(offset, None)
        self.schedule_pump()

    def requeue(self, message: StoredMessage) -> None:
        """Given back: delivered again first, with ``redelivered`` set (kept in offset order)."""
        self.unacked.pop(message.queue_offset, None)
        items = sorted([*self.redeliver, message], key=lambda m: m.queue_offset)
        self.redeliver = deque(items)
        self.schedule_pump()

    def purge(self) -> int:
        count = self.ready_count()
        self.next_offset = self.broker.store.max_offset_now(self.store_queue)
        self._ahead.clear()
        self.redeliver.clear()
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
            self.unacked.pop(ready.message.queue_offset, None)
            self.broker.dead_letter(self, ready.message, "maxlen")
            excess -= 1
        self.save()
