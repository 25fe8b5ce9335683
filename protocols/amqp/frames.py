"""AMQP 0-9-1 framing without I/O: ``FrameReader`` is fed bytes and yields events (the protocol
header, methods, whole messages, heartbeats); ``method_frame`` / ``content_frames`` build bytes.
pamqp encodes and decodes the frames themselves; this module adds what it leaves to the caller:
the frame size limit, the frame-end check, and gathering publish + header + body frames.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from pamqp import body as pbody
from pamqp import commands
from pamqp import exceptions as pexc
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp import heartbeat as pheartbeat
from pamqp.base import Frame

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE
FRAME_OVERHEAD = 8  # 7-byte frame header + frame-end octet
MIN_FRAME_MAX = 4096
_FRAME_HEAD = struct.Struct(">BHI")

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


@dataclass(slots=True)
class ContentReceived:
    """A method that carries content (basic.publish from a client), with its properties and body."""

    channel: int
    method: Frame
    properties: commands.Basic.Properties
    body: bytes


@dataclass(slots=True)
class HeartbeatReceived:
    pass


Event = ProtocolHeaderReceived | MethodReceived | ContentReceived | HeartbeatReceived


@dataclass(slots=True)
class _Pending:
    method: Frame
    properties: commands.Basic.Properties | None = None
    size: int = -1
    parts: list[bytes] | None = None
    received: int = 0


class FrameReader:
    """Server side: the protocol header first, then frames no larger than ``frame_max``.

    Once the framing is broken (a frame too large, no frame-end, a frame that does not decode)
    nothing after it can be trusted: the reader drops every later byte (``failed``), so a peer
    that goes on sending costs no memory. A message whose content header announces more than
    ``max_body`` is refused with a channel error before its body is buffered; the frames of a
    channel being closed by the server are dropped until the client opens it again."""

    def __init__(self, frame_max: int = 131_072, max_body: int = 128 << 20) -> None:
        self._buffer = bytearray()
        self.frame_max = frame_max
        self.max_body = max_body
        self.failed = False
        self._header_seen = False
        self._pending: dict[int, _Pending] = {}
        self._dropping: set[int] = set()  # channels whose content is dropped (closed by the server)
        self._methods_only = False  # after connection.close: only close-ok matters

    def feed(self, data: bytes) -> None:
        if not self.failed:
            self._buffer += data

    @property
    def buffered(self) -> int:
        """Bytes held: at most one frame (``frame_max``) plus one read, and half-received messages."""
        return len(self._buffer) + sum(p.received for p in self._pending.values())

    def events(self):
        buf = self._buffer
        pos = 0
        try:
            if not self._header_seen:
                if len(buf) < 8:
                    return
                pos = 8
                self._header_seen = True
                ok = bytes(buf[:8]) == PROTOCOL_HEADER
                yield ProtocolHeaderReceived(ok)
                if not ok:
                    return
            while len(buf) - pos >= 7 and not self.failed:
                kind, channel, size = _FRAME_HEAD.unpack_from(buf, pos)
                total = size + FRAME_OVERHEAD
                if total > self.frame_max:  # refused from its header, before its payload is read
                    raise self._broken(FRAME_ERROR, f"frame of {total} bytes exceeds frame_max {self.frame_max}")
                if len(buf) - pos < total:
                    return
                if buf[pos + total - 1] != FRAME_END:
                    raise self._broken(FRAME_ERROR, "frame does not end with 0xCE")
                data = bytes(buf[pos:pos + total])
                pos += total
                event = self._frame(kind, channel, data)
                if event is not None:
                    yield event
        finally:
            if self.failed:
                buf.clear()
            else:
                del buf[:pos]

    def _broken(self, code: int, text: str, channel: int = 0) -> AMQPError:
        self.failed = True
        self._pending.clear()
        return connection_error(code, text, channel)

    def _frame(self, kind: int, channel: int, data: bytes) -> Event | None:
        if kind == FRAME_HEARTBEAT:
            if channel != 0:
                raise connection_error(FRAME_ERROR, "heartbeat on a channel other than 0")
            return HeartbeatReceived()
        if kind not in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY):
            raise self._broken(FRAME_ERROR, f"unknown frame type {kind}")
        if kind != FRAME_METHOD and (self._methods_only or channel in self._dropping):
            return None  # content of a channel (or connection) the server is closing
        try:
            _, _, value = pframe.unmarshal(data)
        except pexc.UnmarshalingException as exc:
            raise self._broken(FRAME_ERROR if "frame" in str(exc).lower() else SYNTAX_ERROR,
                               f"cannot decode frame: {exc}", channel) from None
        except Exception as exc:  # pamqp raises what its decoders raise on garbage
            raise self._broken(SYNTAX_ERROR, f"cannot decode frame: {exc!r}", channel) from None
        pending = self._pending.get(channel)
        if kind == FRAME_METHOD:
            if pending is not None:
                raise connection_error(UNEXPECTED_FRAME, "method frame in the middle of content", channel)
            if isinstance(value, commands.Basic.Publish):
                if channel == 0:
                    raise connection_error(COMMAND_INVALID, "basic.publish on channel 0", channel, value)
                if not (self._methods_only or channel in self._dropping):
                    self._pending[channel] = _Pending(value)
                return None
            if isinstance(value, commands.Channel.Open):
                self._dropping.discard(channel)
            return MethodReceived(channel, value)
        if pending is None:
            raise connection_error(UNEXPECTED_FRAME, "content frame without a content method", channel)
        if kind == FRAME_HEADER:
            if pending.size >= 0:
                raise connection_error(UNEXPECTED_FRAME, "second content header", channel)
            assert isinstance(value, pheader.ContentHeader)
            if value.body_size > self.max_body:
                # as RabbitMQ (rabbit_channel:check_msg_size): the channel is closed with 406;
                # its body frames are dropped, never buffered
                self.forget_channel(channel)
                raise channel_error(PRECONDITION_FAILED, f"message size {value.body_size} is larger than "
                                    f"configured max size {self.max_body}", channel, pending.method)
            pending.properties = value.properties
            pending.size = value.body_size
            pending.parts = []
        else:
            if pending.size < 0:
                raise connection_error(UNEXPECTED_FRAME, "content body before its header", channel)
            assert isinstance(value, pbody.ContentBody) and pending.parts is not None
            pending.parts.append(value.value)
            pending.received += len(value.value)
            if pending.received > pending.size:
                raise connection_error(FRAME_ERROR, "content body longer than its header said", channel)
        if pending.received == pending.size:
            del self._pending[channel]
            body = pending.parts[0] if len(pending.parts or ()) == 1 else b"".join(pending.parts or ())
            return ContentReceived(channel, pending.method, pending.properties, body)  # type: ignore[arg-type]
        return None

    def forget_channel(self, channel: int) -> None:
        """The server closes ``channel``: drop its half-received message and the content frames
        the client sends on it until it opens the channel again (spec 2.2.5: discarded until
        close-ok)."""
        self._pending.pop(channel, None)
        self._dropping.add(channel)

    def client_closed_channel(self, channel: int) -> None:
        """The client closed ``channel`` itself: nothing more comes on it until it is opened."""
        self._pending.pop(channel, None)

    def methods_only(self) -> None:
        """After connection.close is sent only close-ok matters: content is dropped unread."""
        self._methods_only = True
        self._pending.clear()


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


def _shortstr(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 255:
        raise ValueError("a short string is at most 255 bytes")
    return bytes((len(raw),)) + raw


def deliver_frame(channel: int, consumer_tag: str, delivery_tag: int, redelivered: bool, exchange: str,
                  routing_key: str) -> bytes:
    """basic.deliver, byte for byte as pamqp writes it."""
    payload = b"".join((_BASIC_DELIVER, _shortstr(consumer_tag), struct.pack(">QB", delivery_tag, redelivered),
                        _shortstr(exchange), _shortstr(routing_key)))
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


HEARTBEAT_FRAME = pframe.marshal(pheartbeat.Heartbeat(), 0)
