"""AMQP 0-9-1 frame reader without I/O: ``FrameReader`` is fed bytes and yields the events of
``frames`` (the protocol header, methods, whole messages, heartbeats). A compiled module
(Cython's pure-Python mode, see docs/compiled.md).

The publish hot path (basic.publish, its content header, its body frames) is read straight
from the buffer, and the properties are kept as the client encoded them (decoded only when
something asks). Every other frame, and any publish frame the fast path does not take (odd,
damaged, or merely unusual), goes to pamqp, which decodes it or raises the error reported: the
fast path only takes what pamqp would decode to the same values, so both give the same events
and the same errors.
"""

from __future__ import annotations

from collections.abc import Iterator

import cython
from pamqp import commands
from pamqp import exceptions as pexc
from pamqp import frame as pframe
from pamqp import header as pheader

from .frames import (
    COMMAND_INVALID,
    FRAME_BODY,
    FRAME_END,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_OVERHEAD,
    PRECONDITION_FAILED,
    PROTOCOL_HEADER,
    SYNTAX_ERROR,
    UNEXPECTED_FRAME,
    AMQPError,
    ContentReceived,
    Event,
    HeartbeatReceived,
    MethodReceived,
    ProtocolHeaderReceived,
    channel_error,
    connection_error,
)

_PUBLISH = commands.Basic.Publish
_ACK = commands.Basic.Ack
_CHANNEL_OPEN = commands.Channel.Open
_NEW = object.__new__
# property flags of basic's content header, in the order of its property list (bit 15 first)
_SHORTSTR, _TABLE, _OCTET, _TIMESTAMP = 1, 2, 3, 4
_PROPERTY_TYPES = (_SHORTSTR, _SHORTSTR, _TABLE, _OCTET, _OCTET, _SHORTSTR, _SHORTSTR, _SHORTSTR, _SHORTSTR,
                   _TIMESTAMP, _SHORTSTR, _SHORTSTR, _SHORTSTR, _SHORTSTR)
_DELIVERY_MODE_FLAG, _MESSAGE_ID_FLAG = 0x1000, 0x0080
# Field values of a table or array taken by the fast path, and their fixed sizes (-1: sized
# by a length, decoded without error whatever their bytes; -2: nested; -3: timestamp).
_FIXED_VALUE_SIZES = {ord("t"): 1, ord("b"): 1, ord("B"): 1, ord("s"): 2, ord("u"): 2, ord("I"): 4, ord("i"): 4,
                      ord("l"): 8, ord("L"): 8, ord("f"): 4, ord("d"): 8, ord("D"): 5, ord("V"): 0, 0: 0}
_MAX_NESTING = 16  # deeper tables go to pamqp (its recursion decides)
# pamqp turns a timestamp into a datetime (above 2**32 read as milliseconds); beyond the year
# 9999 that raises. The fast path takes only timestamps that surely decode.
_MAX_TIMESTAMP_MS = 253_402_000_000_000


@cython.cclass
class _Pending:
    """A basic.publish whose content is being received."""

    method: commands.Basic.Publish
    raw_properties: object  # bytes, or None when pamqp decoded them (``properties``)
    properties: object
    delivery_mode: object
    message_id: object
    size: cython.Py_ssize_t  # -1 until the content header
    parts: list
    received: cython.Py_ssize_t

    def __init__(self, method: commands.Basic.Publish) -> None:
        self.method = method
        self.raw_properties = None
        self.properties = None
        self.delivery_mode = None
        self.message_id = None
        self.size = -1
        self.parts = []
        self.received = 0


