"""Raw-socket AMQP 0-9-1 client pieces for the load generator of ``bench_amqp``.

pamqp encodes the frames once (the handshake, the setup methods, one publish: method, content
header and body frames); a publisher then writes that publish N times from one pre-built buffer.
Incoming frames are walked on their boundaries (type octet, channel u16, size u32, payload,
0xCE) and only the methods the hot paths need are read in place: basic.ack / basic.nack
(publisher confirms, with the multiple flag) and basic.deliver + content header + body
(deliveries, acknowledged with one multiple basic.ack per channel and read). Any other method
is decoded by pamqp and kept for ``Conn.rpc`` or reported as unexpected.
"""

from __future__ import annotations

import socket
import struct
import time
from collections import deque
from typing import Any

from pamqp import commands
from pamqp import frame as pframe
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from loadtest.clients.mqtt_wire import HOST, RECV_SIZE, receive
from loadtest.clients.stamps import STAMP, StampLog

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE
FRAME_MAX = 131_072
HEAD = struct.Struct(">BHI")  # frame type, channel, payload size
CLASS_METHOD = struct.Struct(">HH")
U64 = struct.Struct(">Q")
# basic.ack (class 60, method 80) as a whole frame: delivery tag, multiple bit, frame end
ACK = struct.Struct(">BHIHHQBB")
BASIC, ACK_ID, NACK_ID, DELIVER_ID = 60, 80, 120, 60
READS_PER_WAKE = 64  # recv calls per readiness at most (bounded loop)
STAMP_SIZE = STAMP.size


class AMQPClientError(Exception):
    """The broker closed the connection or a channel, refused something or did not answer in time."""


def method_frame(channel: int, method: Any) -> bytes:
    return pframe.marshal(method, channel)


def publish_frames(channel: int, exchange: str, routing_key: str, body: bytes, persistent: bool = True) -> bytes:
    """One basic.publish with its content header (delivery_mode 2 if persistent) and body frame."""
    properties = commands.Basic.Properties(delivery_mode=2 if persistent else 1)
    return (pframe.marshal(commands.Basic.Publish(exchange=exchange, routing_key=routing_key), channel)
            + pframe.marshal(ContentHeader(0, len(body), properties), channel)
            + pframe.marshal(ContentBody(body), channel))


def ack_frame(channel: int, delivery_tag: int, multiple: bool = True) -> bytes:
    return ACK.pack(FRAME_METHOD, channel, 13, BASIC, ACK_ID, delivery_tag, 1 if multiple else 0, FRAME_END)


def describe(method: Any) -> str:
    if isinstance(method, (commands.Channel.Close, commands.Connection.Close)):
        return f"{method.name} {method.reply_code} {method.reply_text!r}"
    return getattr(method, "name", type(method).__name__)


