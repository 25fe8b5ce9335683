"""Raw-socket MQTT 3.1.1 client pieces for the load generator of ``bench_mqtt``.

Packets are encoded once by the project's sans-IO codec; the hot paths (stamping a batch of
PUBLISHes, counting PUBACKs, splitting a subscriber's inbound PUBLISHes) then work on bytes.
"""

from __future__ import annotations

import errno
import functools
import os
import selectors
import socket
import struct
import time
from dataclasses import dataclass

from loadtest.clients.stamps import PAYLOAD_SIZE, STAMP, StampedFrames, StampLog
from protocols.mqtt.codec import PacketReader, encode
from protocols.mqtt.errors import MalformedPacket, MQTTError
from protocols.mqtt.packets import (
    MQTT_3_1_1,
    ConnAck,
    Connect,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
)

HOST = "127.0.0.1"
# In a QoS 1 PUBLISH the packet id sits right before the payload: one pack_into writes both.
STAMP_WITH_ID = struct.Struct(">HIIQ")
PUBACK_HEAD = b"\x40\x02"
_PUBACK_WORD = 0x4002 << 16  # a PUBACK as one big-endian 32-bit word, the packet id below
RECV_SIZE = 1 << 20
_PUBLISH = 3
_PUBACK = 4
# Every read of a process lands in this one buffer and is copied out at its size. A plain
# ``sock.recv(RECV_SIZE)`` allocates RECV_SIZE bytes first, and above glibc's mmap threshold
# (128 KiB in a process that never freed a larger block) each such allocation is an mmap, an
# mremap and a munmap: 11 us a read measured on 2 cores, more than a subscriber's whole work on
# the few messages one read brings (0.9 us with recv_into).
_SCRATCH = bytearray(RECV_SIZE)
_SCRATCH_VIEW = memoryview(_SCRATCH)


def receive(sock: socket.socket) -> bytes:
    """What the socket has (up to RECV_SIZE bytes), b"" once the peer closed it; raises as
    ``sock.recv`` does (BlockingIOError, TimeoutError, ConnectionResetError)."""
    n = sock.recv_into(_SCRATCH)
    return bytes(_SCRATCH_VIEW[:n])


class HandshakeError(Exception):
    """The broker refused, closed or did not answer a CONNECT or SUBSCRIBE in time."""


def connect_packet(client_id: str, keep_alive: int, clean: bool = True) -> bytes:
    return encode(Connect(client_id, version=MQTT_3_1_1, clean_start=clean, keep_alive=keep_alive), MQTT_3_1_1)


def subscribe_packet(topic_filter: str, qos: int, packet_id: int = 1) -> bytes:
    return encode(Subscribe(packet_id, [Subscription(topic_filter, qos=qos)]), MQTT_3_1_1)


def frame_bounds(buf: bytearray, pos: int) -> tuple[int, int] | None:
    """(body start, frame end) of the frame at ``pos``, or None while its length is incomplete."""
    remaining = shift = 0
    i = pos + 1
    while i < len(buf):
        byte = buf[i]
        i += 1
        remaining |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return i, i + remaining
        shift += 7
        if shift > 21:
            raise MalformedPacket("remaining length longer than 4 bytes from the broker")
    return None


# -- opening sessions ----------------------------------------------------------------------------
@dataclass(slots=True)
class Sessions:
    sockets: list[socket.socket]  # open, non-blocking, CONNACKed (and SUBACKed if asked)
    error: str | None  # the first failure; the sessions opened before it are kept
    seconds: float


class _Handshake:
    __slots__ = ("awaiting", "client_id", "connect", "reader", "sock")

    def __init__(self, sock: socket.socket, client_id: str, connect: bytes) -> None:
        self.sock = sock
        self.client_id = client_id
        self.connect = connect
        self.reader = PacketReader(version=MQTT_3_1_1)
        self.awaiting = "connect"  # then "connack", then "suback" when subscribing


