# cython: annotation_typing=False
"""MQTT packets -> bytes for 3.1, 3.1.1 and 5.0 (sans-IO): ``encode(packet, version)``
gives a packet's wire bytes (properties dropped below 5.0); ``fixed_header`` frames a body;
``PublishTemplate`` is one PUBLISH encoded once for many receivers."""

from __future__ import annotations

import struct
from collections.abc import Callable

import cython

from . import properties as P
from .packets import (
    MQTT_3_1,
    MQTT_3_1_1,
    MQTT_5,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
)
from .properties import (
    MAX_VARINT,
    Properties,
    encode_binary,
    encode_property_block,
    encode_string,
    encode_varint,
)
from .reason_codes import CONNACK_V3_FOR, ConnackCodeV3

_U16 = struct.Struct(">H")
PROTOCOL_NAMES = {MQTT_3_1: "MQIsdp", MQTT_3_1_1: "MQTT", MQTT_5: "MQTT"}
# Fixed-header flag bits each packet type must carry (section 2.1.3); PUBLISH's are its own.
FIXED_FLAGS = {t: 0 for t in PacketType} | {
    PacketType.PUBREL: 0b0010, PacketType.SUBSCRIBE: 0b0010, PacketType.UNSUBSCRIBE: 0b0010}


def fixed_header(first_byte: int, remaining: int) -> bytes:
    if remaining > MAX_VARINT:
        raise ValueError(f"packet body of {remaining} bytes exceeds MQTT's limit")
    if 0 <= remaining < 128 and 0 <= first_byte < 256:  # the common short packet, without a varint call
        return bytes((first_byte, remaining))
    return bytes((first_byte,)) + encode_varint(remaining)


@cython.cclass
class PublishTemplate:
    """One outgoing PUBLISH encoded once and sent to many receivers (fan-out): a QoS 1/2 copy
    gets its packet id, and DUP when resent, patched into the same bytes."""

    data = cython.declare(bytes, visibility="readonly")
    packet_id_at = cython.declare(cython.Py_ssize_t, visibility="readonly")  # -1 for QoS 0

    def __init__(self, data: bytes, packet_id_at: int) -> None:
        self.data = data
        self.packet_id_at = packet_id_at

    def __repr__(self) -> str:
        return f"PublishTemplate(data={self.data!r}, packet_id_at={self.packet_id_at})"

    @staticmethod
    def of(topic: str, payload: bytes, qos: int, retain: bool, version: int,
           properties: Properties | None) -> PublishTemplate:
        head, packet_id_at = _publish_head(topic, qos, 0, properties, version)
        header = fixed_header(0x30 | (qos << 1) | (1 if retain else 0), len(head) + len(payload))
        return PublishTemplate(header + head + payload, len(header) + packet_id_at if qos else -1)

    def render(self, packet_id: int | None, dup: bool = False) -> bytes:
        out = bytearray()
        self.render_into(out, packet_id, dup)
        return bytes(out)

    @cython.locals(at=cython.Py_ssize_t, start=cython.Py_ssize_t, pid=cython.int, buf=bytearray)
    def render_into(self, out: bytearray, packet_id: int | None, dup: bool = False) -> None:
        """Append this copy's bytes to ``out`` (a connection's output buffer: no bytes object
        per copy). The packet id and DUP are checked before anything is appended."""
        at = self.packet_id_at
        buf = out
        if at < 0:
            buf += self.data
            return
        if packet_id is None:
            raise ValueError("a QoS 1/2 PUBLISH needs a packet id")
        if not 0 < packet_id <= 0xFFFF:
            raise ValueError(f"packet id out of range: {packet_id}")
        pid = packet_id
        start = len(buf)
        buf += self.data
        buf[start + at] = pid >> 8
        buf[start + at + 1] = pid & 0xFF
        if dup:
            buf[start] |= 0x08


# -- encoding --------------------------------------------------------------------------------
def encode(packet: Packet, version: int = MQTT_3_1_1) -> bytes:
    """The wire bytes of ``packet`` in protocol ``version`` (properties dropped below 5.0)."""
    kind = packet.packet_type
    flags, body = _ENCODERS[kind](packet, version)
    return fixed_header((kind << 4) | flags, len(body)) + body


def _props(props: Properties, version: int) -> bytes:
    return encode_property_block(props) if version == MQTT_5 else b""


def _encode_connect(p: Connect, _: int) -> tuple[int, bytes]:
    version = p.version
    flags = 0x02 if p.clean_start else 0
    if p.will is not None:
        flags |= 0x04 | (p.will.qos << 3) | (0x20 if p.will.retain else 0)
    if p.username is not None:
        flags |= 0x80
    if p.password is not None:
        flags |= 0x40
    out = bytearray(encode_string(PROTOCOL_NAMES[version]))
    out += bytes((version, flags)) + _U16.pack(p.keep_alive) + _props(p.properties, version)
    out += encode_string(p.client_id)
    if p.will is not None:
        if version == MQTT_5:
            out += encode_property_block(p.will.properties)
        out += encode_string(p.will.topic) + encode_binary(p.will.payload)
    if p.username is not None:
        out += encode_string(p.username)
    if p.password is not None:
        out += encode_binary(p.password)
    return 0, bytes(out)