@cython.cclass
class FrameReader:
    """Server side: the protocol header first, then frames no larger than ``frame_max``.

    Once the framing is broken (a frame too large, no frame-end, a frame that does not decode)
    nothing after it can be trusted: the reader drops every later byte (``failed``), so a peer
    that goes on sending costs no memory. A message whose content header announces more than
    ``max_body`` is refused with a channel error before its body is buffered; the frames of a
    channel being closed by the server are dropped until the client opens it again."""

    _buffer: bytearray
    frame_max = cython.declare(cython.Py_ssize_t, visibility="public")
    max_body = cython.declare(cython.Py_ssize_t, visibility="public")
    failed = cython.declare(cython.bint, visibility="public")
    _header_seen: cython.bint
    _pending: dict
    _dropping: set | None  # channels whose content is dropped (closed by the server); None until the first
    _methods_only: cython.bint  # after connection.close: only close-ok matters

    def __init__(self, frame_max: int = 131_072, max_body: int = 128 << 20) -> None:
        self._buffer = bytearray()
        self.frame_max = frame_max
        self.max_body = max_body
        self.failed = False
        self._header_seen = False
        self._pending = {}
        self._dropping = None  # (an empty set is 216 bytes per connection, and is rarely needed)
        self._methods_only = False

    def feed(self, data: bytes) -> None:
        if not self.failed:
            self._buffer += data

    @property
    def buffered(self) -> int:
        """Bytes held: at most one frame (``frame_max``) plus one read, and half-received messages."""
        held = len(self._buffer)
        for pending in self._pending.values():
            held += cython.cast(_Pending, pending).received
        return held

    @cython.locals(pos=cython.Py_ssize_t, n=cython.Py_ssize_t, size=cython.Py_ssize_t, total=cython.Py_ssize_t,
                   kind=cython.int, channel=cython.int)
    def events(self) -> Iterator[Event]:
        buf: bytearray = self._buffer
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
            while not self.failed:
                n = len(buf)
                if n - pos < 7:
                    return
                kind = buf[pos]
                channel = (buf[pos + 1] << 8) | buf[pos + 2]
                size = buf[pos + 3]
                size = (size << 24) | (buf[pos + 4] << 16) | (buf[pos + 5] << 8) | buf[pos + 6]
                total = size + FRAME_OVERHEAD
                if total > self.frame_max:  # refused from its header, before its payload is read
                    raise self._broken(FRAME_ERROR, f"frame of {total} bytes exceeds frame_max {self.frame_max}")
                if n - pos < total:
                    return
                if buf[pos + total - 1] != FRAME_END:
                    raise self._broken(FRAME_ERROR, "frame does not end with 0xCE")
                pos += total
                event = self._frame(kind, channel, buf, pos - total + 7, pos - 1)
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

    def _unmarshal(self, buf: bytearray, start: cython.Py_ssize_t, end: cython.Py_ssize_t,
                   channel: cython.int) -> object:
        """pamqp's decoding of the frame whose payload is ``buf[start:end]``; its errors break the framing."""
        try:
            return pframe.unmarshal(bytes(buf[start - 7:end + 1]))[2]
        except pexc.UnmarshalingException as exc:
            raise self._broken(FRAME_ERROR if "frame" in str(exc).lower() else SYNTAX_ERROR,
                               f"cannot decode frame: {exc}", channel) from None
        except Exception as exc:  # noqa: BLE001 - pamqp raises what its decoders raise on garbage
            raise self._broken(SYNTAX_ERROR, f"cannot decode frame: {exc!r}", channel) from None

    @cython.locals(pending=_Pending, body_size=cython.ulonglong)
    def _frame(self, kind: cython.int, channel: cython.int, buf: bytearray, start: cython.Py_ssize_t,
               end: cython.Py_ssize_t) -> Event | None:
        if kind == FRAME_HEARTBEAT:
            if channel != 0:
                raise connection_error(FRAME_ERROR, "heartbeat on a channel other than 0")
            return HeartbeatReceived()
        if kind != FRAME_METHOD and kind != FRAME_HEADER and kind != FRAME_BODY:
            raise self._broken(FRAME_ERROR, f"unknown frame type {kind}")
        if kind != FRAME_METHOD and (self._methods_only or (self._dropping is not None and channel in self._dropping)):
            return None  # content of a channel (or connection) the server is closing
        found = self._pending.get(channel)
        if kind == FRAME_METHOD:
            value = _publish(buf, start, end)
            if value is None:
                value = _ack(buf, start, end)
                if value is None:
                    value = self._unmarshal(buf, start, end, channel)
            if found is not None:
                raise connection_error(UNEXPECTED_FRAME, "method frame in the middle of content", channel)
            if isinstance(value, _PUBLISH):
                if channel == 0:
                    raise connection_error(COMMAND_INVALID, "basic.publish on channel 0", channel, value)
                if not (self._methods_only or (self._dropping is not None and channel in self._dropping)):
                    self._pending[channel] = _Pending(value)
                return None
            if isinstance(value, _CHANNEL_OPEN) and self._dropping is not None:
                self._dropping.discard(channel)
            return MethodReceived(channel, value)
        if kind == FRAME_HEADER:
            header = _content_header(buf, start, end)
            decoded = None
            if header is None:
                decoded = self._unmarshal(buf, start, end, channel)
            if found is None:
                raise connection_error(UNEXPECTED_FRAME, "content frame without a content method", channel)
            pending = found
            if pending.size >= 0:
                raise connection_error(UNEXPECTED_FRAME, "second content header", channel)
            if header is not None:
                body_size, pending.raw_properties, pending.delivery_mode, pending.message_id = header
            else:
                assert isinstance(decoded, pheader.ContentHeader)
                body_size = decoded.body_size
                pending.properties = decoded.properties
                pending.delivery_mode = decoded.properties.delivery_mode
                pending.message_id = decoded.properties.message_id
            if body_size > cython.cast(cython.ulonglong, self.max_body):
                # as RabbitMQ (rabbit_channel:check_msg_size): the channel is closed with 406;
                # its body frames are dropped, never buffered
                self.forget_channel(channel)
                raise channel_error(PRECONDITION_FAILED, f"message size {body_size} is larger than "
                                    f"configured max size {self.max_body}", channel, pending.method)
            pending.size = body_size
        else:
            if end == start:
                self._unmarshal(buf, start, end, channel)  # an empty frame: pamqp refuses it
            if found is None:
                raise connection_error(UNEXPECTED_FRAME, "content frame without a content method", channel)
            pending = found
            if pending.size < 0:
                raise connection_error(UNEXPECTED_FRAME, "content body before its header", channel)
            pending.parts.append(bytes(buf[start:end]))
            pending.received += end - start
            if pending.received > pending.size:
                raise connection_error(FRAME_ERROR, "content body longer than its header said", channel)
        if pending.received == pending.size:
            del self._pending[channel]
            parts = pending.parts
            body = parts[0] if len(parts) == 1 else b"".join(parts)
            return ContentReceived(channel, pending.method, body, pending.raw_properties, pending.properties,
                                   pending.delivery_mode, pending.message_id)
        return None

    def forget_channel(self, channel: int) -> None:
        """The server closes ``channel``: drop its half-received message and the content frames
        the client sends on it until it opens the channel again (spec 2.2.5: discarded until
        close-ok)."""
        self._pending.pop(channel, None)
        if self._dropping is None:
            self._dropping = set()
        self._dropping.add(channel)

    def client_closed_channel(self, channel: int) -> None:
        """The client closed ``channel`` itself: nothing more comes on it until it is opened."""
        self._pending.pop(channel, None)

    def methods_only(self) -> None:
        """After connection.close is sent only close-ok matters: content is dropped unread."""
        self._methods_only = True
        self._pending.clear()


