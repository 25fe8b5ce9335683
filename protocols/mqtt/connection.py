# cython: annotation_typing=False
"""The server side of one MQTT connection, sans-IO (as h11's ``Connection``): fed bytes, it
yields the client's packets as events, gated by the connection's state; it turns the packets
the server sends into bytes in the negotiated version; and it keeps the per-connection protocol
state: topic aliases both ways, Receive Maximum counting both ways, inbound QoS 2 exchanges.

The events are the decoded packets themselves (packets.py): the PUBLISH hot path allocates
nothing more. What outlives the connection (a session's inflight table and its inbound QoS 2
packet ids, ``awaiting_release``) is the caller's, persisted with the session; the methods
here take and change those structures so the rules stay in one place.

Compiled by Cython (pyproject.toml ``[tool.tidemq] compiled``, docs/compiled.md):
``ServerConnection`` is an extension type whose counters and limits are C integers;
the same file runs interpreted with ``TIDEMQ_PURE_PYTHON=1``. Its annotations are for readers
and type checkers only (``annotation_typing=False``, first line): compiled, a ``str``, ``bytes``
or ``set`` annotation would refuse None, subclasses and other types the interpreted build takes.
C types are given by ``cython.locals`` and ``cython.declare``.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Container, Iterator, Mapping
from typing import Protocol

import cython

from .errors import LocalProtocolError, ProtocolViolation
from .packets import (
    MQTT_3_1_1,
    MQTT_5,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    Unsubscribe,
)
from .reader import PacketReader
from .reason_codes import ReasonCode
from .topics import TopicError, validate_topic_name
from .writer import encode

# a PUBACK 0 (type 4, remaining length 2, packet id): struct packs it in half the time of
# ``b"\x40\x02" + packet_id.to_bytes(2, "big")``
_PUBACK = struct.Struct(">BBH").pack
# protocol errors a 5.0 CONNACK can carry (MQTT 5.0 section 3.2.2.2)
_CONNACK_REFUSALS = frozenset((ReasonCode.UNSUPPORTED_PROTOCOL_VERSION, ReasonCode.MALFORMED_PACKET,
                               ReasonCode.PROTOCOL_ERROR, ReasonCode.PACKET_TOO_LARGE))
# what a client may send once connected (PUBLISH and PUBACK are tested for first: the hot path)
_FROM_CLIENT = frozenset((PubRec, PubRel, PubComp, Subscribe, Unsubscribe, PingReq, Disconnect))
_SUCCESS = ReasonCode.SUCCESS
_V5 = cython.declare(cython.int, MQTT_5)  # compiled, compared with the C-typed version


class State(enum.Enum):
    AWAIT_CONNECT = "await_connect"  # nothing read yet: the first packet must be CONNECT
    CONNECTING = "connecting"  # CONNECT read, its CONNACK not sent: nothing else may come
    CONNECTED = "connected"  # CONNACK 0 sent
    CLOSED = "closed"  # refused, disconnected or closed: nothing more is read or sent


# the states as module constants: compiled, C globals that need no enum attribute lookup
_AWAIT_CONNECT = cython.declare(object, State.AWAIT_CONNECT)
_CONNECTING = cython.declare(object, State.CONNECTING)
_CONNECTED = cython.declare(object, State.CONNECTED)
_CLOSED = cython.declare(object, State.CLOSED)


def free_packet_id(in_use: Container[int], start: int) -> int | None:
    """The first packet id from ``start`` on (1 to 65,535, wrapping) that ``in_use`` does not
    hold, or None when all are: ids are handed out in turn, so the first is nearly always free."""
    if start not in in_use:
        return start
    pid = start
    for _ in range(65_534):
        pid = pid % 65_535 + 1
        if pid not in in_use:
            return pid
    return None


class InflightEntry(Protocol):
    """A QoS 1/2 PUBLISH sent to the client and not yet acknowledged (the caller's record)."""

    qos: int
    released: bool  # QoS 2: PUBREC received, PUBREL sent, waiting for PUBCOMP


class PubRecAnswer(enum.Enum):
    RELEASE = "release"  # the entry is released: answer PUBREL
    REFUSED = "refused"  # the client refused the message: the exchange ends (no PUBREL)
    NOT_FOUND = "not_found"  # not a QoS 2 delivery of ours: answer PUBREL 0x92


@cython.cclass
class ServerConnection:
    """One client's protocol state. ``receive_data`` then iterate ``events()``; ``send(packet)``
    gives the bytes to write. ``RemoteProtocolError`` (errors.py) means the client broke the
    protocol (its ``reason_code`` closes the connection); ``LocalProtocolError`` that the
    caller asked to send something this state forbids."""

    if cython.compiled:  # an extension type's fields; interpreted, the same names as slots
        _aliases_in = cython.declare(dict)
        _aliases_out = cython.declare(dict)
        _reader = cython.declare(object)
        _unreleased = cython.declare(set)
        alias_max_out = cython.declare(cython.Py_ssize_t, visibility="public")
        client_max_packet = cython.declare(cython.Py_ssize_t, visibility="public")
        inbound_unacked = cython.declare(cython.Py_ssize_t, visibility="public")
        receive_maximum = cython.declare(cython.Py_ssize_t, visibility="public")
        send_quota = cython.declare(cython.Py_ssize_t, visibility="public")
        state = cython.declare(object, visibility="public")
        topic_alias_maximum = cython.declare(cython.Py_ssize_t, visibility="public")
        version = cython.declare(cython.int, visibility="public")
    else:
        __slots__ = (
            "_aliases_in",
            "_aliases_out",
            "_reader",
            "_unreleased",
            "alias_max_out",
            "client_max_packet",
            "inbound_unacked",
            "receive_maximum",
            "send_quota",
            "state",
            "topic_alias_maximum",
            "version",
        )

    def __init__(self, *, max_packet_size: int, receive_maximum: int, topic_alias_maximum: int,
                 send_quota: int) -> None:
        self.state = _AWAIT_CONNECT
        self.version = MQTT_3_1_1  # the CONNECT's protocol level, once one was read
        self._reader = PacketReader(max_packet_size)
        # our limits, announced in CONNACK (5.0)
        self.receive_maximum = receive_maximum
        self.topic_alias_maximum = topic_alias_maximum
        # the client's limits (5.0 CONNECT properties; ``send_quota`` until it says otherwise)
        self.send_quota = send_quota
        self.client_max_packet = 0  # 0: no limit
        self.alias_max_out = 0
        # made on first use (None until then): most connections never use topic aliases or
        # QoS 2, and an idle one should cost a few hundred bytes, not three empty containers
        self._aliases_in: dict[int, str] | None = None  # type: ignore[no-redef]  # (declared for Cython)
        self._aliases_out: dict[str, int] | None = None  # type: ignore[no-redef]
        # inbound QoS 1 publishes until their PUBACK, QoS 2 until their PUBCOMP (or a refusing
        # PUBREC): what counts against our Receive Maximum (MQTT 5.0 sections 3.3.4, 4.9)
        self.inbound_unacked = 0
        # QoS 2 packet ids PUBRECed on this connection
        self._unreleased: set[int] | None = None  # type: ignore[no-redef]  # (declared for Cython)

    # -- reading -------------------------------------------------------------------------------
    def receive_data(self, data: bytes) -> None:
        self._reader.feed(data)

    @property
    def buffered(self) -> int:
        return self._reader.buffered

    def events(self) -> Iterator[Packet]:
        """The client's packets, in order. The first is its CONNECT (the reader refuses anything
        else); the caller stops iterating there, and what follows waits in the reader until the
        CONNACK is sent; a second CONNECT is an error. A closed connection reads nothing."""
        if self.state is _CONNECTED:
            return self._connected_events()
        if self.state is _CLOSED:
            return iter(())
        return self._connect_event()

    def _connect_event(self) -> Iterator[Packet]:
        for packet in self._reader.packets():
            if self.state is not _AWAIT_CONNECT:  # read on before its CONNACK was sent
                raise ProtocolViolation("a packet before CONNECT completed")
            assert isinstance(packet, Connect)
            self.state = _CONNECTING
            self.version = packet.version
            yield packet

    def _connected_events(self) -> Iterator[Packet]:
        for packet in self._reader.packets():
            cls = type(packet)
            if cls is not Publish and cls is not PubAck and cls not in _FROM_CLIENT:
                if cls is Connect:
                    raise ProtocolViolation("a second CONNECT")
                if cls is Auth:
                    raise ProtocolViolation("AUTH without an authentication method")
                raise ProtocolViolation(f"a client must not send {cls.__name__.upper()}")
            yield packet

    def accepted(self, connect: Connect) -> None:
        """The CONNECT is accepted: its limits apply from now on; its CONNACK is sent next."""
        if self.state is not _CONNECTING:
            raise LocalProtocolError(f"accepting a CONNECT in state {self.state.name}")
        if self.version == _V5:
            props = connect.properties
            self.send_quota = props.receive_maximum or 65_535
            self.client_max_packet = props.maximum_packet_size or 0
            self.alias_max_out = props.topic_alias_maximum or 0

    def closed(self) -> None:
        self.state = _CLOSED

    # -- inbound PUBLISH and its acknowledgement ------------------------------------------------
    def inbound_publish(self, packet: Publish, awaiting_release: Container[int]) -> str | None:
        """The topic of a client's PUBLISH, its alias resolved, counted against our Receive
        Maximum until ``ack_publish``; None for a QoS 2 PUBLISH sent again whose first copy
        was taken (``awaiting_release``): answer it with ``PubRec`` again, nothing more."""
        topic = packet.topic
        if self.version == _V5:
            alias = packet.properties.topic_alias
            if alias is not None:
                if alias > self.topic_alias_maximum:
                    raise ProtocolViolation(f"topic alias {alias} above the maximum", ReasonCode.TOPIC_ALIAS_INVALID)
                if topic:
                    if self._aliases_in is None:
                        self._aliases_in = {}
                    self._aliases_in[alias] = topic
                else:
                    known = self._aliases_in.get(alias) if self._aliases_in is not None else None
                    if known is None:
                        raise ProtocolViolation(f"unknown topic alias {alias}")
                    topic = known
        try:
            validate_topic_name(topic)
        except TopicError as exc:
            raise ProtocolViolation(str(exc), ReasonCode.TOPIC_NAME_INVALID) from None
        qos = packet.qos
        if qos:
            if qos == 2 and packet.packet_id in awaiting_release:
                return None
            self.inbound_unacked += 1
            if self.inbound_unacked > self.receive_maximum and self.version == _V5:
                raise ProtocolViolation("more unacknowledged publishes than Receive Maximum",
                                        ReasonCode.RECEIVE_MAXIMUM_EXCEEDED)
        return topic

    def ack_publish(self, qos: int, packet_id: int, code: ReasonCode,
                    awaiting_release: set[int] | frozenset[int]) -> bytes:
        """PUBACK (QoS 1) or PUBREC (QoS 2) for a publish ``inbound_publish`` counted. A QoS 2
        one taken (code below 0x80) joins ``awaiting_release`` and stays counted until PUBREL."""
        if qos == 1 or code >= 0x80:
            self.inbound_unacked -= 1
        else:
            if self._unreleased is None:
                self._unreleased = set()
            self._unreleased.add(packet_id)
        if qos == 1:
            if code == _SUCCESS:  # the hot path: the same 4 bytes in 3.1.1 and 5.0
                return _PUBACK(0x40, 0x02, packet_id)
            return encode(PubAck(packet_id, code), self.version)
        if code < 0x80:
            assert isinstance(awaiting_release, set)  # (a QoS 2 one's is the session's own set)
            awaiting_release.add(packet_id)
        return encode(PubRec(packet_id, code), self.version)

    def release(self, packet_id: int, awaiting_release: set[int] | frozenset[int]) -> ReasonCode:
        """A PUBREL: the reason code of its PUBCOMP (SUCCESS: ``awaiting_release`` lost the id)."""
        if self._unreleased is not None and packet_id in self._unreleased:
            self._unreleased.discard(packet_id)
            self.inbound_unacked -= 1
        if packet_id in awaiting_release:
            assert isinstance(awaiting_release, set)  # (the shared empty frozenset holds no id)
            awaiting_release.discard(packet_id)
            return ReasonCode.SUCCESS
        return ReasonCode.PACKET_IDENTIFIER_NOT_FOUND

    # -- outbound PUBLISH ----------------------------------------------------------------------
    def window(self, inflight: Mapping[int, object]) -> int:
        """How many more QoS 1/2 PUBLISHes the client's Receive Maximum lets us send."""
        return self.send_quota - len(inflight)

    def alias_out(self, topic: str) -> tuple[str, int | None]:
        """(topic to send, Topic Alias) for a PUBLISH to the client, when it takes aliases
        (``alias_max_out``): a known topic goes as its alias alone; a new one gets the next
        alias while there are free ones."""
        if self._aliases_out is None:
            self._aliases_out = {}
        alias = self._aliases_out.get(topic)
        if alias is not None:
            return "", alias
        if len(self._aliases_out) < self.alias_max_out:
            alias = self._aliases_out[topic] = len(self._aliases_out) + 1
        return topic, alias

    def alias_unsent(self, topic: str) -> None:
        """The PUBLISH that was to announce ``topic``'s new alias was not sent."""
        if self._aliases_out is not None:
            self._aliases_out.pop(topic, None)

    def acked(self, packet: PubAck | PubComp, inflight: Mapping[int, InflightEntry]) -> InflightEntry | None:
        """The delivery a PUBACK (QoS 1) or PUBCOMP (QoS 2) ends (the caller settles it); None
        when it is not one of ours, or of the other QoS (ignored)."""
        entry = inflight.get(packet.packet_id)
        if entry is None or entry.qos != (1 if type(packet) is PubAck else 2):
            return None
        return entry

    def pubrec(self, packet: PubRec, inflight: Mapping[int, InflightEntry]) -> PubRecAnswer:
        """The second step of a QoS 2 delivery: the entry is released (MQTT 4.3.3), or ends."""
        entry = inflight.get(packet.packet_id)
        if entry is None or entry.qos != 2:
            return PubRecAnswer.NOT_FOUND
        if packet.reason_code >= 0x80:
            return PubRecAnswer.REFUSED
        entry.released = True
        return PubRecAnswer.RELEASE

    # -- writing -------------------------------------------------------------------------------
    def refusal(self, reason: ReasonCode) -> bytes:
        """What to send before closing on the client's protocol error ``reason`` while its
        CONNECT is not accepted: a refusing CONNACK where the client can read one, else nothing
        (once connected, a 5.0 server sends DISCONNECT instead)."""
        if self.state is _CONNECTED or self.state is _CLOSED:
            return b""
        if self.version == _V5 and reason in _CONNACK_REFUSALS:
            return self.send(ConnAck(False, reason))
        if reason == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION:
            # the client's level is unknown: answer in 3.1.1 (return code 1), as the spec asks
            self.state = _CLOSED
            return encode(ConnAck(False, reason), MQTT_3_1_1)
        return b""

    def send(self, packet: Packet) -> bytes:
        """The bytes of a packet the server sends, in the negotiated version."""
        state = self.state
        cls = type(packet)
        if state is _CONNECTED:
            if cls is ConnAck:
                raise LocalProtocolError("a second CONNACK")
            if cls is Disconnect and self.version != _V5:
                raise LocalProtocolError("DISCONNECT from a server exists only in MQTT 5.0")
        elif cls is ConnAck:
            if state is _CLOSED:
                raise LocalProtocolError("CONNACK on a closed connection")
            assert isinstance(packet, ConnAck)  # (its class is; this tells the type checker)
            if packet.reason_code >= 0x80:
                self.state = _CLOSED
            elif state is _CONNECTING:
                self.state = _CONNECTED
            else:
                raise LocalProtocolError("CONNACK 0 before a CONNECT")
        else:
            raise LocalProtocolError(f"{type(packet).__name__.upper()} before the CONNECT was accepted")
        return encode(packet, self.version)