def _encode_connack(p: ConnAck, version: int) -> tuple[int, bytes]:
    code = p.reason_code if version == MQTT_5 else CONNACK_V3_FOR.get(p.reason_code, ConnackCodeV3.SERVER_UNAVAILABLE)
    return 0, bytes((1 if p.session_present else 0, code)) + _props(p.properties, version)


def _encode_publish(p: Publish, version: int) -> tuple[int, bytes]:
    flags = (p.qos << 1) | (0x08 if p.dup else 0) | (0x01 if p.retain else 0)
    if p.qos and not p.packet_id:
        raise ValueError("a QoS 1/2 PUBLISH needs a packet id")
    return flags, _publish_head(p.topic, p.qos, p.packet_id or 0, p.properties, version)[0] + p.payload


def _publish_head(topic: str, qos: int, packet_id: int, properties: Properties | None,
                  version: int) -> tuple[bytes, int]:
    """A PUBLISH's variable header, and where in it the packet id is (QoS 1/2)."""
    head = encode_string(topic)
    packet_id_at = len(head)
    if qos:
        head += _U16.pack(packet_id)
    if version == MQTT_5:
        head += encode_property_block(properties) if properties is not None else b"\x00"
    return head, packet_id_at


def _encode_ack(p: PubAck | PubRec | PubRel | PubComp, version: int) -> tuple[int, bytes]:
    body = _U16.pack(p.packet_id)
    if version == MQTT_5:
        props = P.encode_properties(p.properties)
        if props:
            body += bytes((p.reason_code,)) + encode_varint(len(props)) + props
        elif p.reason_code:
            body += bytes((p.reason_code,))
    return FIXED_FLAGS[p.packet_type], body


def _encode_subscribe(p: Subscribe, version: int) -> tuple[int, bytes]:
    out = bytearray(_U16.pack(p.packet_id)) + _props(p.properties, version)
    for s in p.subscriptions:
        options = s.qos
        if version == MQTT_5:
            options |= (s.no_local << 2) | (s.retain_as_published << 3) | (s.retain_handling << 4)
        out += encode_string(s.topic_filter) + bytes((options,))
    return 0b0010, bytes(out)


def _encode_suback(p: SubAck, version: int) -> tuple[int, bytes]:
    return 0, _U16.pack(p.packet_id) + _props(p.properties, version) + bytes(p.reason_codes)


def _encode_unsubscribe(p: Unsubscribe, version: int) -> tuple[int, bytes]:
    out = bytearray(_U16.pack(p.packet_id)) + _props(p.properties, version)
    for f in p.topic_filters:
        out += encode_string(f)
    return 0b0010, bytes(out)


def _encode_unsuback(p: UnsubAck, version: int) -> tuple[int, bytes]:
    if version != MQTT_5:
        return 0, _U16.pack(p.packet_id)
    return 0, _U16.pack(p.packet_id) + _props(p.properties, version) + bytes(p.reason_codes)


def _encode_empty(_: PingReq | PingResp, __: int) -> tuple[int, bytes]:
    return 0, b""


def _encode_reason_and_props(p: Disconnect | Auth, version: int) -> tuple[int, bytes]:
    if version != MQTT_5:
        return 0, b""
    props = P.encode_properties(p.properties)
    if props:
        return 0, bytes((p.reason_code,)) + encode_varint(len(props)) + props
    return 0, bytes((p.reason_code,)) if p.reason_code else b""


_ENCODERS: dict[PacketType, Callable[..., tuple[int, bytes]]] = {
    PacketType.CONNECT: _encode_connect,
    PacketType.CONNACK: _encode_connack,
    PacketType.PUBLISH: _encode_publish,
    PacketType.PUBACK: _encode_ack,
    PacketType.PUBREC: _encode_ack,
    PacketType.PUBREL: _encode_ack,
    PacketType.PUBCOMP: _encode_ack,
    PacketType.SUBSCRIBE: _encode_subscribe,
    PacketType.SUBACK: _encode_suback,
    PacketType.UNSUBSCRIBE: _encode_unsubscribe,
    PacketType.UNSUBACK: _encode_unsuback,
    PacketType.PINGREQ: _encode_empty,
    PacketType.PINGRESP: _encode_empty,
    PacketType.DISCONNECT: _encode_reason_and_props,
    PacketType.AUTH: _encode_reason_and_props,
}