# -- the fast path ------------------------------------------------------------------------------
# Each returns None for whatever it does not take; pamqp then decodes the frame (the reference).


@cython.cfunc
@cython.locals(i=cython.Py_ssize_t)
def _utf8(buf: bytearray, start: cython.Py_ssize_t, stop: cython.Py_ssize_t) -> cython.bint:
    """Whether ``buf[start:stop]`` decodes as UTF-8 (as pamqp decodes a short string)."""
    if cython.compiled:
        for i in range(start, stop):
            if buf[i] >= 0x80:
                break
        else:
            return True  # ASCII, without a copy
    try:
        buf[start:stop].decode()
    except UnicodeDecodeError:
        return False
    return True


@cython.cfunc
@cython.locals(n=cython.Py_ssize_t, pos=cython.Py_ssize_t, exchange_end=cython.Py_ssize_t, key_end=cython.Py_ssize_t,
               bits=cython.int)
def _publish(buf: bytearray, start: cython.Py_ssize_t, end: cython.Py_ssize_t) -> object:
    """basic.publish: class 60, method 40, ticket, exchange, routing key, mandatory/immediate bits."""
    if end - start < 4 or buf[start] != 0 or buf[start + 1] != 60 or buf[start + 2] != 0 or buf[start + 3] != 40:
        return None
    pos = start + 6  # past the ticket (pamqp does not check it)
    if pos >= end:
        return None
    exchange_end = pos + 1 + buf[pos]
    if exchange_end >= end:
        return None
    key_end = exchange_end + 1 + buf[exchange_end]
    if key_end + 1 != end:  # the bits octet last, nothing after it
        return None
    if not (_utf8(buf, pos + 1, exchange_end) and _utf8(buf, exchange_end + 1, key_end)):
        return None
    bits = buf[key_end]
    method = _NEW(_PUBLISH)  # (its __init__ validates, pamqp's decoding does not)
    method.ticket = (buf[start + 4] << 8) | buf[start + 5]
    method.exchange = buf[pos + 1:exchange_end].decode()
    method.routing_key = buf[exchange_end + 1:key_end].decode()
    method.mandatory = bool(bits & 1)
    method.immediate = bool(bits & 2)
    return method


