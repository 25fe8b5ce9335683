"""The AMQP frame reader as it was before the compiled fast path (commit b771774's
protocols/amqp/frames.py): every frame decoded by pamqp, the properties decoded. A test oracle
only: tests/test_native_amqp.py checks that both builds of ``protocols.amqp.reader`` give the
events and the protocol errors (reply code, text, channel) this gave, on valid and damaged input."""

# ruff: noqa
from __future__ import annotations

import struct
from dataclasses import dataclass

from pamqp import body as pbody
from pamqp import commands
from pamqp import exceptions as pexc
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp.base import Frame

from protocols.amqp.frames import (
    COMMAND_INVALID, FRAME_BODY, FRAME_END, FRAME_ERROR, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD,
    FRAME_OVERHEAD, PRECONDITION_FAILED, PROTOCOL_HEADER, SYNTAX_ERROR, UNEXPECTED_FRAME, AMQPError,
    HeartbeatReceived, MethodReceived, ProtocolHeaderReceived, channel_error, connection_error,
)

_FRAME_HEAD = struct.Struct(">BHI")


@dataclass(slots=True)
class OldContentReceived:
    channel: int
    method: Frame
    properties: commands.Basic.Properties
    body: bytes


@dataclass(slots=True)
class _Pending:
    method: Frame
    properties: commands.Basic.Properties | None = None
    size: int = -1
    parts: list[bytes] | None = None
    received: int = 0


class ReferenceFrameReader:
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
            return OldContentReceived(channel, pending.method, pending.properties, body)  # type: ignore[arg-type]
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


