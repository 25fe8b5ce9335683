"""Bytes -> MQTT packets for 3.1, 3.1.1 and 5.0 (sans-IO): ``PacketReader`` is fed bytes as
they arrive and yields whole packets, enforcing the maximum packet size before buffering a body.
Everything malformed raises an ``MQTTError`` subclass, never anything else.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

import cython

from . import properties as P
from .errors import (
    MalformedPacket,
    MQTTError,
    PacketTooLarge,
    ProtocolViolation,
    UnsupportedProtocolVersion,
)
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
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)
from .properties import (
    EMPTY_PROPERTIES,
    MAX_VARINT,
    decode_binary,
    decode_properties,
    decode_string,
    decode_u16,
)
from .reason_codes import CONNACK_V3_FOR, ReasonCode
from .writer import FIXED_FLAGS

_TYPES = (None, *PacketType)  # PacketType by value, without an enum call per packet
_ACK_CLASSES: dict[PacketType, type[PubAck | PubRec | PubRel | PubComp]] = {
    PacketType.PUBACK: PubAck, PacketType.PUBREC: PubRec, PacketType.PUBREL: PubRel, PacketType.PUBCOMP: PubComp}


# -- decoding --------------------------------------------------------------------------------
def decode(first_byte: int, body: bytes | memoryview, version: int) -> Packet:
    """One packet from its first byte and its body (the bytes after the remaining length)."""
    kind_value = first_byte >> 4
    if kind_value == 0:
        raise MalformedPacket("packet type 0 is reserved")
    kind = _TYPES[kind_value]
    flags = first_byte & 0x0F
    if kind == PacketType.AUTH and version != MQTT_5:
        raise MalformedPacket("AUTH exists only in MQTT 5.0")
    if kind != PacketType.PUBLISH and flags != FIXED_FLAGS[kind]:
        raise MalformedPacket(f"invalid fixed header flags 0x{flags:X} for {kind.name}")
    try:
        return _DECODERS[kind](flags, body, version)
    except MQTTError:
        raise
    except (IndexError, struct.error, ValueError) as exc:  # a bound the decoder did not check
        raise MalformedPacket(f"malformed {kind.name}: {exc}") from None


def _expect_end(pos: int, body: bytes | memoryview, kind: str) -> None:
    if pos != len(body):
        raise MalformedPacket(f"{len(body) - pos} unexpected bytes at the end of {kind}")


def _decode_connect(_: int, body: bytes | memoryview, __: int) -> Connect:
    name, pos = decode_string(body, 0)
    if pos >= len(body):
        raise MalformedPacket("CONNECT without a protocol level")
    level = body[pos]
    if (name, level) not in (("MQTT", MQTT_3_1_1), ("MQTT", MQTT_5), ("MQIsdp", MQTT_3_1)):
        if name not in ("MQTT", "MQIsdp"):
            raise MalformedPacket(f"unknown protocol name {name!r}")
        raise UnsupportedProtocolVersion(f"protocol {name!r} level {level} is not supported")
    version = level
    if pos + 4 > len(body):
        raise MalformedPacket("truncated CONNECT header")
    flags = body[pos + 1]
    keep_alive = (body[pos + 2] << 8) | body[pos + 3]
    pos += 4
    if flags & 0x01:
        raise MalformedPacket("the reserved CONNECT flag is set")
    will_flag = bool(flags & 0x04)
    will_qos = (flags >> 3) & 0x03
    will_retain = bool(flags & 0x20)
    if will_qos == 3:
        raise MalformedPacket("will QoS 3")
    if not will_flag and (will_qos or will_retain):
        raise MalformedPacket("will QoS/retain set without the will flag")
    has_user, has_password = bool(flags & 0x80), bool(flags & 0x40)
    if has_password and not has_user and version != MQTT_5:
        raise MalformedPacket("password flag without user name flag")
    props = EMPTY_PROPERTIES
    if version == MQTT_5:
        props, pos = decode_properties(body, pos, P.CONNECT)
    client_id, pos = decode_string(body, pos)
    will = None
    if will_flag:
        will_props = EMPTY_PROPERTIES
        if version == MQTT_5:
            will_props, pos = decode_properties(body, pos, P.WILL)
        will_topic, pos = decode_string(body, pos)
        will_payload, pos = decode_binary(body, pos)
        will = Will(will_topic, will_payload, will_qos, will_retain, will_props)
    username = password = None
    if has_user:
        username, pos = decode_string(body, pos)
    if has_password:
        password, pos = decode_binary(body, pos)
    _expect_end(pos, body, "CONNECT")
    if props.authentication_data is not None and props.authentication_method is None:
        raise ProtocolViolation("authentication data without an authentication method")
    return Connect(client_id, version, bool(flags & 0x02), keep_alive, username, password, will, props)


def _decode_connack(_: int, body: bytes | memoryview, version: int) -> ConnAck:
    if len(body) < 2:
        raise MalformedPacket("truncated CONNACK")
    if body[0] & 0xFE:
        raise MalformedPacket("reserved CONNACK acknowledge flags are set")
    props, pos = EMPTY_PROPERTIES, 2
    if version == MQTT_5:
        props, pos = decode_properties(body, 2, P.CONNACK)
    _expect_end(pos, body, "CONNACK")
    code = body[1]
    if version != MQTT_5:  # map 3.1.1 return codes onto the 5.0 reason codes we use inside
        code = next((rc for rc, v3 in CONNACK_V3_FOR.items() if v3 == code), ReasonCode.UNSPECIFIED_ERROR)
    return ConnAck(bool(body[0] & 1), code, props)


def _decode_publish(flags: int, body: bytes | memoryview, version: int) -> Publish:
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise MalformedPacket("PUBLISH with QoS 3")
    dup = bool(flags & 0x08)
    if dup and qos == 0:
        raise MalformedPacket("DUP set on a QoS 0 PUBLISH")
    topic, pos = decode_string(body, 0)
    packet_id = None
    if qos:
        packet_id, pos = decode_u16(body, pos)
        if packet_id == 0:
            raise MalformedPacket("packet id 0")
    props = EMPTY_PROPERTIES
    if version == MQTT_5:
        props, pos = decode_properties(body, pos, P.PUBLISH)
    if pos > len(body):
        raise MalformedPacket("truncated PUBLISH")
    return Publish(topic, bytes(body[pos:]), qos, bool(flags & 0x01), dup, packet_id, props)


def _decode_ack(kind: PacketType) -> Callable[[int, bytes | memoryview, int], Packet]:
    cls = _ACK_CLASSES[kind]

    def decode_ack(_: int, body: bytes | memoryview, version: int) -> Packet:
        packet_id, pos = decode_u16(body, 0)
        if packet_id == 0:
            raise MalformedPacket("packet id 0")
        code, props = 0, EMPTY_PROPERTIES
        if version == MQTT_5 and len(body) > 2:
            code = body[2]
            pos = 3
            if len(body) > 3:
                props, pos = decode_properties(body, 3, kind.name.lower())
        _expect_end(pos, body, kind.name)
        return cls(packet_id, code, props)

    return decode_ack


def _decode_subscribe(_: int, body: bytes | memoryview, version: int) -> Subscribe:
    packet_id, pos = decode_u16(body, 0)
    if packet_id == 0:
        raise MalformedPacket("packet id 0")
    props = EMPTY_PROPERTIES
    if version == MQTT_5:
        props, pos = decode_properties(body, pos, P.SUBSCRIBE)
        if len(props.subscription_identifiers) > 1:
            raise ProtocolViolation("more than one subscription identifier")
    subscriptions = []
    while pos < len(body):
        topic_filter, pos = decode_string(body, pos)
        if pos >= len(body):
            raise MalformedPacket("subscription without options")
        options = body[pos]
        pos += 1
        qos = options & 0x03
        if qos == 3:
            raise MalformedPacket("requested QoS 3")
        if version == MQTT_5:
            if options & 0xC0:
                raise MalformedPacket("reserved subscription option bits are set")
            retain_handling = (options >> 4) & 0x03
            if retain_handling == 3:
                raise ProtocolViolation("retain handling 3")
            subscriptions.append(Subscription(topic_filter, qos, bool(options & 0x04), bool(options & 0x08),
                                              retain_handling))
        else:
            if options & 0xFC:
                raise MalformedPacket("reserved subscription option bits are set")
            subscriptions.append(Subscription(topic_filter, qos))
    if not subscriptions:
        raise ProtocolViolation("SUBSCRIBE with no topic filter")
    return Subscribe(packet_id, subscriptions, props)


def _decode_suback(_: int, body: bytes | memoryview, version: int) -> SubAck:
    packet_id, pos = decode_u16(body, 0)
    props = EMPTY_PROPERTIES
    if version == MQTT_5:
        props, pos = decode_properties(body, pos, P.SUBACK)
    return SubAck(packet_id, list(body[pos:]), props)


def _decode_unsubscribe(_: int, body: bytes | memoryview, version: int) -> Unsubscribe:
    packet_id, pos = decode_u16(body, 0)
    if packet_id == 0:
        raise MalformedPacket("packet id 0")
    props = EMPTY_PROPERTIES
    if version == MQTT_5:
        props, pos = decode_properties(body, pos, P.UNSUBSCRIBE)
    filters = []
    while pos < len(body):
        topic_filter, pos = decode_string(body, pos)
        filters.append(topic_filter)
    if not filters:
        raise ProtocolViolation("UNSUBSCRIBE with no topic filter")
    return Unsubscribe(packet_id, filters, props)


def _decode_unsuback(_: int, body: bytes | memoryview, version: int) -> UnsubAck:
    packet_id, pos = decode_u16(body, 0)
    if version != MQTT_5:
        _expect_end(pos, body, "UNSUBACK")
        return UnsubAck(packet_id)
    props, pos = decode_properties(body, pos, P.UNSUBACK)
    return UnsubAck(packet_id, list(body[pos:]), props)


def _decode_empty(kind: PacketType) -> Callable[[int, bytes | memoryview, int], Packet]:
    cls = PingReq if kind == PacketType.PINGREQ else PingResp

    def decode_empty(_: int, body: bytes | memoryview, version: int) -> Packet:
        _expect_end(0, body, kind.name)
        return cls()

    return decode_empty


def _decode_reason_and_props(kind: PacketType) -> Callable[[int, bytes | memoryview, int], Packet]:
    cls = Disconnect if kind == PacketType.DISCONNECT else Auth
    prop_kind = kind.name.lower()

    def decode_reason(_: int, body: bytes | memoryview, version: int) -> Packet:
        if version != MQTT_5:
            _expect_end(0, body, kind.name)
            return cls()
        code, props, pos = 0, EMPTY_PROPERTIES, 0
        if len(body) >= 1:
            code, pos = body[0], 1
        if len(body) >= 2:
            props, pos = decode_properties(body, 1, prop_kind)
        _expect_end(pos, body, kind.name)
        return cls(code, props)

    return decode_reason


_DECODERS: dict[PacketType, Callable[[int, bytes | memoryview, int], Packet]] = {
    PacketType.CONNECT: _decode_connect,
    PacketType.CONNACK: _decode_connack,
    PacketType.PUBLISH: _decode_publish,
    PacketType.PUBACK: _decode_ack(PacketType.PUBACK),
    PacketType.PUBREC: _decode_ack(PacketType.PUBREC),
    PacketType.PUBREL: _decode_ack(PacketType.PUBREL),
    PacketType.PUBCOMP: _decode_ack(PacketType.PUBCOMP),
    PacketType.SUBSCRIBE: _decode_subscribe,
    PacketType.SUBACK: _decode_suback,
    PacketType.UNSUBSCRIBE: _decode_unsubscribe,
    PacketType.UNSUBACK: _decode_unsuback,
    PacketType.PINGREQ: _decode_empty(PacketType.PINGREQ),
    PacketType.PINGRESP: _decode_empty(PacketType.PINGRESP),
    PacketType.DISCONNECT: _decode_reason_and_props(PacketType.DISCONNECT),
    PacketType.AUTH: _decode_reason_and_props(PacketType.AUTH),
}


@cython.cclass
class PacketReader:
    """Incremental framing: ``feed(data)`` then iterate ``packets()``.

    ``version`` starts unknown (None) and is set by the first CONNECT (server side) or
    given by the caller (client side). ``max_packet_size`` bounds a whole packet (fixed
    header included), checked from the fixed header before the body is buffered.
    """

    _buffer: bytearray | None  # (None while nothing is buffered)
    max_packet_size = cython.declare(cython.Py_ssize_t, visibility="public")
    version = cython.declare(object, visibility="public")

    def __init__(self, max_packet_size: int = MAX_VARINT + 5, version: int | None = None) -> None:
        # None while nothing is buffered: the reader of an idle connection holds no bytearray
        self._buffer = None
        self.max_packet_size = max_packet_size
        self.version = version

    @property
    def buffered(self) -> int:
        return len(self._buffer) if self._buffer is not None else 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:  # (a bytes annotation: compiled, bytes only)
        if self._buffer is None:
            self._buffer = bytearray(data)
        else:
            self._buffer += data

    @cython.locals(pos=cython.Py_ssize_t, size=cython.Py_ssize_t, i=cython.Py_ssize_t, remaining=cython.Py_ssize_t,
                   shift=cython.int, byte=cython.int, first=cython.int, total=cython.Py_ssize_t, end=cython.Py_ssize_t)
    def packets(self) -> Iterator[Packet]:
        buf: bytearray | None = self._buffer
        if buf is None:
            return
        pos = 0
        try:
            while True:
                size = len(buf)
                if size - pos < 2:
                    return
                first = buf[pos]
                remaining = 0
                shift = 0
                i = pos + 1
                while True:
                    if i >= size:
                        if i - pos - 1 >= 4:
                            raise MalformedPacket("remaining length longer than 4 bytes")
                        return  # the length itself is incomplete
                    byte = buf[i]
                    i += 1
                    remaining |= (byte & 0x7F) << shift
                    if not byte & 0x80:
                        break
                    shift += 7
                    if shift >= 28:
                        raise MalformedPacket("remaining length longer than 4 bytes")
                total = i - pos + remaining
                if total > self.max_packet_size:
                    raise PacketTooLarge(f"packet of {total} bytes exceeds the maximum of {self.max_packet_size}")
                if size - pos < total:
                    return
                end = pos + total
                if self.version is not None:
                    fast = _fast_decode(first, buf, i, end, self.version)
                    if fast is not None:
                        pos = end
                        yield fast
                        continue
                body = bytes(buf[i:end])
                pos = end
                if self.version is None:
                    if first >> 4 != PacketType.CONNECT:
                        raise ProtocolViolation("the first packet must be CONNECT")
                    packet = decode(first, body, MQTT_5)  # CONNECT decoding reads its own level
                    self.version = packet.version  # type: ignore[union-attr]
                else:
                    packet = decode(first, body, self.version)
                yield packet
        finally:
            del buf[:pos]
            if not buf and self._buffer is buf:
                self._buffer = None


@cython.cfunc
def _puback(packet_id: object) -> object:
    """``PubAck(packet_id, 0, EMPTY_PROPERTIES)`` without running the dataclass's Python
    ``__init__`` (a subscriber sends one per delivery): the object, its three slots set."""
    ack = PubAck.__new__(PubAck)
    ack.packet_id = packet_id  # type: ignore[assignment]  # (an int: the caller's C int as an object)
    ack.reason_code = 0
    ack.properties = EMPTY_PROPERTIES
    return ack


@cython.cfunc
@cython.locals(qos=cython.int, pos=cython.Py_ssize_t, packet_id=cython.int)
def _fast_decode(first: cython.int, buf: bytearray, start: cython.Py_ssize_t, end: cython.Py_ssize_t,
                 version: cython.int) -> Packet | None:
    """The two packets of the message hot path (a valid PUBLISH without 5.0 properties, a plain
    PUBACK) straight from the buffer; None sends everything else, including anything odd, to
    the full decoder, which raises the right error."""
    if first == 0x40:
        if end - start == 2:
            packet_id = (buf[start] << 8) | buf[start + 1]
            if packet_id:
                return _puback(packet_id)
        return None
    if first >> 4 != 3 or end - start < 2:  # 3: PUBLISH
        return None
    qos = (first >> 1) & 0x03
    if qos == 3 or (qos == 0 and first & 0x08):
        return None
    pos = start + 2 + ((buf[start] << 8) | buf[start + 1])
    if pos > end:
        return None
    try:
        topic = buf[start + 2:pos].decode()
    except UnicodeDecodeError:
        return None
    if "\x00" in topic:
        return None
    packet_id_or_none = None
    if qos:
        if pos + 2 > end:
            return None
        packet_id = (buf[pos] << 8) | buf[pos + 1]
        if not packet_id:
            return None
        packet_id_or_none = packet_id
        pos += 2
    if version == MQTT_5:
        if pos >= end or buf[pos] != 0:  # properties present: the full decoder checks them
            return None
        pos += 1
    return Publish(topic, bytes(buf[pos:end]), qos, bool(first & 0x01), bool(first & 0x08), packet_id_or_none,
                   EMPTY_PROPERTIES)