@cython.cfunc
def _ack(buf: bytearray, start: cython.Py_ssize_t, end: cython.Py_ssize_t) -> object:
    """basic.ack: class 60, method 80, delivery tag, the multiple bit (a consumer may send one a
    delivery). A tag with its top bit set (pamqp reads it signed) is left to pamqp."""
    if (end - start != 13 or buf[start] != 0 or buf[start + 1] != 60 or buf[start + 2] != 0 or buf[start + 3] != 80
            or buf[start + 4] & 0x80):
        return None
    method = _NEW(_ACK)  # (its __init__ validates, pamqp's decoding does not)
    method.delivery_tag = _u64(buf, start + 4)
    method.multiple = bool(buf[start + 12] & 1)
    return method


@cython.cfunc
@cython.locals(i=cython.int, v=cython.ulonglong)
def _u64(buf: bytearray, pos: cython.Py_ssize_t) -> cython.ulonglong:
    v = 0
    for i in range(8):
        v = (v << 8) | buf[pos + i]
    return v


@cython.cfunc
@cython.locals(flags=cython.int, pos=cython.Py_ssize_t, bit=cython.int, kind=cython.int, stop=cython.Py_ssize_t,
               body_size=cython.ulonglong)
def _content_header(buf: bytearray, start: cython.Py_ssize_t, end: cython.Py_ssize_t) -> object:
    """(body size, the encoded properties, delivery mode, message id) of a content header."""
    if end - start < 14:
        return None
    body_size = _u64(buf, start + 4)
    flags = (buf[start + 12] << 8) | buf[start + 13]
    if flags & 0x0003:  # a continuation or reserved bit: pamqp ignores them, the raw form would not
        return None
    delivery_mode = message_id = None
    pos = start + 14
    for bit in range(14):
        if not flags & (0x8000 >> bit):
            continue
        kind = _PROPERTY_TYPES[bit]
        if kind == _SHORTSTR:
            if pos >= end:
                return None
            stop = pos + 1 + buf[pos]
            if stop > end or not _utf8(buf, pos + 1, stop):
                return None
            if bit == 8:  # message_id
                message_id = buf[pos + 1:stop].decode()
            pos = stop
        elif kind == _OCTET:
            if pos >= end:
                return None
            if bit == 3:  # delivery_mode
                delivery_mode = buf[pos]
            pos += 1
        elif kind == _TIMESTAMP:
            if pos + 8 > end or not _timestamp_ok(buf, pos):
                return None
            pos += 8
        else:
            pos = _table(buf, pos, end, 0)
            if pos < 0:
                return None
    if pos != end:  # bytes after the properties: pamqp ignores them
        return None
    return body_size, bytes(buf[start + 12:end]), delivery_mode, message_id