def open_sessions(port: int, client_ids: list[str], *, keep_alive: int, timeout_s: float,
                  subscribe: tuple[str, int] | None = None, concurrency: int = 24, clean: bool = True) -> Sessions:
    """Connect ``client_ids`` (clean sessions; persistent ones, 3.1.1's clean session 0, with
    ``clean`` False), at most ``concurrency`` handshakes at a time.

    Brokers listen with a backlog of about 100 (Mosquitto, asyncio): more connects in flight
    from all the generator's processes overflow it, and a dropped SYN costs a 1 s retransmit.

    Stops at the first failure or at ``timeout_s``; CONNACK and SUBACK are parsed with the
    codec's PacketReader (this is not a hot path).
    """
    started = time.monotonic()
    deadline = started + timeout_s
    sub_packet = subscribe_packet(*subscribe) if subscribe else b""
    sel = selectors.DefaultSelector()
    opened: list[socket.socket] = []
    active: list[_Handshake] = []
    error: str | None = None
    next_index = 0
    try:
        while error is None and (next_index < len(client_ids) or active):
            while error is None and len(active) < concurrency and next_index < len(client_ids):
                try:
                    hs = _start_connect(port, client_ids[next_index], keep_alive, clean)
                except OSError as exc:  # EMFILE, EADDRNOTAVAIL, ECONNREFUSED...
                    error = f"{client_ids[next_index]}: {exc}"
                    break
                next_index += 1
                active.append(hs)
                sel.register(hs.sock, selectors.EVENT_WRITE, hs)
            if error is not None:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                error = f"timeout after {timeout_s:g} s with {len(opened)}/{len(client_ids)} sessions open"
                break
            for key, _ in sel.select(min(remaining, 0.5)):
                hs = key.data
                try:
                    finished = _advance(hs, sub_packet, sel)
                except (OSError, HandshakeError, MQTTError) as exc:
                    error = f"{hs.client_id}: {exc}"
                    break
                if finished:
                    sel.unregister(hs.sock)
                    active.remove(hs)
                    opened.append(hs.sock)
    finally:
        for hs in active:
            sel.unregister(hs.sock)
            hs.sock.close()
        sel.close()
    return Sessions(opened, error, time.monotonic() - started)


def _start_connect(port: int, client_id: str, keep_alive: int, clean: bool = True) -> _Handshake:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    code = sock.connect_ex((HOST, port))
    if code not in (0, errno.EINPROGRESS):
        sock.close()
        raise OSError(code, f"connect to {HOST}:{port} failed: {os.strerror(code)}")
    return _Handshake(sock, client_id, connect_packet(client_id, keep_alive, clean))


def _advance(hs: _Handshake, sub_packet: bytes, sel: selectors.BaseSelector) -> bool:
    """One readiness event of a handshake; True once the session is ready."""
    sock = hs.sock
    if hs.awaiting == "connect":
        code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            raise HandshakeError(f"connect failed: {os.strerror(code)}")
        sock.send(hs.connect)  # a fresh socket takes a ~30-byte packet whole
        hs.awaiting = "connack"
        sel.modify(sock, selectors.EVENT_READ, hs)
        return False
    try:
        data = receive(sock)
    except ConnectionResetError:
        data = b""
    if not data:
        raise HandshakeError(f"the broker closed the connection before {hs.awaiting.upper()}")
    hs.reader.feed(data)
    for packet in hs.reader.packets():
        if hs.awaiting == "connack" and isinstance(packet, ConnAck):
            if packet.reason_code:
                raise HandshakeError(f"CONNACK refused the session (reason code 0x{packet.reason_code:02X})")
            if not sub_packet:
                return True
            sock.send(sub_packet)
            hs.awaiting = "suback"
        elif hs.awaiting == "suback" and isinstance(packet, SubAck):
            if not packet.reason_codes or packet.reason_codes[0] >= 0x80:
                raise HandshakeError(f"SUBACK refused the subscription ({packet.reason_codes})")
            return True
    return False


# -- publishing ----------------------------------------------------------------------------------
class PublishBatch(StampedFrames):
    """``capacity`` copies of one pre-encoded PUBLISH; ``stamp`` fills in packet ids (QoS 1),
    sequence numbers and the send time in place, so a batch costs one pack_into per message."""

    __slots__ = ("qos",)

    def __init__(self, topic: str, qos: int, publisher: int, capacity: int) -> None:
        frame = encode(Publish(topic, bytes(PAYLOAD_SIZE), qos=qos, packet_id=1 if qos else None), MQTT_3_1_1)
        super().__init__(frame, len(frame) - PAYLOAD_SIZE - (2 if qos else 0), publisher, capacity)
        self.qos = qos

    def stamp(self, first_seq: int, count: int, now_ns: int) -> memoryview:
        if not self.qos:
            return super().stamp(first_seq, count, now_ns)
        buf, size, off, pub = self.buffer, self.frame_size, self.offset, self.publisher
        pack = STAMP_WITH_ID.pack_into
        for seq in range(first_seq, first_seq + count):
            pack(buf, off, seq % 65535 + 1, pub, seq, now_ns)
            off += size
        return self.view[: count * size]


