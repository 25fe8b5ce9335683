"""Where an AMQP publish goes: the checks of its exchange and expiration, direct reply-to, its
routing to queues, the reject-publish overflow, the MQTT bridge of amq.topic, and the mandatory
flag's return; what is left to store, as one store message with its target queues."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from protocols.amqp.frames import (
    ACCESS_REFUSED,
    NO_ROUTE,
    NOT_FOUND,
    PRECONDITION_FAILED,
    ContentReceived,
    channel_error,
)
from store import Message
from store import TIMER

from .broker import AMQPBroker
from .channel import Channel
from .direct_reply import REPLY_PREFIX
from .messages import expiration_problem, to_store_message
from .queues import QueueRuntime, take_places


@dataclass(slots=True)
class Routed:
    """A publish to store: the message, its store queues, the places it holds in reject-publish
    queues until the put is done (``give_places_back``), and whether a full queue refused it
    (then nacked under confirms once stored in the others, as RabbitMQ)."""

    message: Message
    targets: Sequence[str]
    places: Sequence[QueueRuntime] = ()
    refused_by_some: bool = False

    def give_places_back(self) -> None:
        for queue in self.places:
            queue.give_place_back()


def route_publish(broker: AMQPBroker, channel: Channel, event: ContentReceived) -> Routed | None:
    """What to store; None when nothing is to be stored (a publish returned or refused by every
    queue it reaches, confirmed or nacked here). AMQPError: the channel fails (no such
    exchange, an internal one). Under confirms, the publish's sequence number is taken here only
    when nothing is stored; the caller takes it otherwise."""
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
            channel.send_return(NO_ROUTE, "NO_ROUTE", m.exchange, m.routing_key, event.raw_properties, event.body)
        if channel.confirming:
            channel.confirm([channel.next_publish_seq()], ok=True)
        return None
    routed = broker.route(m.exchange, m.routing_key, event.headers)
    queues, places = take_places(routed)
    targets = [q.store_queue for q in queues]
    topic, taken = None, bool(routed)  # (a queue that refused it was routed to: no return)
    if m.exchange == "amq.topic":  # the MQTT bridge (its list also names the amq.topic queues)
        topic, mqtt_targets, read = broker.mqtt_route(m.routing_key)
        targets = list(dict.fromkeys(targets + mqtt_targets))
        taken = taken or read
    if not taken and m.mandatory:  # unroutable: returned, then confirmed (as RabbitMQ)
        channel.send_return(NO_ROUTE, "NO_ROUTE", m.exchange, m.routing_key, event.raw_properties, event.body)
        targets = []
    refused_by_some = len(queues) != len(routed)
    if not targets:
        if channel.confirming:
            channel.confirm([channel.next_publish_seq()], ok=not refused_by_some)
        return None
    message = to_store_message(m.exchange, m.routing_key, event.raw_properties, event.body, topic,
                               delivery_mode=event.delivery_mode, message_id=event.message_id)
    delay = exchange.delay_ms(event.headers) if exchange is not None else 0
    if delay:  # an x-delayed-message exchange's: stored now, in its queues at its time (core/timer.py)
        message.hold_kind, message.hold_due_ms = TIMER, time.time_ns() // 1_000_000 + delay
    return Routed(message, targets, places, refused_by_some)