class Conn:
    """One AMQP connection: blocking with a timeout for the handshake and the setup RPCs
    (``rpc``), non-blocking for the pumps (``nonblocking``, ``on_readable``, ``write``,
    ``flush``). Counts, as frames arrive:

    - publisher confirms of the one confirming channel: ``confirmed`` / ``nacked`` sequence
      numbers (individual or multiple basic.ack / basic.nack), ``last_confirm_ns``;
    - deliveries: ``delivered`` complete messages (method, header and the body's last frame),
      ``last_tag`` per channel, which ``acks`` turns into basic.ack frames; with
      ``stamps`` set, each body's stamp (``loadtest.clients.stamps``) goes into it as the body arrives.
    """

    def __init__(self, port: int, timeout_s: float, product: str = "tidemq-bench") -> None:
        self.timeout_s = timeout_s
        self.sock = socket.create_connection((HOST, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.inbuf = bytearray()
        self.methods: deque[tuple[int, Any]] = deque()  # decoded methods the scanner does not count
        self.server_properties: dict[str, Any] = {}
        self.channels: list[int] = []  # open ones
        self.frame_max = FRAME_MAX
        self.blocked = ""  # connection.blocked's reason while it lasts
        self.closed_by_broker = ""
        # publisher confirms (one confirming channel per connection)
        self.sent = 0
        self.confirmed = 0
        self.nacked = 0
        self._settled_low = 0  # every sequence number up to this one is settled
        self._settled_above: set[int] = set()  # settled one by one above _settled_low
        self.last_confirm_ns = 0
        # deliveries
        self.delivered = 0
        self.first_delivery_ns = 0
        self.last_delivery_ns = 0
        self._pending_tag: dict[int, int] = {}  # channel -> tag of the message being received
        self._body_left: dict[int, int] = {}  # channel -> body bytes still to come
        self._body_size: dict[int, int] = {}  # channel -> the body size its content header said
        self.stamps: StampLog | None = None  # the latency scenario's: read each body's stamp
        self.last_tag: dict[int, int] = {}  # channel -> highest complete delivery tag
        self.acked_tag: dict[int, int] = {}  # channel -> highest tag acknowledged
        # non-blocking output
        self.pending: memoryview | None = None
        self._handshake(product)

    # -- blocking setup ------------------------------------------------------------------------
    def _handshake(self, product: str) -> None:
        self.sock.sendall(PROTOCOL_HEADER)
        start = self.expect(0, commands.Connection.Start)
        self.server_properties = dict(start.server_properties or {})
        self.send_method(0, commands.Connection.StartOk(
            client_properties={"product": product, "capabilities": {
                "publisher_confirms": True, "basic.nack": True, "connection.blocked": True}},
            mechanism="PLAIN", response="\0guest\0guest", locale="en_US"))
        tune = self.expect(0, commands.Connection.Tune)
        self.frame_max = min(tune.frame_max or FRAME_MAX, FRAME_MAX)
        # heartbeat 0: none either way (the runs are short; a beat would only add frames)
        self.send_method(0, commands.Connection.TuneOk(tune.channel_max or 2047, self.frame_max, 0))
        self.rpc(0, commands.Connection.Open(virtual_host="/"), commands.Connection.OpenOk)

    def open_channel(self, channel: int, *, confirm: bool = False, prefetch: int = 0) -> None:
        self.rpc(channel, commands.Channel.Open(), commands.Channel.OpenOk)
        self.channels.append(channel)
        if confirm:
            self.rpc(channel, commands.Confirm.Select(), commands.Confirm.SelectOk)
        if prefetch:
            self.rpc(channel, commands.Basic.Qos(prefetch_count=prefetch), commands.Basic.QosOk)

    def send_method(self, channel: int, method: Any) -> None:
        self.sock.sendall(method_frame(channel, method))

    def rpc(self, channel: int, method: Any, reply: type) -> Any:
        self.send_method(channel, method)
        return self.expect(channel, reply)

    def expect(self, channel: int, reply: type) -> Any:
        """Read (blocking, bounded by the timeout) until a method comes on ``channel``; it must be ``reply``."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            while self.methods:
                number, method = self.methods.popleft()
                if isinstance(method, commands.Connection.Close):
                    raise AMQPClientError(f"broker closed the connection: {describe(method)}")
                if number != channel:
                    continue  # e.g. a consume-ok of another channel while setting up
                if isinstance(method, reply):
                    return method
                raise AMQPClientError(f"expected {reply.__name__} on channel {channel}, got {describe(method)}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise AMQPClientError(f"no {reply.__name__} on channel {channel} within {self.timeout_s:g} s")
            self.sock.settimeout(left)
            try:
                data = receive(self.sock)
            except TimeoutError:
                continue
            if not data:
                raise AMQPClientError(f"broker closed the socket while {reply.__name__} was awaited"
                                      + (f" ({self.closed_by_broker})" if self.closed_by_broker else ""))
            self.inbuf += data
            self.scan(time.monotonic_ns())

    def message_count(self, channel: int, queue: str) -> int:
        """queue.declare passive: the broker's count of ready messages in ``queue``."""
        ok = self.rpc(channel, commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
        return ok.message_count

    def nonblocking(self) -> None:
        self.sock.setblocking(False)

    def close(self, timeout_s: float = 2.0) -> None:
        """channel.close for each channel, connection.close, each awaiting its close-ok (bounded;
        deliveries and confirms still on their way are read past), then the socket. (Closing
        the channels first spares RabbitMQ a race it logs as a supervisor shutdown_error.)"""
        try:
            self.pending = None
            self.timeout_s = timeout_s
            self.sock.settimeout(timeout_s)
            while self.channels:
                self.rpc(self.channels.pop(), commands.Channel.Close(200, "bench done", 0, 0), commands.Channel.CloseOk)
            self.rpc(0, commands.Connection.Close(200, "bench done", 0, 0), commands.Connection.CloseOk)
        except (OSError, AMQPClientError):
            pass  # already closed by the broker, or it did not answer: the socket goes anyway
        finally:
            self.sock.close()

    # -- the scanner ---------------------------------------------------------------------------
    def scan(self, now: int) -> int:
        """Walk the complete frames in ``inbuf``; returns the messages delivered by them."""
        buf = self.inbuf
        n = len(buf)
        pos = 0
        got = 0
        head = HEAD.unpack_from
        while n - pos >= 8:
            kind, channel, size = head(buf, pos)
            end = pos + 7 + size
            if end >= n:
                break
            if buf[end] != FRAME_END:
                raise AMQPClientError(f"frame end {buf[end]:#x} instead of 0xce "
                                      f"(type {kind}, channel {channel}, size {size})")
            if kind == FRAME_BODY:
                before = self._body_left.get(channel, 0)
                if self.stamps is not None and before == self._body_size.get(channel) and size >= STAMP_SIZE:
                    self.stamps.take(buf, pos + 7, now)  # the body's first frame holds the stamp
                left = before - size
                self._body_left[channel] = left
                if left <= 0:
                    got += 1
                    self.last_tag[channel] = self._pending_tag.get(channel, 0)
            elif kind == FRAME_METHOD:
                class_id, method_id = CLASS_METHOD.unpack_from(buf, pos + 7)
                if class_id == BASIC and method_id == DELIVER_ID:
                    tag_at = pos + 12 + buf[pos + 11]  # after the consumer tag (shortstr)
                    tag = U64.unpack_from(buf, tag_at)[0]
                    # the usual case in one step: header and one body frame follow on this channel
                    h = end + 1
                    if n - h >= 22:
                        h_kind, h_channel, h_size = head(buf, h)
                        b = h + 8 + h_size
                        if h_kind == FRAME_HEADER and h_channel == channel and n - b >= 8 and buf[b - 1] == FRAME_END:
                            body_size = U64.unpack_from(buf, h + 11)[0]
                            b_kind, b_channel, b_size = head(buf, b)
                            b_end = b + 7 + b_size
                            if (b_kind == FRAME_BODY and b_channel == channel and b_size == body_size
                                    and b_end < n and buf[b_end] == FRAME_END):
                                got += 1
                                self.last_tag[channel] = tag
                                self._body_left[channel] = 0
                                if self.stamps is not None and b_size >= STAMP_SIZE:
                                    self.stamps.take(buf, b + 7, now)
                                pos = b_end + 1
                                continue
                    self._pending_tag[channel] = tag
                elif class_id == BASIC and method_id in (ACK_ID, NACK_ID):
                    self._settle(U64.unpack_from(buf, pos + 11)[0], bool(buf[pos + 19] & 1), method_id == ACK_ID)
                    self.last_confirm_ns = now
                else:
                    self._other(channel, bytes(buf[pos:end + 1]))
            elif kind == FRAME_HEADER:
                body_size = U64.unpack_from(buf, pos + 11)[0]  # after class id and weight
                self._body_left[channel] = self._body_size[channel] = body_size
                if body_size == 0:
                    got += 1
                    self.last_tag[channel] = self._pending_tag.get(channel, 0)
            pos = end + 1
        if pos:
            del buf[:pos]
        if got:
            self.delivered += got
            self.last_delivery_ns = now
            if not self.first_delivery_ns:
                self.first_delivery_ns = now
        return got

    def _other(self, channel: int, frame: bytes) -> None:
        _, _, method = pframe.unmarshal(frame)
        if isinstance(method, commands.Connection.Blocked):
            self.blocked = method.reason or "blocked"
        elif isinstance(method, commands.Connection.Unblocked):
            self.blocked = ""
        else:
            if isinstance(method, (commands.Connection.Close, commands.Channel.Close)):
                self.closed_by_broker = describe(method)
            self.methods.append((channel, method))

    def _settle(self, tag: int, multiple: bool, ok: bool) -> None:
        if multiple:
            if tag <= self._settled_low:
                return
            above = [t for t in self._settled_above if t <= tag] if self._settled_above else []
            count = tag - self._settled_low - len(above)
            self._settled_above.difference_update(above)
            self._settled_low = tag
        else:
            if tag <= self._settled_low or tag in self._settled_above:
                return
            count = 1
            self._settled_above.add(tag)
            while self._settled_low + 1 in self._settled_above:
                self._settled_low += 1
                self._settled_above.discard(self._settled_low)
        if ok:
            self.confirmed += count
        else:
            self.nacked += count

    @property
    def outstanding(self) -> int:
        return self.sent - self.confirmed - self.nacked

    def unexpected(self) -> str | None:
        """What the broker sent that a pump did not ask for (a channel or connection close...),
        ignoring the replies a pump expects (consume-ok)."""
        while self.methods:
            _, method = self.methods.popleft()
            if not isinstance(method, (commands.Basic.ConsumeOk, commands.Basic.QosOk)):
                return describe(method)
        return None

    # -- non-blocking I/O ----------------------------------------------------------------------
    def on_readable(self, now: int) -> int:
        """Read what is there (non-blocking); returns the messages delivered. Raises when the
        broker closed the socket."""
        got = 0
        for _ in range(READS_PER_WAKE):
            try:
                data = receive(self.sock)
            except (BlockingIOError, InterruptedError):
                break
            if not data:
                why = f": {self.closed_by_broker}" if self.closed_by_broker else ""
                raise AMQPClientError("broker closed the socket" + why)
            self.inbuf += data
            if len(data) < RECV_SIZE:
                break
        if self.inbuf:
            got = self.scan(now)
        return got

    def write(self, data: bytes | memoryview) -> None:
        """Send without blocking; what the socket does not take waits in ``pending``."""
        assert self.pending is None
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        if sent < len(data):
            self.pending = memoryview(data)[sent:]

    def flush(self) -> None:
        if self.pending is None:
            return
        try:
            sent = self.sock.send(self.pending)
        except (BlockingIOError, InterruptedError):
            return
        self.pending = self.pending[sent:] if sent < len(self.pending) else None

    def acks(self, every: int = 0) -> bytes:
        """basic.ack frames for what each channel received since its last ack: ``every`` 0, one
        ``multiple`` ack up to the last complete delivery; 1, one ack per delivery (not
        multiple); N, a ``multiple`` ack each time N more deliveries are complete (the rest wait).
        Delivery tags of a channel count up by one, so the tags in between are known."""
        out = []
        for channel, tag in self.last_tag.items():
            acked = self.acked_tag.get(channel, 0)
            if tag <= acked:
                continue
            if every == 0:
                out.append(ack_frame(channel, tag))
            elif every == 1:
                out.extend(ack_frame(channel, t, multiple=False) for t in range(acked + 1, tag + 1))
            else:
                tag = acked + (tag - acked) // every * every
                out.extend(ack_frame(channel, t) for t in range(acked + every, tag + 1, every))
            self.acked_tag[channel] = tag
        return b"".join(out)