class AckCounter:
    """Counts the PUBACKs in a publisher's inbound stream.

    Hand-rolled rather than PacketReader: building a PubAck object per frame at 100k+ acks/s
    costs the generator more than the broker spends on them. MQTT 3.1.1 PUBACKs are 4-byte
    frames, so a run of them is recognised with two slice counts; anything else takes the
    frame-by-frame path.
    """

    __slots__ = ("buffer",)

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> int:
        buf = self.buffer
        buf += data
        n = len(buf) >> 2
        size = n << 2
        if n and buf[0:size:4].count(0x40) == n and buf[1:size:4].count(2) == n:
            del buf[:size]
            return n
        return self._frame_by_frame()

    def _frame_by_frame(self) -> int:
        buf = self.buffer
        pos = acks = 0
        while len(buf) - pos >= 2:
            bounds = frame_bounds(buf, pos)
            if bounds is None or bounds[1] > len(buf):
                break
            if buf[pos] >> 4 == _PUBACK:
                acks += 1
            pos = bounds[1]
        del buf[:pos]
        return acks


class Publisher:
    """One publishing connection: a window of unacknowledged QoS 1 packet ids, or none at QoS 0."""

    __slots__ = ("acked", "acks", "batch", "first_send_ns", "last_send_ns", "pending", "sent", "sock", "window")

    def __init__(self, sock: socket.socket, batch: PublishBatch, window: int) -> None:
        if batch.qos and not 0 < window <= min(batch.capacity, 65535):
            raise ValueError("a QoS 1 window must fit the batch and the packet id space")
        self.sock = sock
        self.batch = batch
        self.window = window
        self.sent = 0
        self.acked = 0
        self.pending: memoryview | None = None  # bytes of the last batch the socket did not take yet
        self.acks = AckCounter()
        self.first_send_ns = 0
        self.last_send_ns = 0

    def room(self) -> int:
        if self.pending is not None:
            return 0  # the batch buffer is still in use
        if self.batch.qos:
            return self.window - (self.sent - self.acked)
        return self.batch.capacity

    def send(self, count: int, now_ns: int) -> None:
        if not self.first_send_ns:
            self.first_send_ns = now_ns
        self.last_send_ns = now_ns
        view = self.batch.stamp(self.sent, count, now_ns)
        self.sent += count
        self._write(view)

    def flush(self) -> None:
        if self.pending is not None:
            self._write(self.pending)

    def _write(self, view: memoryview) -> None:
        try:
            written = self.sock.send(view)
        except BlockingIOError:
            written = 0
        self.pending = view[written:] if written < len(view) else None

    def on_readable(self) -> None:
        data = receive(self.sock)
        if not data:
            raise ConnectionError("the broker closed a publisher's connection")
        self.acked += self.acks.feed(data)


