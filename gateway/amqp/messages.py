"""AMQP message <-> store message. A message published over AMQP carries the store flag
``AMQP_FLAG`` (0x200, plus 0x01 when persistent) and the store properties ``amqp.x`` (exchange),
``amqp.rk`` (routing key) and ``amqp.p`` (its content header, base64: the properties as the
publisher encoded them, after 12 bytes of class id, weight and a zero body size).
Messages from MQTT are given exchange ``amq.topic`` and routing key = topic with '/' -> '.'."""

from __future__ import annotations

import base64
import re
import struct
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from pamqp import commands

from protocols.amqp.frames import EXPIRATION_FLAG, copy_properties, decode_properties, encode_properties, shortstr
from store import Message, StoredMessage

from ..interop import AMQP_FLAG, MQTT_FLAG, PERSISTENT_FLAG, mqtt_topic_to_routing_key
from .arguments import MAX_EXPIRY_MS

EXCHANGE = "amqp.x"
ROUTING_KEY = "amqp.rk"
HEADER = "amqp.p"
DEATHS = "amqp.deaths"
KNOWN_VIEWS = 4096  # views shared between messages alike, at most (AMQPView.of's ``known``)
CONTENT_HEADER_FIXED = 12  # class id, weight, body size: what precedes the properties
CONTENT_HEADER_PREFIX = struct.pack(">HHQ", 60, 0, 0)  # class basic, weight 0, body size 0 (not kept)
EMPTY_PROPERTIES = encode_properties(commands.Basic.Properties())
PERSISTENT_PROPERTIES = encode_properties(commands.Basic.Properties(delivery_mode=2))
TRANSIENT_PROPERTIES = encode_properties(commands.Basic.Properties(delivery_mode=1))


def record_death(headers: dict[str, Any], queue: str, reason: str, exchange: str, routing_key: str
                 ) -> dict[str, Any]:
    """Headers of a message dead-lettered from ``queue`` for ``reason``, as RabbitMQ writes them:
    ``x-death`` holds one entry per (queue, reason), most recent first, whose ``count`` says how
    often it happened (so "retry until x-death count reaches N" ends) and whose ``time``,
    ``exchange`` and ``routing-keys`` are those of the first time; ``x-first-death-*`` name the
    first dead-lettering, ``x-last-death-*`` the latest."""
    deaths = [d for d in headers.get("x-death") or [] if isinstance(d, dict)]
    found = next((d for d in deaths if d.get("queue") == queue and d.get("reason") == reason), None)
    if found is None:
        entry = {"count": 1, "reason": reason, "queue": queue, "exchange": exchange,
                 "routing-keys": [routing_key], "time": datetime.now(timezone.utc).replace(microsecond=0)}
    else:
        deaths.remove(found)
        entry = {**found, "count": int(found.get("count") or 0) + 1}
    headers["x-death"] = [entry, *deaths]
    for key, value in (("reason", reason), ("queue", queue), ("exchange", exchange)):
        headers.setdefault(f"x-first-death-{key}", value)
        headers[f"x-last-death-{key}"] = value
    return headers


def expiration_problem(expiration: str) -> str | None:
    """Why a publish's expiration property is refused (406 PRECONDITION_FAILED, RabbitMQ's
    text), or None: it must be a whole number of milliseconds, 0 to ``MAX_EXPIRY_MS``."""
    match = _INTEGER_PREFIX.match(expiration)
    if match is None:
        error = "no_integer"
    elif match.end() < len(expiration):
        error = f'{{leftover_string,"{expiration[match.end():]}"}}'
    else:
        value = int(match.group())
        if value < 0:
            error = f"{{value_negative,{value}}}"
        elif value > MAX_EXPIRY_MS:
            error = f"{{value_too_large,{value}}}"
        else:
            return None
    return f"invalid expiration '{expiration}': {error}"


_INTEGER_PREFIX = re.compile(r"[+-]?[0-9]+")


