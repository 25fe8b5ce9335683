"""MQTT 5.0 properties (section 2.2.2): one dataclass with a field per property, and the
table that says each property's identifier, wire type and which packets may carry it."""

from __future__ import annotations

import operator
import struct
from dataclasses import dataclass, field, fields
from typing import Any

from .errors import MalformedPacket, ProtocolViolation

# Wire types (section 1.5).
BYTE, U16, U32, VARINT, UTF8, BINARY, PAIR = range(7)

# Packet kinds a property may appear in; "will" is the will-properties block of CONNECT.
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = (
    "connect", "connack", "publish", "puback", "pubrec", "pubrel", "pubcomp")
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, DISCONNECT, AUTH, WILL = (
    "subscribe", "suback", "unsubscribe", "unsuback", "disconnect", "auth", "will")
_ACKS = frozenset({PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK})
_ALL = frozenset({CONNECT, CONNACK, PUBLISH, SUBSCRIBE, UNSUBSCRIBE, DISCONNECT, AUTH, WILL}) | _ACKS

# identifier -> (field name, wire type, packets allowed)
PROPERTY_TABLE: dict[int, tuple[str, int, frozenset[str]]] = {
    0x01: ("payload_format_indicator", BYTE, frozenset({PUBLISH, WILL})),
    0x02: ("message_expiry_interval", U32, frozenset({PUBLISH, WILL})),
    0x03: ("content_type", UTF8, frozenset({PUBLISH, WILL})),
    0x08: ("response_topic", UTF8, frozenset({PUBLISH, WILL})),
    0x09: ("correlation_data", BINARY, frozenset({PUBLISH, WILL})),
    0x0B: ("subscription_identifiers", VARINT, frozenset({PUBLISH, SUBSCRIBE})),
    0x11: ("session_expiry_interval", U32, frozenset({CONNECT, CONNACK, DISCONNECT})),
    0x12: ("assigned_client_identifier", UTF8, frozenset({CONNACK})),
    0x13: ("server_keep_alive", U16, frozenset({CONNACK})),
    0x15: ("authentication_method", UTF8, frozenset({CONNECT, CONNACK, AUTH})),
    0x16: ("authentication_data", BINARY, frozenset({CONNECT, CONNACK, AUTH})),
    0x17: ("request_problem_information", BYTE, frozenset({CONNECT})),
    0x18: ("will_delay_interval", U32, frozenset({WILL})),
    0x19: ("request_response_information", BYTE, frozenset({CONNECT})),
    0x1A: ("response_information", UTF8, frozenset({CONNACK})),
    0x1C: ("server_reference", UTF8, frozenset({CONNACK, DISCONNECT})),
    0x1F: ("reason_string", UTF8, frozenset({CONNACK, DISCONNECT, AUTH}) | _ACKS),
    0x21: ("receive_maximum", U16, frozenset({CONNECT, CONNACK})),
    0x22: ("topic_alias_maximum", U16, frozenset({CONNECT, CONNACK})),
    0x23: ("topic_alias", U16, frozenset({PUBLISH})),
    0x24: ("maximum_qos", BYTE, frozenset({CONNACK})),
    0x25: ("retain_available", BYTE, frozenset({CONNACK})),
    0x26: ("user_properties", PAIR, _ALL),
    0x27: ("maximum_packet_size", U32, frozenset({CONNECT, CONNACK})),
    0x28: ("wildcard_subscription_available", BYTE, frozenset({CONNACK})),
    0x29: ("subscription_identifier_available", BYTE, frozenset({CONNACK})),
    0x2A: ("shared_subscription_available", BYTE, frozenset({CONNACK})),
}
_ID_OF = {name: (ident, wire) for ident, (name, wire, _) in PROPERTY_TABLE.items()}
_REPEATABLE = frozenset({"user_properties", "subscription_identifiers"})
_REPEATABLE_IDS = frozenset(_ID_OF[name][0] for name in _REPEATABLE)
_WIRES = tuple(_ID_OF.values())  # (ident, wire) of each property, in the table's order
_VALUES_OF = operator.attrgetter(*_ID_OF)  # a Properties -> its values, in the same order
# Byte properties whose only valid values are 0 and 1 (a Protocol Error otherwise).
_BOOLEAN_BYTES = frozenset({
    "payload_format_indicator", "request_problem_information", "request_response_information",
    "maximum_qos", "retain_available", "wildcard_subscription_available",
    "subscription_identifier_available", "shared_subscription_available",
})
# Integer properties for which 0 is a Protocol Error.
_NON_ZERO = frozenset({"receive_maximum", "maximum_packet_size", "topic_alias", "subscription_identifiers"})

MAX_VARINT = 268_435_455
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


@dataclass(slots=True)
class Properties:
    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: list[int] = field(default_factory=list)
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_properties: list[tuple[str, str]] = field(default_factory=list)
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None

    def is_empty(self) -> bool:
        return not encode_properties(self)

    def copy(self, **changes: Any) -> Properties:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["user_properties"] = list(self.user_properties)
        values["subscription_identifiers"] = list(self.subscription_identifiers)
        values.update(changes)
        return Properties(**values)


