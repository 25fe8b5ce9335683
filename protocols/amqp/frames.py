"""AMQP 0-9-1 framing without I/O: the reply codes and protocol errors, the events that
``reader.FrameReader`` yields (the protocol header, methods, whole messages, heartbeats), and
the frames the server writes (``method_frame``, ``content_frames``, the delivery hot path).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp import heartbeat as pheartbeat
from pamqp.base import Frame

from . import pamqp_guards

pamqp_guards.install()  # before anything decodes: see there

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE
FRAME_OVERHEAD = 8  # 7-byte frame header + frame-end octet
MIN_FRAME_MAX = 4096
HEADERS_FLAG = 0x20  # the headers property: bit 13 of the (big-endian) property flags, in their first byte
REPLY_TO_FLAG = 0x02  # reply-to: bit 9, in their first byte
EXPIRATION_FLAG = 0x01  # expiration: bit 8, in their first byte

# reply codes (AMQP 0-9-1 section 1.1 constants)
REPLY_SUCCESS = 200
CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
NO_CONSUMERS = 313
CONNECTION_FORCED = 320
INVALID_PATH = 402
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541


REPLY_NAMES = {
    REPLY_SUCCESS: "OK", CONTENT_TOO_LARGE: "CONTENT_TOO_LARGE", NO_ROUTE: "NO_ROUTE", NO_CONSUMERS: "NO_CONSUMERS",
    CONNECTION_FORCED: "CONNECTION_FORCED", INVALID_PATH: "INVALID_PATH", ACCESS_REFUSED: "ACCESS_REFUSED",
    NOT_FOUND: "NOT_FOUND", RESOURCE_LOCKED: "RESOURCE_LOCKED", PRECONDITION_FAILED: "PRECONDITION_FAILED",
    FRAME_ERROR: "FRAME_ERROR", SYNTAX_ERROR: "SYNTAX_ERROR", COMMAND_INVALID: "COMMAND_INVALID",
    CHANNEL_ERROR: "CHANNEL_ERROR", UNEXPECTED_FRAME: "UNEXPECTED_FRAME", RESOURCE_ERROR: "RESOURCE_ERROR",
    NOT_ALLOWED: "NOT_ALLOWED", NOT_IMPLEMENTED: "NOT_IMPLEMENTED", INTERNAL_ERROR: "INTERNAL_ERROR",
}


class AMQPError(Exception):
    """A protocol error with its reply code. ``connection`` errors close the whole connection
    (connection.close); the others close only the channel (channel.close)."""

    def __init__(self, reply_code: int, text: str, *, connection: bool, channel: int = 0,
                 method: Frame | None = None) -> None:
        super().__init__(text)
        self.reply_code = reply_code
        self.text = text
        self.connection = connection
        self.channel = channel
        self.method = method  # the method that failed (its class and method ids go in the close)

    def close_arguments(self) -> tuple[int, str, int, int]:
        """reply-code, reply-text (as RabbitMQ: the code's name first), class-id, method-id of
        the channel.close or connection.close that reports it."""
        index = getattr(self.method, "index", 0) or 0
        text = f"{REPLY_NAMES.get(self.reply_code, str(self.reply_code))} - {self.text}"[:255]
        return self.reply_code, text, index >> 16, index & 0xFFFF


def connection_error(code: int, text: str, channel: int = 0, method: Frame | None = None) -> AMQPError:
    return AMQPError(code, text, connection=True, channel=channel, method=method)


def channel_error(code: int, text: str, channel: int, method: Frame | None = None) -> AMQPError:
    return AMQPError(code, text, connection=False, channel=channel, method=method)


@dataclass(slots=True)
class ProtocolHeaderReceived:
    ok: bool  # False: not AMQP 0-9-1; answer with our header and close


@dataclass(slots=True)
class MethodReceived:
    channel: int
    method: Frame


class ContentReceived:
    """A method that carries content (basic.publish from a client), with its properties and body.

    The properties stay as the client encoded them (``raw_properties``: the content header's
    flags and property list) until something asks for ``properties``: storing and delivering a
    message copies the bytes. ``delivery_mode`` and ``message_id``, which every publish needs,
    are read in passing. A content header the reader had pamqp decode gives ``properties``
    instead (and its bytes are encoded again when asked for)."""

    __slots__ = ("_properties", "_raw", "body", "channel", "delivery_mode", "message_id", "method")

    def __init__(self, channel: int, method: commands.Basic.Publish, body: bytes, raw_properties: bytes | None,
                 properties: commands.Basic.Properties | None = None, delivery_mode: int | None = None,
                 message_id: str | None = None) -> None:
        if raw_properties is None and properties is None:
            raise ValueError("ContentReceived needs its properties, encoded or decoded")
        self.channel = channel
        self.method = method
        self.body = body
        self._raw = raw_properties
        self._properties = properties
        self.delivery_mode = delivery_mode
        self.message_id = message_id

    @property
    def raw_properties(self) -> bytes:
        if self._raw is None:
            self._raw = encode_properties(self._properties)  # type: ignore[arg-type]  # (one of the two is set)
        return self._raw

    @property
    def properties(self) -> commands.Basic.Properties:
        if self._properties is None:
            self._properties = decode_properties(self._raw)  # type: ignore[arg-type]  # (one of the two is set)
        return self._properties

    @property
    def headers(self) -> dict | None:
        """The headers property (None without decoding the others when the flags say it is absent)."""
        if self._properties is None and not self._raw[0] & HEADERS_FLAG:  # type: ignore[index]  # (one of the two is set)
            return None
        return self.properties.headers

    @property
    def expiration(self) -> str | None:
        """The expiration property (None, undecoded, when the flags say it is absent)."""
        if self._properties is None and not self._raw[0] & EXPIRATION_FLAG:  # type: ignore[index]  # (one of the two is set)
            return None
        return self.properties.expiration

    @property
    def reply_to(self) -> str | None:
        """The reply-to property (None, undecoded, when the flags say it is absent)."""
        if self._properties is None and not self._raw[0] & REPLY_TO_FLAG:  # type: ignore[index]  # (one of the two is set)
            return None
        return self.properties.reply_to

    def set_reply_to(self, reply_to: str) -> None:
        """Rewrite the reply-to property (its encoded properties are made again)."""
        self.properties.reply_to = reply_to
        self._raw = None

    def __repr__(self) -> str:
        return (f"ContentReceived(channel={self.channel}, method={self.method!r}, body={self.body!r}, "
                f"raw_properties={self.raw_properties!r})")


@dataclass(slots=True)
class HeartbeatReceived:
    pass


Event = ProtocolHeaderReceived | MethodReceived | ContentReceived | HeartbeatReceived


def method_frame(channel: int, method: Frame) -> bytes:
    return pframe.marshal(method, channel)


def content_frames(channel: int, method: Frame, properties: commands.Basic.Properties, body: bytes,
                   frame_max: int) -> bytes:
    """A content-bearing method (basic.deliver / get-ok / return) with its header and body frames."""
    return pframe.marshal(method, channel) + content_after_method(channel, encode_properties(properties), body,
                                                                    frame_max)


# -- the delivery hot path ----------------------------------------------------------------------
# Every message a consumer gets is basic.deliver + content header + body. pamqp's generic
# marshalling builds objects and walks field specs for each (about a third of a delivery's
# CPU, measured with py-spy); these three build the same bytes directly, the properties from
# the encoded form kept since publish, so a delivery encodes nothing but its tags.
_CONTENT_HEADER_PREFIX = struct.Struct(">BHIHHQ")  # frame type, channel, size, class, weight, body size
_DELIVER_HEAD = struct.Struct(">BHI")
_BASIC_DELIVER = struct.pack(">HH", 60, 60)
_FRAME_END_BYTE = bytes((FRAME_END,))


def encode_properties(properties: commands.Basic.Properties) -> bytes:
    """Basic properties as a content header carries them (flags and list), for
    ``content_after_method``; ``decode_properties`` reads them back."""
    return pheader.ContentHeader(0, 0, properties).marshal()[12:]


def decode_properties(raw: bytes) -> commands.Basic.Properties:
    header = pheader.ContentHeader()
    header.unmarshal(struct.pack(">HHQ", 60, 0, 0) + raw)
    return header.properties


def copy_properties(properties: commands.Basic.Properties) -> commands.Basic.Properties:
    """A new Properties with the same values (to change one, as a delivery or a dead letter does)."""
    values: dict[str, Any] = dict(properties)  # (each field as its own type: pamqp's __iter__ types none)
    return commands.Basic.Properties(**values)


def shortstr(text: str) -> bytes:
    """An AMQP short string: a length octet and the UTF-8 bytes (at most 255)."""
    raw = text.encode()
    if len(raw) > 255:
        raise ValueError("a short string is at most 255 bytes")
    return bytes((len(raw),)) + raw

# What a whole delivery packs around its variable parts: basic.deliver's frame head with its
# class and method ids; the delivery tag and redelivered octet; the method's frame end with the
# content header's frame head and fixed fields; the header's frame end with the body's frame head.
_DELIVER_METHOD_HEAD = struct.Struct(">BHIHH")
_TAG_REDELIVERED = struct.Struct(">QB")
_END_HEADER_HEAD = struct.Struct(">BBHIHHQ")
_END_BODY_HEAD = struct.Struct(">BBHI")


def deliver_frame(channel: int, consumer_tag: str, delivery_tag: int, redelivered: bool, exchange: str,
                  routing_key: str) -> bytes:
    """basic.deliver, byte for byte as pamqp writes it."""
    payload = b"".join((_BASIC_DELIVER, shortstr(consumer_tag), struct.pack(">QB", delivery_tag, redelivered),
                        shortstr(exchange), shortstr(routing_key)))
    return _DELIVER_HEAD.pack(FRAME_METHOD, channel, len(payload)) + payload + _FRAME_END_BYTE


def content_after_method(channel: int, raw_properties: bytes, body: bytes, frame_max: int) -> bytes:
    """The content header (properties already encoded) and body frames of one message."""
    parts = [_CONTENT_HEADER_PREFIX.pack(FRAME_HEADER, channel, 12 + len(raw_properties), 60, 0, len(body)),
             raw_properties, _FRAME_END_BYTE]
    step = frame_max - FRAME_OVERHEAD
    for start in range(0, len(body), step):
        chunk = body[start:start + step]
        parts += (_DELIVER_HEAD.pack(FRAME_BODY, channel, len(chunk)), chunk, _FRAME_END_BYTE)
    return b"".join(parts)


def delivery(channel: int, consumer_tag: bytes, delivery_tag: int, redelivered: bool, route: bytes,
             raw_properties: bytes, body: bytes, frame_max: int) -> bytes:
    """One whole delivery: basic.deliver, its content header and body frames, the same bytes as
    ``deliver_frame`` + ``content_after_method``; ``consumer_tag`` is already a short string and
    ``route`` the exchange's and routing key's short strings (both encoded once, not per message)."""
    size = len(body)
    if not 0 < size <= frame_max - FRAME_OVERHEAD:
        return (_DELIVER_METHOD_HEAD.pack(FRAME_METHOD, channel, 13 + len(consumer_tag) + len(route), 60, 60)
                + consumer_tag + _TAG_REDELIVERED.pack(delivery_tag, redelivered) + route + _FRAME_END_BYTE
                + content_after_method(channel, raw_properties, body, frame_max))
    return b"".join((
        _DELIVER_METHOD_HEAD.pack(FRAME_METHOD, channel, 13 + len(consumer_tag) + len(route), 60, 60),
        consumer_tag, _TAG_REDELIVERED.pack(delivery_tag, redelivered), route,
        _END_HEADER_HEAD.pack(FRAME_END, FRAME_HEADER, channel, 12 + len(raw_properties), 60, 0, size),
        raw_properties, _END_BODY_HEAD.pack(FRAME_END, FRAME_BODY, channel, size), body, _FRAME_END_BYTE))


HEARTBEAT_FRAME = pframe.marshal(pheartbeat.Heartbeat(), 0)
