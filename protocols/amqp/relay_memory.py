"""What a relay remembers of an AMQP 0-9-1 connection to open it again on another server, and
the renumbering that hides the change from the client (sans-IO).

The relay forwards whole commands (a method with its content) and keeps: the client's
handshake; each channel's prefetch, confirm mode and consumers; the synchronous request waiting
for its reply; in confirm mode, each publish until it is confirmed. After a failover
``replay_steps`` open the same connection on the new server, and ``after_replay`` publishes
again what was unconfirmed and asks again what was unanswered. Delivery tags and publish
sequence numbers restart on the new server, so they are offset: a delivery of the old server is
settled by the new one delivering it again (redelivered); an ack of an old tag is dropped.
State that does not survive a server (exclusive or transient queues, transient exchanges,
transactions) makes the connection not replayable (``unreplayable``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from pamqp import commands
from pamqp import frame as pframe

from .frames import FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD, PROTOCOL_HEADER
from .relay_identity import ORIGIN_HEADER, RELAY_PROPERTY, identity_value, origin_value


def key(class_id: int, method_id: int) -> int:
    return class_id << 16 | method_id


HEARTBEAT, HEADER_KEY, STRAY = -1, -2, -3  # commands that are not methods
START, START_OK, SECURE_OK, TUNE, TUNE_OK = key(10, 10), key(10, 11), key(10, 21), key(10, 30), key(10, 31)
OPEN, OPEN_OK, CLOSE, CLOSE_OK = key(10, 40), key(10, 41), key(10, 50), key(10, 51)
CHANNEL_OPEN, CHANNEL_OPEN_OK, CHANNEL_FLOW = key(20, 10), key(20, 11), key(20, 20)
CHANNEL_CLOSE, CHANNEL_CLOSE_OK = key(20, 40), key(20, 41)
EXCHANGE_DECLARE, QUEUE_DECLARE = key(40, 10), key(50, 10)
QOS, QOS_OK, CONSUME, CONSUME_OK, CANCEL = key(60, 10), key(60, 11), key(60, 20), key(60, 21), key(60, 30)
PUBLISH, RETURN, DELIVER, GET_OK = key(60, 40), key(60, 50), key(60, 60), key(60, 71)
ACK, REJECT, NACK = key(60, 80), key(60, 90), key(60, 120)
TX_SELECT, CONFIRM_SELECT, CONFIRM_SELECT_OK = key(90, 10), key(85, 10), key(85, 11)

CONTENT = frozenset((PUBLISH, RETURN, DELIVER, GET_OK))
# a client's synchronous requests (each waits for its reply; ``nowait`` ones excepted)
REQUESTS = frozenset((CHANNEL_OPEN, CHANNEL_FLOW, CHANNEL_CLOSE, EXCHANGE_DECLARE, key(40, 20), key(40, 30),
                      key(40, 40), QUEUE_DECLARE, key(50, 20), key(50, 30), key(50, 40), key(50, 50), QOS,
                      CONSUME, CANCEL, key(60, 70), key(60, 110), TX_SELECT, key(90, 20), key(90, 30),
                      CONFIRM_SELECT))
REPLIES = frozenset((CHANNEL_OPEN_OK, key(20, 21), CHANNEL_CLOSE_OK, key(40, 11), key(40, 21), key(40, 31),
                     key(40, 51), key(50, 11), key(50, 21), key(50, 31), key(50, 41), key(50, 51), QOS_OK,
                     CONSUME_OK, key(60, 31), GET_OK, key(60, 72), key(60, 111), key(90, 11), key(90, 21),
                     key(90, 31), CONFIRM_SELECT_OK, CHANNEL_CLOSE))
_NOWAIT_DECODED = frozenset((EXCHANGE_DECLARE, key(40, 20), key(40, 30), key(40, 40), QUEUE_DECLARE, key(50, 20),
                             key(50, 30), key(50, 40), CONSUME, CANCEL, CONFIRM_SELECT))

_HEAD = struct.Struct(">BHI")
_KEY = struct.Struct(">I")
_TAG = struct.Struct(">Q")
_TAG_AT = 11  # a delivery tag first in basic.ack / nack / reject / get-ok: after the 7-byte frame head and the ids
MAX_FRAME = (128 << 20) + 8  # larger than any frame_max a server offers: the stream is not AMQP


class NotAMQP(Exception):
    """The bytes are not AMQP frames (the relay then copies them as they come: the server answers)."""


class FrameSplitter:
    """Whole frames out of a byte stream (the client's protocol header first, when ``header``)."""

    __slots__ = ("_buffer", "_header")

    def __init__(self, *, header: bool) -> None:
        self._buffer = bytearray()
        self._header = header

    def feed(self, data: bytes) -> list[bytes]:
        if self._buffer:
            self._buffer += data
            data = bytes(self._buffer)
        frames: list[bytes] = []
        start = 0
        end = len(data)
        if self._header:
            if end < 8:
                self._buffer = bytearray(data)
                return frames
            frames.append(data[:8])
            self._header = False
            start = 8
        unpack = _HEAD.unpack_from
        while end - start >= 7:
            size = unpack(data, start)[2]
            if size > MAX_FRAME:
                self._buffer = bytearray(data)
                raise NotAMQP(f"a frame of {size} bytes")
            stop = start + 8 + size
            if stop > end:
                break
            if data[stop - 1] != FRAME_END:
                self._buffer = bytearray(data)
                raise NotAMQP("a frame without its frame-end octet")
            frames.append(data[start:stop])
            start = stop
        self._buffer = bytearray(data[start:]) if start < end else bytearray()
        return frames

    def rest(self) -> bytes:
        """What was fed and not yet split (for copying it on as it is)."""
        rest = bytes(self._buffer)
        self._buffer.clear()
        return rest


Command = tuple[int, int, list[bytes]]  # channel, key (or HEARTBEAT / HEADER_KEY / STRAY), frames


class CommandAssembler:
    """Frames grouped into commands: a content method with its header and body frames is one."""

    __slots__ = ("_partial",)

    def __init__(self) -> None:
        self._partial: dict[int, list] = {}  # channel -> [key, frames, body bytes still to come]

    def commands(self, frames: list[bytes]) -> list[Command]:
        out: list[Command] = []
        partial = self._partial
        for raw in frames:
            kind = raw[0]
            if len(raw) == 8 and raw.startswith(b"AMQP"):
                out.append((0, HEADER_KEY, [raw]))
                continue
            channel = raw[1] << 8 | raw[2]
            if kind == FRAME_METHOD and len(raw) >= 12:
                method = _KEY.unpack_from(raw, 7)[0]
                if method in CONTENT:
                    partial[channel] = [method, [raw], None]
                else:
                    out.append((channel, method, [raw]))
            elif kind == FRAME_HEARTBEAT:
                out.append((channel, HEARTBEAT, [raw]))
            elif (kind == FRAME_HEADER or kind == FRAME_BODY) and channel in partial:
                entry = partial[channel]
                entry[1].append(raw)
                if kind == FRAME_HEADER:
                    entry[2] = _TAG.unpack_from(raw, 11)[0] if len(raw) >= 20 else 0
                else:
                    entry[2] -= len(raw) - 8
                if entry[2] <= 0:
                    del partial[channel]
                    out.append((channel, entry[0], entry[1]))
            else:  # a frame out of place: the server answers it as it would unrelayed
                out.append((channel, STRAY, [raw]))
        return out


@dataclass(slots=True)
class ChannelMemory:
    opened: bool = False
    qos: dict[bool, bytes] = field(default_factory=dict)  # global flag -> the last basic.qos frame
    confirming: bool = False
    consumers: dict[str, commands.Basic.Consume] = field(default_factory=dict)
    waiting: list[bytes] | None = None  # the synchronous request not yet answered (its frames)
    waiting_key: int = 0
    waiting_method: Any = None  # the decoded request (basic.consume: its consumer is kept at consume-ok)
    tag_base: int = 0  # the client's delivery tag = the server's + tag_base
    last_tag: int = 0  # the last delivery tag the client was given
    published: int = 0  # the client's publish sequence (confirm mode)
    server_published: int = 0  # the server's
    # server seq -> client seq, frames, origin: (generation, server seq) of its first publish
    unconfirmed: dict[int, tuple[int, list[bytes], tuple[int, int]]] = field(default_factory=dict)


def _with_tag(raw: bytes, at: int, tag: int) -> bytes:
    return raw[:at] + _TAG.pack(tag) + raw[at + 8:]


def decode(raw: bytes) -> Any:
    return pframe.unmarshal(raw)[2]


class ConnectionMemory:
    """One relayed connection's replayable state; ``from_client`` / ``from_server`` take each
    command and return the frames to pass on (None: nothing)."""

    def __init__(self, token: str = "") -> None:
        # the relay's name for the client's publishes (relay_identity.py): this connection's
        # token, and the servers it was opened on (a failover begins the next generation)
        self.token = token
        self.generation = 0
        self._start_ok: Any = None  # the client's connection.start-ok, decoded (its identity added per generation)
        self.handshake: dict[int, bytes] = {}  # START_OK, TUNE_OK, OPEN -> the client's frame
        self.channels: dict[int, ChannelMemory] = {}
        self.unreplayable = ""  # why a failover must close the connection ("": it need not)
        self.closing = False  # connection.close was sent by either side
        self.heartbeat_s = 0
        self._again: dict[int, list[tuple[int, list[bytes], tuple[int, int]]]] = {}  # channel -> publishes to send again

    # -- client -> server ------------------------------------------------------------------
    def from_client(self, command: Command) -> list[bytes] | None:
        channel, method, frames = command
        if method == PUBLISH:
            memory = self.channels.get(channel)
            if memory is not None and memory.confirming:
                memory.published += 1
                memory.server_published += 1
                memory.unconfirmed[memory.server_published] = (memory.published, frames,
                                                                (self.generation, memory.server_published))
            return frames
        if method == ACK or method == NACK or method == REJECT:
            memory = self.channels.get(channel)
            if memory is None or not memory.tag_base:
                return frames
            tag = _TAG.unpack_from(frames[0], _TAG_AT)[0]
            if tag == 0:  # (multiple: everything outstanding)
                return frames
            if tag <= memory.tag_base:
                return None  # the old server's delivery: the new one delivers it again
            return [_with_tag(frames[0], _TAG_AT, tag - memory.tag_base)]
        if method < 0:
            return frames
        if method in REQUESTS:
            self._request(channel, method, frames)
        elif method in self.handshake_keys:
            if method == START_OK and self.token:
                self._start_ok = decode(frames[0])
                frames = [self._identified_start_ok()]
            self.handshake[method] = frames[0]
            if method == TUNE_OK:
                self.heartbeat_s = getattr(decode(frames[0]), "heartbeat", 0) or 0
        elif method == SECURE_OK:
            self.unreplayable = "its login took a SASL challenge"
        elif method == CLOSE or method == CLOSE_OK:
            self.closing = True
        elif method == CHANNEL_CLOSE_OK:  # (answering the server's channel.close)
            self.channels.pop(channel, None)
        return frames

    handshake_keys = frozenset((START_OK, TUNE_OK, OPEN))

    def _identified_start_ok(self) -> bytes:
        """The client's connection.start-ok with the relay's identity of this generation."""
        start_ok = self._start_ok
        properties = dict(start_ok.client_properties or {})
        properties[RELAY_PROPERTY] = identity_value(self.token, self.generation)
        return pframe.marshal(commands.Connection.StartOk(
            client_properties=properties, mechanism=start_ok.mechanism, response=start_ok.response,
            locale=start_ok.locale), 0)

    def _request(self, channel: int, method: int, frames: list[bytes]) -> None:
        decoded: Any = decode(frames[0]) if method in _NOWAIT_DECODED or method in (QOS, CHANNEL_FLOW) else None
        if method == CHANNEL_OPEN:
            self.channels[channel] = ChannelMemory()
        memory = self.channels.get(channel)
        if memory is None:
            return  # (a request on a channel not open: the server answers it)
        if method == QUEUE_DECLARE:
            if not decoded.passive and (decoded.exclusive or not decoded.durable):
                self.unreplayable = "it declared a transient or exclusive queue"
        elif method == EXCHANGE_DECLARE:
            if not decoded.passive and not decoded.durable:
                self.unreplayable = "it declared a transient exchange"
        elif method == TX_SELECT:
            self.unreplayable = "a channel is transactional"
        elif method == CHANNEL_FLOW:
            if not decoded.active:
                self.unreplayable = "a channel paused its flow"
        elif method == QOS:
            memory.qos[bool(decoded.global_)] = frames[0]
        elif method == CONFIRM_SELECT:
            memory.confirming = True
        elif method == CANCEL:
            memory.consumers.pop(decoded.consumer_tag, None)
        elif method == CONSUME and decoded.nowait:
            memory.consumers[decoded.consumer_tag] = decoded
        if decoded is not None and getattr(decoded, "nowait", False):
            return
        memory.waiting, memory.waiting_key, memory.waiting_method = frames, method, decoded

    # -- server -> client ------------------------------------------------------------------
    def from_server(self, command: Command) -> list[bytes] | None:
        channel, method, frames = command
        if method == DELIVER:
            memory = self.channels.get(channel)
            if memory is None:
                return frames
            raw = frames[0]
            at = 12 + raw[11]  # after the consumer tag
            tag = _TAG.unpack_from(raw, at)[0] + memory.tag_base
            memory.last_tag = tag
            if memory.tag_base:
                frames = [_with_tag(raw, at, tag), *frames[1:]]
            return frames
        if method == ACK or method == NACK:  # publisher confirms
            memory = self.channels.get(channel)
            return frames if memory is None else self._confirm(memory, frames)
        if method < 0:
            return frames
        memory = self.channels.get(channel)
        if method in REPLIES and memory is not None:
            self._replied(memory, channel, method, frames)
            if method == GET_OK:
                tag = _TAG.unpack_from(frames[0], _TAG_AT)[0] + memory.tag_base
                memory.last_tag = tag
                if memory.tag_base:
                    frames = [_with_tag(frames[0], _TAG_AT, tag), *frames[1:]]
        elif method == CANCEL and memory is not None:  # the server cancelled a consumer
            memory.consumers.pop(decode(frames[0]).consumer_tag, None)
        elif method == CLOSE or method == CLOSE_OK:
            self.closing = True
        return frames

    def _replied(self, memory: ChannelMemory, channel: int, method: int, frames: list[bytes]) -> None:
        if method == CHANNEL_OPEN_OK:
            memory.opened = True
        elif method == CONSUME_OK and memory.waiting_key == CONSUME:
            consume = memory.waiting_method
            consume.consumer_tag = decode(frames[0]).consumer_tag
            memory.consumers[consume.consumer_tag] = consume
        elif method == CHANNEL_CLOSE_OK:
            self.channels.pop(channel, None)
        memory.waiting = None
        memory.waiting_key = 0
        memory.waiting_method = None

    @staticmethod
    def _confirm(memory: ChannelMemory, frames: list[bytes]) -> list[bytes] | None:
        raw = frames[0]
        tag = _TAG.unpack_from(raw, _TAG_AT)[0]
        multiple = raw[_TAG_AT + 8] & 1
        unconfirmed = memory.unconfirmed
        if multiple:
            last = 0
            while unconfirmed:
                first = next(iter(unconfirmed))
                if first > tag:
                    break
                last = unconfirmed.pop(first)[0]
            if not last:
                return None
        else:
            entry = unconfirmed.pop(tag, None)
            if entry is None:
                return None
            last = entry[0]
        return frames if last == tag else [_with_tag(raw, _TAG_AT, last)]

    # -- a failover --------------------------------------------------------------------------
    def replay_steps(self) -> list[tuple[bytes, int, int]]:
        """(bytes to send, the reply's channel, its key) in order: the handshake, then each
        channel's open, prefetch, confirm mode and consumers. Call ``begin_replay`` first."""
        steps = [(PROTOCOL_HEADER, 0, START), (self.handshake[START_OK], 0, TUNE),
                 (self.handshake[TUNE_OK] + self.handshake[OPEN], 0, OPEN_OK)]
        for number, memory in self.channels.items():
            if not memory.opened:
                continue  # (its channel.open is asked again: after_replay)
            steps.append((pframe.marshal(commands.Channel.Open(), number), number, CHANNEL_OPEN_OK))
            steps += [(qos, number, QOS_OK) for qos in memory.qos.values()]
            if memory.confirming:
                steps.append((pframe.marshal(commands.Confirm.Select(), number), number, CONFIRM_SELECT_OK))
            for consume in memory.consumers.values():
                again = commands.Basic.Consume(queue=consume.queue, consumer_tag=consume.consumer_tag,
                                               no_local=consume.no_local, no_ack=consume.no_ack,
                                               exclusive=consume.exclusive, arguments=consume.arguments)
                steps.append((pframe.marshal(again, number), number, CONSUME_OK))
        return steps

    def replayable(self) -> bool:
        return not self.unreplayable and all(k in self.handshake for k in self.handshake_keys)

    def begin_replay(self) -> None:
        """Tags and sequence numbers start again, in the next generation; each channel's
        unconfirmed publishes wait for ``after_replay``."""
        self.generation += 1
        if self._start_ok is not None:
            self.handshake[START_OK] = self._identified_start_ok()
        for number, memory in self.channels.items():
            memory.tag_base = memory.last_tag
            memory.server_published = 0
            self._again[number] = list(memory.unconfirmed.values())
            memory.unconfirmed.clear()

    def after_replay(self) -> bytes:
        """The publishes the old server did not confirm, published again (their new server
        sequence numbers kept), then each channel's unanswered request."""
        out = []
        for number, memory in self.channels.items():
            for published, frames, origin in self._again.get(number, ()):
                memory.server_published += 1
                if self.token:  # named by its first publish: a server that holds it does not store it again
                    frames = with_origin(frames, origin)
                memory.unconfirmed[memory.server_published] = (published, frames, origin)
                out += frames
            if memory.waiting is not None:
                out += memory.waiting
        self._again.clear()
        return b"".join(out)


def with_origin(frames: list[bytes], origin: tuple[int, int]) -> list[bytes]:
    """A publish's frames (method, content header, bodies) with the ``x-tidemq-origin`` header
    naming its first publish (relay_identity.py), set or replaced."""
    _, channel, header = pframe.unmarshal(frames[1])
    properties = header.properties  # type: ignore[union-attr]  # (a content header: the assembler's frames[1])
    properties.headers = {**(properties.headers or {}), ORIGIN_HEADER: origin_value(*origin)}
    return [frames[0], pframe.marshal(header, channel), *frames[2:]]