class _EmptyProperties(Properties):
    """The shared value of every decoded packet that carries no properties (most packets, and
    all of MQTT 3.1.1): one object instead of one allocation per packet. Read-only."""

    __slots__ = ()
    _sealed = False

    def __setattr__(self, name: str, value: Any) -> None:
        if type(self)._sealed:
            raise AttributeError("EMPTY_PROPERTIES is shared and read-only; use .copy()")
        object.__setattr__(self, name, value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Properties):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in fields(Properties))

    __hash__ = None  # type: ignore[assignment]  # (mutable, as a dataclass's eq)


EMPTY_PROPERTIES: Properties = _EmptyProperties()
_EmptyProperties._sealed = True


# -- primitive encoders (section 1.5) ---------------------------------------------------------
def encode_varint(value: int) -> bytes:
    if not 0 <= value <= MAX_VARINT:
        raise ValueError(f"variable byte integer out of range: {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_string(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 0xFFFF:
        raise ValueError("an MQTT string is at most 65,535 bytes")
    return _U16.pack(len(raw)) + raw


def encode_binary(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise ValueError("MQTT binary data is at most 65,535 bytes")
    return _U16.pack(len(data)) + data


def encode_properties(props: Properties | None) -> bytes:
    """The property block without its length prefix (b"" when there is nothing to send)."""
    if props is None or props is EMPTY_PROPERTIES:
        return b""
    out = bytearray()
    for (ident, wire), value in zip(_WIRES, _VALUES_OF(props)):  # (every value in one call)
        if value is None:
            continue
        if ident in _REPEATABLE_IDS:
            for item in value:
                out.append(ident)
                if wire == VARINT:
                    out += encode_varint(item)
                else:
                    out += encode_string(item[0]) + encode_string(item[1])
            continue
        out.append(ident)
        if wire == BYTE:
            out.append(value)
        elif wire == U16:
            out += _U16.pack(value)
        elif wire == U32:
            out += _U32.pack(value)
        elif wire == VARINT:
            out += encode_varint(value)
        elif wire == UTF8:
            out += encode_string(value)
        else:
            out += encode_binary(value)
    return bytes(out)


def encode_property_block(props: Properties | None) -> bytes:
    raw = encode_properties(props)
    return encode_varint(len(raw)) + raw


# -- primitive decoders: (buffer, position) -> (value, new position) ----------------------------
def decode_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    value = 0
    shift = 0
    for i in range(4):
        if pos >= len(buf):
            raise MalformedPacket("truncated variable byte integer")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise MalformedPacket("variable byte integer longer than 4 bytes")


def decode_u16(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    if pos + 2 > len(buf):
        raise MalformedPacket("truncated two byte integer")
    return (buf[pos] << 8) | buf[pos + 1], pos + 2


def decode_binary(buf: bytes | memoryview, pos: int) -> tuple[bytes, int]:
    length, pos = decode_u16(buf, pos)
    end = pos + length
    if end > len(buf):
        raise MalformedPacket("truncated binary data or string")
    return bytes(buf[pos:end]), end


def decode_string(buf: bytes | memoryview, pos: int) -> tuple[str, int]:
    raw, pos = decode_binary(buf, pos)
    try:
        text = raw.decode("utf-8")  # strict: rejects ill-formed UTF-8 and surrogates
    except UnicodeDecodeError as exc:
        raise MalformedPacket(f"a string is not well-formed UTF-8: {exc.reason}") from None
    if "\x00" in text:
        raise MalformedPacket("a string contains U+0000")
    return text, pos


def decode_properties(buf: bytes | memoryview, pos: int, kind: str) -> tuple[Properties, int]:
    """Read a property block (with its length) that packet ``kind`` may carry."""
    length, pos = decode_varint(buf, pos)
    if length == 0:
        return EMPTY_PROPERTIES, pos
    end = pos + length
    if end > len(buf):
        raise MalformedPacket("property length beyond the packet")
    props = Properties()
    seen: set[int] = set()
    while pos < end:
        ident, pos = decode_varint(buf, pos)
        entry = PROPERTY_TABLE.get(ident)
        if entry is None or kind not in entry[2]:
            raise MalformedPacket(f"property 0x{ident:02X} is not valid in {kind.upper()}")
        name, wire, _ = entry
        if ident in seen and name not in _REPEATABLE:
            raise ProtocolViolation(f"property {name} appears twice")
        seen.add(ident)
        value: Any
        if wire == BYTE:
            if pos >= end:
                raise MalformedPacket("truncated byte property")
            value = buf[pos]
            pos += 1
        elif wire == U16:
            value, pos = decode_u16(buf, pos)
        elif wire == U32:
            if pos + 4 > end:
                raise MalformedPacket("truncated four byte integer")
            value = _U32.unpack_from(buf, pos)[0]
            pos += 4
        elif wire == VARINT:
            value, pos = decode_varint(buf, pos)
        elif wire == UTF8:
            value, pos = decode_string(buf, pos)
        elif wire == BINARY:
            value, pos = decode_binary(buf, pos)
        else:
            key, pos = decode_string(buf, pos)
            text, pos = decode_string(buf, pos)
            value = (key, text)
        if pos > end:
            raise MalformedPacket("a property runs past the property block")
        if name in _BOOLEAN_BYTES and value > 1:
            raise ProtocolViolation(f"property {name} must be 0 or 1, not {value}")
        if name in _NON_ZERO and value == 0:
            raise ProtocolViolation(f"property {name} must not be 0")
        if name in _REPEATABLE:
            getattr(props, name).append(value)
        else:
            setattr(props, name, value)
    return props, end