# -- subscribing ---------------------------------------------------------------------------------
class PublishCounter(StampLog):
    """Counts the PUBLISHes of a subscriber's inbound stream, marks each (publisher, sequence)
    seen to find duplicates and losses, records publish-to-receive latencies, and appends the
    PUBACKs owed for QoS 1 deliveries.

    Hand-rolled rather than PacketReader, which builds a Publish object (topic decoded, payload
    copied) per frame: at the 100k+ deliveries/s a subscriber sees here, that would make the
    generator, not the broker, the bottleneck. Frames other than PUBLISH are skipped.

    A read usually brings a run of PUBLISHes of one shape (one topic, one payload size, one
    QoS): such a run is taken whole (``_take_run``), its framing proven by strided compares and
    its stamps read by one ``iter_unpack``; the rest goes frame by frame (``_take_frames``).
    """

    __slots__ = ("buffer",)

    def __init__(self) -> None:
        super().__init__()
        self.buffer = bytearray()

    def feed(self, data: bytes, now_ns: int, acks: bytearray) -> int:
        self.buffer += data
        return self._take_run(now_ns, acks) + self._take_frames(now_ns, acks)

    def _take_run(self, now_ns: int, acks: bytearray) -> int:
        """The PUBLISHes at the buffer's start, if they all have the first one's shape: its first
        byte (type, QoS), its one-byte remaining length and its topic length. Each frame's
        length byte places the next frame, so equal bytes at every multiple of the frame size
        prove the framing. Returns the frames taken (0: no run of two or more)."""
        buf = self.buffer
        if len(buf) < 4 or buf[0] >> 4 != _PUBLISH or buf[1] >= 0x80:
            return 0
        size = buf[1] + 2
        n = len(buf) // size
        whole = n * size
        if n < 2 or any(buf[i:whole:size].count(buf[i]) != n for i in range(4)):
            return 0
        qos = 1 if buf[0] & 0x06 else 0
        start = 4 + ((buf[2] << 8) | buf[3])  # the packet id (QoS 1) or the stamp
        if start + qos * 2 + STAMP.size > size:
            return 0  # not a stamped payload
        layout = _run_layout(size, start, qos)
        with memoryview(buf) as view:
            rows = list(layout.iter_unpack(view[:whole]))
        del buf[:whole]
        if qos:
            acks += struct.pack(f">{n}I", *[_PUBACK_WORD | row[0] for row in rows])
        publishers = {row[qos] for row in rows}
        seqs = [row[qos + 1] for row in rows]
        first = seqs[0]
        if len(publishers) == 1 and seqs == list(range(first, first + n)):
            marks = self._marks(rows[0][qos], first + n)
            new = marks.count(0, first, first + n)
            marks[first : first + n] = b"\x01" * n
            self.duplicates += n - new
        else:
            for row in rows:
                marks = self._marks(row[qos], row[qos + 1] + 1)
                if marks[row[qos + 1]]:
                    self.duplicates += 1
                else:
                    marks[row[qos + 1]] = 1
        self.latencies.extend([now_ns - row[qos + 2] for row in rows])
        self.received += n
        return n

    def _take_frames(self, now_ns: int, acks: bytearray) -> int:
        buf = self.buffer
        end_of_data = len(buf)
        pos = count = duplicates = 0
        unpack = STAMP.unpack_from
        record = self.latencies.append
        while end_of_data - pos >= 2:
            first = buf[pos]
            remaining = buf[pos + 1]
            if remaining < 0x80:  # the usual case: a 64-byte payload keeps the frame under 128 bytes
                body = pos + 2
                end = body + remaining
            else:
                bounds = frame_bounds(buf, pos)
                if bounds is None:
                    break
                body, end = bounds
            if end > end_of_data:
                break
            if first >> 4 == _PUBLISH:
                off = body + 2 + ((buf[body] << 8) | buf[body + 1])
                if first & 0x06:
                    acks += PUBACK_HEAD
                    acks += buf[off : off + 2]
                    off += 2
                publisher, seq, sent_ns = unpack(buf, off)
                marks = self._marks(publisher, seq + 1)
                if marks[seq]:
                    duplicates += 1
                else:
                    marks[seq] = 1
                record(now_ns - sent_ns)
                count += 1
            pos = end
        del buf[:pos]
        self.received += count
        self.duplicates += duplicates
        return count


@functools.lru_cache(maxsize=64)
def _run_layout(size: int, start: int, qos: int) -> struct.Struct:
    """A frame of ``size`` bytes whose stamp (after the packet id at QoS 1) sits at ``start``:
    (publisher, sequence, sent) or (packet id, publisher, sequence, sent)."""
    fields = "HIIQ" if qos else "IIQ"
    return struct.Struct(f">{start}x{fields}{size - start - struct.calcsize('>' + fields)}x")


class Subscriber:
    """One subscribing connection: reads, counts and acknowledges what the broker delivers."""

    __slots__ = ("counter", "first_receive_ns", "last_receive_ns", "out", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.counter = PublishCounter()
        self.out = bytearray()  # PUBACKs the socket did not take yet
        self.first_receive_ns = 0
        self.last_receive_ns = 0

    def on_readable(self, now_ns: int) -> int:
        data = receive(self.sock)
        if not data:
            raise ConnectionError("the broker closed a subscriber's connection")
        count = self.counter.feed(data, now_ns, self.out)
        if count:
            if not self.first_receive_ns:
                self.first_receive_ns = now_ns
            self.last_receive_ns = now_ns
        if self.out:
            self.flush()
        return count

    def flush(self) -> None:
        try:
            written = self.sock.send(self.out)
        except BlockingIOError:
            return
        del self.out[:written]
