"""Where an AMQP publish goes: the checks of its exchange and expiration, direct reply-to, its
routing to queues, the reject-publish overflow, the MQTT bridge of amq.topic, and the mandatory
flag's return; what is left to store, as one store message with its target queues."""

from __future__ import annotations

import time
from collections.abc import Sequence

from protocols.amqp.frames import (
    ACCESS_REFUSED,
    NO_ROUTE,
    NOT_FOUND,
    PRECONDITION_FAILED,
    ContentReceived,
    channel_error,
)
from store import Message
from store.holds import TIMER

from .broker import AMQPBroker
from .channel import Channel
from .direct_reply import REPLY_PREFIX
from .messages import expiration_problem, to_store_message


def route_publish(broker: AMQPBroker, channel: Channel, event: ContentReceived
                  ) -> tuple[Message, Sequence[str]] | None:
    """The message to store and its queues; None when nothing is to be stored (a publish
    returned or refused by an overflowing queue, confirmed or nacked here). AMQPError: the
    channel fails (no such exchange, an internal one). Under confirms, the publish's sequence
    number is taken here only when nothing is stored; the caller takes it otherwise."""
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
    queues = broker.route(m.exchange, m.routing_key, event.headers)
    for queue in queues:  # (a loop, not any(): this runs for every publish)
        d = queue.definition
        if d.max_length is not None and d.overflow == "reject-publish" and queue.ready_count() >= d.max_length:
            if channel.confirming:
                channel.confirm([channel.next_publish_seq()], ok=False)
            return None
    targets = [q.store_queue for q in queues]
    topic, taken = None, bool(queues)
    if m.exchange == "amq.topic":  # the MQTT bridge (its list also names the amq.topic queues)
        topic, mqtt_targets, read = broker.mqtt_route(m.routing_key)
        targets = list(dict.fromkeys(targets + mqtt_targets))
        taken = taken or read
    if not taken and m.mandatory:  # unroutable: returned, then confirmed (as RabbitMQ)
        channel.send_return(NO_ROUTE, "NO_ROUTE", m.exchange, m.routing_key, event.raw_properties, event.body)
        targets = []
    if not targets:
        if channel.confirming:
            channel.confirm([channel.next_publish_seq()], ok=True)
        return None
    message = to_store_message(m.exchange, m.routing_key, event.raw_properties, event.body, topic,
                               delivery_mode=event.delivery_mode, message_id=event.message_id)
    delay = exchange.delay_ms(event.headers) if exchange is not None else 0
    if delay:  # an x-delayed-message exchange's: stored now, in its queues at its time (core/timer.py)
        message.hold_kind, message.hold_due_ms = TIMER, time.time_ns() // 1_000_000 + delay
    return message, targets
