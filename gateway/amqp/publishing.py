"""Where an AMQP publish goes: the checks of its exchange and expiration, direct reply-to, its
routing to queues, the reject-publish overflow, the MQTT bridge of amq.topic, and the mandatory
flag's return; what is left to store, as one store message with its target queues. The
inbound side (inbound.py) acts on the answer: it stores, returns and confirms."""

from __future__ import annotations

from typing import TYPE_CHECKING

import time
from collections.abc import Sequence
from dataclasses import dataclass

from protocols.amqp.frames import (
    ACCESS_REFUSED,
    NOT_FOUND,
    PRECONDITION_FAILED,
    ContentReceived,
    channel_error,
)
from store import Message
from store import TIMER

from .broker import AMQPBroker
from .direct_reply import REPLY_PREFIX
from .messages import expiration_problem, to_store_message
from .queues import QueueRuntime, take_places

if TYPE_CHECKING:
    from .channel import Channel


@dataclass(slots=True)
class Routed:
    """Where a publish goes: the message to store and its store queues (none: nothing to store),
    the places it holds in reject-publish queues until the put is done (``give_places_back``),
    whether a full queue refused it (then nacked under confirms, once stored in the others, as
    RabbitMQ), and whether it is returned to its publisher (mandatory, and no one took it)."""

    message: Message | None
    targets: Sequence[str]
    places: Sequence[QueueRuntime] = ()
    refused_by_some: bool = False
    returned: bool = False

    def give_places_back(self) -> None:
        for queue in self.places:
            queue.give_place_back()


NOWHERE = Routed(None, ())  # a direct reply delivered: nothing to store, nothing to return


def route_publish(broker: AMQPBroker, channel: Channel, event: ContentReceived) -> Routed:
    """Where a publish goes (``Routed``): a direct reply is delivered to its consumer here, never
    stored. AMQPError: the channel fails (no such exchange, an internal one, a bad expiration)."""
    m = event.method
    exchange = broker.exchanges.get(m.exchange)
    if exchange is None and m.exchange != "":
        raise channel_error(NOT_FOUND, f"no exchange '{m.exchange}'", event.channel, m)
    if exchange is not None and exchange.internal:
        raise channel_error(ACCESS_REFUSED, f"cannot publish to internal exchange '{m.exchange}'", event.channel, m)
    expiration = event.expiration
    if expiration is not None:
        problem = expiration_problem(expiration)
        if problem:
            raise channel_error(PRECONDITION_FAILED, problem, event.channel, m)
    broker.direct_replies.name_reply_to(channel, event)
    if m.exchange == "" and m.routing_key.startswith(REPLY_PREFIX):  # a reply: to its consumer, not stored
        if not broker.direct_replies.deliver(m.routing_key, event) and m.mandatory:
            return Routed(None, (), returned=True)
        return NOWHERE
    routed = broker.route(m.exchange, m.routing_key, event.headers)
    queues, places = take_places(routed)
    targets = [q.store_queue for q in queues]
    topic, taken = None, bool(routed)  # (a queue that refused it was routed to: no return)
    if m.exchange == "amq.topic":  # the MQTT bridge (its list also names the amq.topic queues)
        topic, mqtt_targets, read = broker.mqtt_route(m.routing_key)
        targets = list(dict.fromkeys(targets + mqtt_targets))
        taken = taken or read
    refused_by_some = len(queues) != len(routed)
    if not taken and m.mandatory:  # unroutable: returned, then confirmed (as RabbitMQ)
        return Routed(None, (), refused_by_some=refused_by_some, returned=True)
    if not targets:
        return Routed(None, (), refused_by_some=refused_by_some)  # (every queue refused it: no places held)
    message = to_store_message(m.exchange, m.routing_key, event.raw_properties, event.body, topic,
                               delivery_mode=event.delivery_mode, message_id=event.message_id)
    delay = exchange.delay_ms(event.headers) if exchange is not None else 0
    if delay:  # an x-delayed-message exchange's: stored now, in its queues at its time (core/timer.py)
        message.hold_kind, message.hold_due_ms = TIMER, time.time_ns() // 1_000_000 + delay
    return Routed(message, targets, places, refused_by_some)
