"""MQTT PUBLISH <-> store message: which properties travel with a stored message, and the
outgoing PUBLISH bytes, encoded once per variant and shared by every subscriber.

Store properties written by MQTT (readable by the other protocols):
``mqtt.qos`` (publish QoS), ``mqtt.retain`` ("1" when published with RETAIN), ``mqtt.cid``
(publisher's client id, for No Local), ``mqtt.props`` (the MQTT 5.0 property block of the
PUBLISH, base64, without Topic Alias and Subscription Identifiers). A message from another
protocol has none of them: it is delivered at the subscription's QoS with no properties.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass

from protocols.mqtt.codec import fixed_header
from protocols.mqtt.packets import MQTT_5, Publish
from protocols.mqtt.properties import (
    EMPTY_PROPERTIES,
    Properties,
    decode_properties,
    encode_properties,
    encode_string,
    encode_varint,
)
from store import Message, StoredMessage
from store import encode_properties as encode_store_properties

QOS = "mqtt.qos"
RETAIN = "mqtt.retain"
CLIENT_ID = "mqtt.cid"
PROPS = "mqtt.props"


class StoreMessageFactory:
    """PUBLISH -> store Message for one publisher; the common case (no 5.0 properties) reuses
    the store-encoded property set per (QoS, retain) instead of encoding it per message."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self._encoded: dict[tuple[int, bool], bytes] = {}

    def message(self, publish: Publish, topic: str) -> Message:
        p = publish.properties
        if p is EMPTY_PROPERTIES:
            key = (publish.qos, publish.retain)
            encoded = self._encoded.get(key)
            if encoded is None:
                encoded = self._encoded[key] = encode_store_properties(_store_properties(publish, self.client_id))
            return Message(topic, publish.payload, encoded_properties=encoded)
        props = _store_properties(publish, self.client_id)
        if p.topic_alias is not None or p.subscription_identifiers:
            p = p.copy(topic_alias=None, subscription_identifiers=[])
        block = encode_properties(p)
        if block:
            props[PROPS] = base64.b64encode(block).decode()
        return Message(topic, publish.payload, props)


def _store_properties(publish: Publish, client_id: str) -> dict[str, str]:
    props = {QOS: "012"[publish.qos], CLIENT_ID: client_id}
    if publish.retain:
        props[RETAIN] = "1"
    return props


def to_store_message(publish: Publish, client_id: str, topic: str) -> Message:
    return StoreMessageFactory(client_id).message(publish, topic)


@dataclass(slots=True)
class Delivery:
    """What a stored message means to MQTT subscribers (decoded once per message)."""

    qos: int  # the QoS it was published with (2 for messages from other protocols)
    retain: bool
    publisher: str
    props: Properties | None
    expires_at: float | None  # wall clock seconds, from Message Expiry Interval

    @classmethod
    def of(cls, message: StoredMessage) -> Delivery:
        sp = message.properties
        props = None
        expires_at = None
        raw = sp.get(PROPS)
        if raw:
            block = base64.b64decode(raw)
            props, _ = decode_properties(encode_varint(len(block)) + block, 0, "publish")
            if props.message_expiry_interval is not None:
                expires_at = message.store_timestamp / 1000 + props.message_expiry_interval
        qos = sp.get(QOS)
        return cls(int(qos) if qos else 2, sp.get(RETAIN) == "1", sp.get(CLIENT_ID, ""), props, expires_at)

    def remaining_expiry(self, now: float | None = None) -> int | None:
        """Seconds left (None: never expires; <= 0: expired, not to be delivered)."""
        if self.expires_at is None:
            return None
        return int(self.expires_at - (time.time() if now is None else now))


@dataclass(slots=True)
class PublishTemplate:
    """The bytes of one outgoing PUBLISH; QoS > 0 copies get their packet id patched in."""

    data: bytes
    packet_id_at: int  # -1 for QoS 0

    def render(self, packet_id: int | None, dup: bool = False) -> bytes:
        if self.packet_id_at < 0:
            return self.data
        out = bytearray(self.data)
        out[self.packet_id_at] = packet_id >> 8  # type: ignore[operator]
        out[self.packet_id_at + 1] = packet_id & 0xFF  # type: ignore[operator]
        if dup:
            out[0] |= 0x08
        return bytes(out)


def build_template(topic: str, payload: bytes, qos: int, retain: bool, version: int,
                   props: Properties | None) -> PublishTemplate:
    head = encode_string(topic)
    packet_id_at = -1
    if qos:
        packet_id_at = len(head)
        head += b"\x00\x00"
    if version == MQTT_5:
        block = encode_properties(props) if props is not None else b""
        head += encode_varint(len(block)) + block
    first = 0x30 | (qos << 1) | (1 if retain else 0)
    header = fixed_header(first, len(head) + len(payload))
    if packet_id_at >= 0:
        packet_id_at += len(header)
    return PublishTemplate(header + head + payload, packet_id_at)