@cython.cfunc
@cython.locals(v=cython.ulonglong)
def _timestamp_ok(buf: bytearray, pos: cython.Py_ssize_t) -> cython.bint:
    v = _u64(buf, pos)
    return v <= 0xFFFFFFFF or v <= _MAX_TIMESTAMP_MS


@cython.cfunc
@cython.locals(length=cython.Py_ssize_t, stop=cython.Py_ssize_t, key_end=cython.Py_ssize_t)
def _table(buf: bytearray, pos: cython.Py_ssize_t, end: cython.Py_ssize_t, depth: cython.int) -> cython.Py_ssize_t:
    """The end of the field table at ``pos``, or -1: not one the fast path takes."""
    length = _u32(buf, pos, end)
    if length < 0:
        return -1
    pos += 4
    stop = pos + length
    if stop > end or depth > _MAX_NESTING:
        return -1
    while pos < stop:
        key_end = pos + 1 + buf[pos]
        if key_end >= stop or not _utf8(buf, pos + 1, key_end):
            return -1
        pos = _value(buf, key_end, stop, depth)
        if pos < 0:
            return -1
    return stop if pos == stop else -1


@cython.cfunc
@cython.locals(length=cython.Py_ssize_t, stop=cython.Py_ssize_t)
def _array(buf: bytearray, pos: cython.Py_ssize_t, end: cython.Py_ssize_t, depth: cython.int) -> cython.Py_ssize_t:
    length = _u32(buf, pos, end)
    if length < 0:
        return -1
    pos += 4
    stop = pos + length
    if stop > end or depth > _MAX_NESTING:
        return -1
    while pos < stop:
        pos = _value(buf, pos, stop, depth)
        if pos < 0:
            return -1
    return stop if pos == stop else -1


@cython.cfunc
@cython.locals(kind=cython.int, size=cython.Py_ssize_t)
def _value(buf: bytearray, pos: cython.Py_ssize_t, stop: cython.Py_ssize_t, depth: cython.int) -> cython.Py_ssize_t:
    """The end of the typed field value at ``pos`` (its type octet), or -1."""
    kind = buf[pos]
    pos += 1
    fixed = _FIXED_VALUE_SIZES.get(kind)
    if fixed is not None:
        size = fixed
    elif kind == 0x53 or kind == 0x78:  # 'S' long string (bytes if not UTF-8), 'x' byte array
        size = _u32(buf, pos, stop)
        if size < 0:
            return -1
        size += 4
    elif kind == 0x54:  # 'T' timestamp
        if pos + 8 > stop or not _timestamp_ok(buf, pos):
            return -1
        size = 8
    elif kind == 0x46:  # 'F' table
        return _table(buf, pos, stop, depth + 1)
    elif kind == 0x41:  # 'A' array
        return _array(buf, pos, stop, depth + 1)
    else:
        return -1
    return pos + size if pos + size <= stop else -1


@cython.cfunc
@cython.locals(v=cython.Py_ssize_t)
def _u32(buf: bytearray, pos: cython.Py_ssize_t, end: cython.Py_ssize_t) -> cython.Py_ssize_t:
    """The unsigned 32-bit length at ``pos``, or -1 if it does not fit before ``end``."""
    if pos + 4 > end:
        return -1
    v = buf[pos]
    return (v << 24) | (buf[pos + 1] << 16) | (buf[pos + 2] << 8) | buf[pos + 3]
