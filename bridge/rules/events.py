"""The CloudEvents 1.0 view of a stored message, whichever protocol published it: what rules
match and what targets will send. ``cloud_event(message)`` derives the attributes from the
record and from what each protocol keeps in its store properties (the MQTT 5.0 property block,
the AMQP content header, RocketMQ's properties), decoding them with the protocols' own codecs.

The store's conventions read here (the flag bits and internal property names) are the
gateways' (gateway/interop.py, gateway/*/messages.py); bridge/ may not import the gateway, so
they are restated below, and tests/test_rule_patterns.py checks that they still agree.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from protocols.amqp.frames import decode_properties as decode_amqp_properties
from protocols.cloudevents import SPEC_VERSION, from_properties, is_json_type
from protocols.mqtt.properties import decode_properties as decode_mqtt_properties
from protocols.mqtt.properties import encode_varint
from store import StoredMessage

# the record flag (gateway/interop.py, gateway/remoting/messages.py)
MQTT_FLAG = 0x100  # published over MQTT: QoS in bits 0-1
MQTT_QOS_MASK = 0x03
MQTT_RETAIN_FLAG = 0x04
MQTT_PROPS_FLAG = 0x08  # the MQTT 5.0 property block is kept in MQTT_PROPS
AMQP_FLAG = 0x200
AMQP_PERSISTENT_FLAG = 0x01
REMOTING_FLAG = 0x400
# store properties that belong to a protocol gateway (never user properties)
INTERNAL_PREFIXES = ("rmq.", "mqtt.", "amqp.")
MQTT_CLIENT_ID = "mqtt.cid"
MQTT_PROPS = "mqtt.props"
AMQP_EXCHANGE = "amqp.x"
AMQP_ROUTING_KEY = "amqp.rk"
AMQP_HEADER = "amqp.p"
AMQP_HEADER_FIXED = 12  # class id, weight and body size before the encoded properties
REMOTING_BORN_HOST = "rmq.bh"  # set on every remoting send (a remoting record's flag may be 0)
REMOTING_PRODUCER_GROUP = "PGROUP"


class _NoData:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_DATA"


NO_DATA: Any = _NoData()  # the payload is not JSON: the event has attributes only


@dataclass(slots=True)
class CloudEvent:
    """A stored message as a CloudEvent. ``extensions`` are CloudEvents extension attributes
    (lower-case names, scalar values); ``properties`` the message's own properties (MQTT user
    properties, AMQP headers, RocketMQ properties), which names need not fit an attribute's;
    ``data`` the decoded JSON payload or NO_DATA; ``body`` the payload as stored; ``topic`` the
    topic it was stored under."""

    id: str
    source: str
    type: str
    time: str
    subject: str | None
    datacontenttype: str | None
    data: Any
    body: bytes
    extensions: dict[str, str | int | bool] = field(default_factory=dict)
    properties: dict[str, Any] = field(default_factory=dict)
    topic: str = ""

    def attributes(self) -> dict[str, Any]:
        """The context attributes (required, optional when set, extensions), as a CloudEvent
        in structured mode has them beside ``data``."""
        out: dict[str, Any] = {"specversion": SPEC_VERSION, "id": self.id, "source": self.source, "type": self.type,
                               "time": self.time}
        if self.subject is not None:
            out["subject"] = self.subject
        if self.datacontenttype is not None:
            out["datacontenttype"] = self.datacontenttype
        out.update(self.extensions)
        return out

    def for_matching(self) -> dict[str, Any]:
        """What an event pattern is matched against: the attributes, ``topiclevels`` (the
        topic's levels, a list), ``properties`` (an object) and ``data`` when the payload is
        JSON."""
        out = self.attributes()
        out["topiclevels"] = self.topic.split("/")
        out["properties"] = self.properties
        if self.data is not NO_DATA:
            out["data"] = self.data
        return out


def cloud_event(message: StoredMessage) -> CloudEvent:
    """The CloudEvent of ``message`` (docs/rules.md lists where each attribute comes from)."""
    flag = message.flag
    stored = message.properties
    extensions: dict[str, str | int | bool] = {}
    properties: dict[str, Any] = {}
    content_type: str | None = None
    event_type: str | None = None
    if flag & MQTT_FLAG:
        protocol = "mqtt"
        client_id = stored.get(MQTT_CLIENT_ID, "")
        source = _source("/mqtt/clients/", client_id)
        extensions["clientid"] = client_id
        extensions["qos"] = flag & MQTT_QOS_MASK
        extensions["retain"] = bool(flag & MQTT_RETAIN_FLAG)
        block = stored.get(MQTT_PROPS) if flag & MQTT_PROPS_FLAG else None
        if block:
            raw = base64.b64decode(block)
            mqtt_properties, _ = decode_mqtt_properties(encode_varint(len(raw)) + raw, 0, "publish")
            content_type = mqtt_properties.content_type
            for name, value in mqtt_properties.user_properties:
                _add_repeated(properties, name, value)
    elif flag & AMQP_FLAG:
        protocol = "amqp"
        exchange = stored.get(AMQP_EXCHANGE, "")
        source = _source("/amqp/exchanges/", exchange or "amq.default")
        extensions["exchange"] = exchange
        extensions["routingkey"] = stored.get(AMQP_ROUTING_KEY, message.topic)
        extensions["persistent"] = bool(flag & AMQP_PERSISTENT_FLAG)
        header = stored.get(AMQP_HEADER)
        if header:
            amqp_properties = decode_amqp_properties(base64.b64decode(header)[AMQP_HEADER_FIXED:])
            content_type = amqp_properties.content_type or None
            event_type = amqp_properties.message_type or None
            properties.update({str(k): _json_value(v) for k, v in (amqp_properties.headers or {}).items()})
    elif flag & REMOTING_FLAG or REMOTING_BORN_HOST in stored:
        protocol = "rocketmq"
        group = stored.get(REMOTING_PRODUCER_GROUP)
        source = _source("/rocketmq/groups/", group) if group else _source("/rocketmq/topics/", message.topic)
        properties.update({k: v for k, v in stored.items() if not k.startswith(INTERNAL_PREFIXES)})
    else:
        protocol = "store"
        source = "/store"
        properties.update({k: v for k, v in stored.items() if not k.startswith(INTERNAL_PREFIXES)})
    extensions["protocol"] = protocol
    extensions["topic"] = message.topic
    if message.key:
        extensions["msgkey"] = message.key
    data = json_data(message.body, content_type)
    if content_type is None and data is not NO_DATA:
        content_type = "application/json"
    time = _rfc3339(message.born_timestamp or message.store_timestamp)
    sent = from_properties(properties)
    if sent is not None:  # published as a CloudEvent (the ingest endpoint, or a client): its own attributes
        required = {name: sent.pop(name) for name in ("specversion", "id", "source", "type")}
        time, subject = sent.pop("time", time), sent.pop("subject", None)
        return CloudEvent(
            id=required["id"], source=required["source"], type=required["type"], time=time, subject=subject,
            datacontenttype=content_type, data=data, body=message.body, extensions={**extensions, **sent},
            properties=properties, topic=message.topic)
    return CloudEvent(
        id=message.msg_id, source=source, type=event_type or f"tidemq.{protocol}.message", time=time,
        subject=message.topic, datacontenttype=content_type, data=data, body=message.body, extensions=extensions,
        properties=properties, topic=message.topic)


@functools.lru_cache(maxsize=4096)
def _source(prefix: str, name: str) -> str:
    """A ``source`` attribute: ``prefix`` and the client's, exchange's, group's or topic's name
    percent-encoded (a device's events repeat its name: each is encoded once while it is in use)."""
    return prefix + quote(name, safe="")


def _add_repeated(properties: dict[str, Any], name: str, value: str) -> None:
    """An MQTT user property may repeat: a name given more than once holds the list of values."""
    if name not in properties:
        properties[name] = value
    elif isinstance(properties[name], list):
        properties[name].append(value)
    else:
        properties[name] = [properties[name], value]


def json_data(body: bytes, content_type: str | None) -> Any:
    """The payload decoded as JSON, or NO_DATA: a declared type that is not JSON, a payload
    that is not UTF-8 JSON."""
    if content_type is not None and not is_json_type(content_type):
        return NO_DATA
    if not body:
        return NO_DATA
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
        return NO_DATA


def _json_value(value: Any) -> Any:
    """An AMQP field-table value as JSON has it: timestamps as RFC 3339 text, decimals as
    numbers, byte strings as text when UTF-8 (else base64), tables and arrays throughout."""
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
        return aware.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return binascii.b2a_base64(bytes(value), newline=False).decode()
    return value


def _rfc3339(ms: int) -> str:
    return _second(ms // 1000) + f"{ms % 1000:03d}Z"


@functools.lru_cache(maxsize=256)
def _second(seconds: int) -> str:
    """The text of a whole second (events of a backlog share a few: formatted once each)."""
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.")