def to_store_message(exchange: str, routing_key: str, raw_properties: bytes, body: bytes, topic: str | None = None,
                     *, delivery_mode: int | None, message_id: str | None) -> Message:
    """The store message of a publish whose properties are ``raw_properties`` (encoded as a
    content header carries them: kept as the client sent them, never decoded here);
    ``delivery_mode`` and ``message_id`` are two of them, read by the caller."""
    header = base64.b64encode(CONTENT_HEADER_PREFIX + raw_properties).decode()
    flag = AMQP_FLAG | (PERSISTENT_FLAG if delivery_mode == 2 else 0)
    props = {EXCHANGE: exchange, ROUTING_KEY: routing_key, HEADER: header}
    # message_id is the message's key (tidemq ctl query --key)
    return Message(topic if topic is not None else routing_key, body, props, key=message_id or None, flag=flag)


def decoded_to_store_message(exchange: str, routing_key: str, properties: commands.Basic.Properties,
                             body: bytes) -> Message:
    """``to_store_message`` for properties held decoded (a dead letter's, rewritten)."""
    return to_store_message(exchange, routing_key, encode_properties(properties), body,
                            delivery_mode=properties.delivery_mode, message_id=properties.message_id)


@dataclass(slots=True)
class AMQPView:
    """What an AMQP consumer is told about a stored message. The properties stay encoded (as
    a content header carries them) until something needs them decoded: a delivery copies the
    bytes, only dead-lettering and per-message expiry look inside."""

    exchange: str
    routing_key: str
    raw_properties: bytes
    _properties: commands.Basic.Properties | None = None
    _route: bytes | None = None

    @property
    def route(self) -> bytes:
        """The exchange and routing key as basic.deliver carries them (two short strings)."""
        if self._route is None:
            self._route = shortstr(self.exchange) + shortstr(self.routing_key)
        return self._route

    @classmethod
    def of(cls, message: StoredMessage, known: dict[tuple[int, str, bytes], AMQPView] | None = None) -> AMQPView:
        """The view of ``message``; ``known`` holds views already made, by what a view depends on
        (the store flag, topic and store properties, still encoded): messages alike share one."""
        if known is None:
            return cls._made(message)
        key = (message.flag, message.topic, message.raw_properties)
        view = known.get(key)
        if view is None:
            view = cls._made(message)
            if len(known) < KNOWN_VIEWS:
                known[key] = view
        return view

    @classmethod
    def _made(cls, message: StoredMessage) -> AMQPView:
        if message.flag & AMQP_FLAG:
            sp = message.properties
            raw = sp.get(HEADER)
            encoded = base64.b64decode(raw)[CONTENT_HEADER_FIXED:] if raw else EMPTY_PROPERTIES
            return cls(sp.get(EXCHANGE, ""), sp.get(ROUTING_KEY, message.topic), encoded)
        persistent = bool(message.flag & MQTT_FLAG) and message.flag & 0x03 > 0
        return cls("amq.topic", mqtt_topic_to_routing_key(message.topic),
                   PERSISTENT_PROPERTIES if persistent else TRANSIENT_PROPERTIES)

    @property
    def properties(self) -> commands.Basic.Properties:
        if self._properties is None:
            self._properties = decode_properties(self.raw_properties)
        return self._properties

    def counted_properties(self, delivery_count: int) -> bytes:
        """The encoded properties of a delivery: with ``delivery_count`` (how often it was given
        back) in header ``x-delivery-count``, as a quorum queue's redeliveries have it."""
        if not delivery_count:
            return self.raw_properties
        properties = copy_properties(self.properties)
        properties.headers = {**(properties.headers or {}), "x-delivery-count": delivery_count}
        return encode_properties(properties)

    @property
    def expiration(self) -> str | None:
        if len(self.raw_properties) < 2 or not self.raw_properties[0] & EXPIRATION_FLAG:
            return None  # the flags say it has none: no need to decode
        return self.properties.expiration

    def expired(self, message: StoredMessage, queue_ttl_ms: int | None, now_ms: int | None = None) -> bool:
        """Per-queue x-message-ttl and per-message expiration, counted from the store time."""
        if queue_ttl_ms is None and (len(self.raw_properties) < 2 or not self.raw_properties[0] & EXPIRATION_FLAG):
            return False  # (most messages: neither limit)
        limits = []
        if queue_ttl_ms is not None:
            limits.append(queue_ttl_ms)
        expiration = self.expiration
        if expiration:
            try:
                limits.append(int(expiration))
            except ValueError:
                pass
        if not limits:
            return False
        now = now_ms if now_ms is not None else time.time_ns() // 1_000_000
        return now >= message.store_timestamp + min(limits)
