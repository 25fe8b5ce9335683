"""One MQTT client connection: a thin asyncio Protocol (as uvicorn's) around the sans-IO
ServerConnection (protocols/mqtt/connection.py), which says what each packet means and may
follow what; this owns the transport, the keep-alive timer and read pauses, and hands each
packet to its handler: CONNECT and the end (connect.py), PUBLISH (inbound.py), SUBSCRIBE
(subscribe.py); what goes out unasked (delivery and its acks) is outbound.py's."""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from protocols.mqtt.codec import encode
from protocols.mqtt.connection import ServerConnection, State
from protocols.mqtt.errors import MQTTError
from protocols.mqtt.packets import (
    MQTT_5,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    Unsubscribe,
    Will,
)
from protocols.mqtt.properties import Properties
from protocols.mqtt.reason_codes import ReasonCode
from store import StoreError

from ..deadlines import Deadlines, Slot
from ..read_pauses import ReadPauses
from .connect import connect, detach, disconnect_received
from .inbound import Inbound
from .outbound import Delivery
from .presence import SERVER_CLOSED, SOCKET_CLOSED, SOCKET_ERROR, server_reason
from .session import Session
from .subscribe import subscribe, unsubscribe

if TYPE_CHECKING:
    from ..trace import Tracer
    from .broker import MQTTBroker
    from .settings import MQTTSettings

log = logging.getLogger("tidemq.mqtt")

_PINGRESP = encode(PingResp())
LINGER_S = 2.0  # after refusing an oversized packet, the longest its rest is read and dropped


class MQTTConnection(asyncio.Protocol):
    # An idle client costs what this object and the transport hold, thousands of times over:
    # slots, and its inbound and outbound components made on first use (``inbound``, ``delivery``)
    __slots__ = ("_delivery", "_held", "_inbound", "_ready", "_timer", "broker", "client_id", "closed", "conn",
                 "connected_at", "connecting", "ended", "keep_alive", "last_received", "out", "read_check",
                 "read_pauses", "session", "tracer", "transport", "username", "will")

    def __init__(self, broker: MQTTBroker, tracer: Tracer | None = None) -> None:
        self.broker = broker
        self.tracer = tracer  # this listener's message trace, when it is on
        self.transport: asyncio.Transport | None = None
        settings = broker.settings
        # the protocol state (sans-IO): what may come when, the negotiated version, topic
        # aliases and Receive Maximum both ways, inbound QoS 2 exchanges
        self.conn = ServerConnection(max_packet_size=settings.max_packet_size, receive_maximum=settings.receive_maximum,
                                     topic_alias_maximum=settings.topic_alias_maximum, send_quota=settings.max_inflight)
        self.session: Session | None = None
        self.client_id = ""
        self.username: str | None = None
        self.connecting = False
        self.closed = False
        self.will: Will | None = None
        self.keep_alive = 0
        self.connected_at: int | None = None  # ms since the epoch, once accepted (presence.py)
        self.ended: tuple[str, int | None] | None = None  # why it ended, first cause only (presence.py)
        self.last_received = time.monotonic()
        self._timer: Slot | None = None  # the connect timeout's or keep-alive's (broker.deadlines)
        self.out = bytearray()  # what is written at the next flush (push.py renders PUBLISHes into it)
        # the ACL's per-message read check (username, client id, topic), when deny rules need it
        self.read_check: Callable[[str | None, str, str], bool] | None = None
        # "connect", "puts" (too many on their way), "alarm", "subscribers" (ingest_gate.py)
        self.read_pauses = ReadPauses()
        self._held: Publish | Subscribe | None = None  # read while the resource alarm is raised, or being prepared
        self._ready: Subscribe | None = None  # a SUBSCRIBE whose reads were fetched
        self._inbound: Inbound | None = None
        self._delivery: Delivery | None = None

    @property
    def inbound(self) -> Inbound:
        """The client's PUBLISHes to the store, and their acks (made by its first PUBLISH)."""
        if self._inbound is None:
            self._inbound = Inbound(self)
        return self._inbound

    @property
    def delivery(self) -> Delivery:
        """What goes out unasked: PUBLISHes and their acks (made when first needed)."""
        if self._delivery is None:
            self._delivery = Delivery(self)
        return self._delivery

    @property
    def settings(self) -> MQTTSettings:
        return self.broker.settings

    @property
    def peer(self) -> str:
        """The client's address, for logs (asked of the transport, not kept per connection)."""
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        return f"{peer[0]}:{peer[1]}" if peer else "?"

    @property
    def version(self) -> int:
        """The negotiated protocol level (ServerConnection keeps it)."""
        return self.conn.version

    # -- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # (a Transport: every listener gives one)
        self.read_pauses.transport = self.transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        settings = self.broker.settings
        # (low given, not computed by the transport: an int above 256 is 32 bytes per connection;
        # the ignore: a Transport, as every listener gives)
        transport.set_write_buffer_limits(high=settings.write_buffer_high, low=settings.write_buffer_low)  # type: ignore[attr-defined]
        self._timer = self.broker.deadlines.later(settings.connect_timeout_s, self)
        self.broker.stats.connections_total += 1

    def data_received(self, data: bytes) -> None:
        if self.closed:  # (lingering after an oversized packet: the rest of it is dropped)
            return
        self.broker.stats.bytes_received += len(data)
        self.last_received = time.monotonic()
        self.conn.receive_data(data)
        self.process()
        if self.conn.buffered:
            self.broker.stalled.watch(self)

    def process(self, held: Publish | Subscribe | None = None) -> None:
        try:
            self._process(held)
        finally:
            if self._delivery is not None:
                self._delivery.pusher.acks_done()  # the read progress of the PUBACKs read, marked once

    def _process(self, held: Publish | Subscribe | None) -> None:
        batch: list = []
        pressure = self.broker.pressure
        gate = self.broker.gate
        packets = self.conn.events()
        receive = self._inbound.receive if self._inbound is not None else None
        on_ack = self._delivery.pusher.on_ack if self._delivery is not None else None
        try:
            for packet in itertools.chain((held,), packets) if held is not None else packets:
                if self.closed:
                    return
                if packet.__class__ is PubAck:  # a subscriber's hot path: straight to the delivery core
                    if batch:
                        self.inbound.submit(batch)
                        batch = []
                    if on_ack is None:
                        on_ack = self.delivery.pusher.on_ack
                    on_ack(packet)
                    continue
                if packet.__class__ is Connect:  # (the only packet before CONNACK: conn gates them)
                    self.connecting = True
                    self.read_pauses.pause("connect")
                    asyncio.get_running_loop().create_task(connect(self, packet))
                    return
                if isinstance(packet, Publish):
                    if pressure is not None and pressure.raised:
                        # the store's resource alarm: this publish and what follows it wait
                        # (unread, in order) until it clears
                        self._held = packet
                        self.read_pauses.pause("alarm")
                        break
                    if gate.waiting:  # subscribers wait for their sockets: they go first
                        self._held = packet
                        self.read_pauses.pause("subscribers")
                        gate.hold(self)
                        break
                    if receive is None:
                        receive = self.inbound.receive
                    receive(packet, batch)
                else:
                    if batch:
                        self.inbound.submit(batch)
                        batch = []
                    if isinstance(packet, Subscribe):
                        if packet is self._ready:
                            self._ready = None
                        else:
                            fetching = self.broker.reads.prepare_subscribe(packet)
                            if fetching is not None:  # what it reads first is fetched (a gateway node's store node)
                                self._held = packet
                                self.read_pauses.pause("store")
                                asyncio.get_running_loop().create_task(self._prepared(fetching))
                                break
                    if self._delivery is not None:
                        self._delivery.pusher.acks_done()  # (marked before anything else is handled, as each ack was)
                    self._dispatch(packet)
        except MQTTError as exc:
            if batch:
                self.inbound.submit(batch)
            self.protocol_error(exc.reason_code, str(exc))
            return
        if batch:
            self.inbound.submit(batch)
        self.flush()

    async def _prepared(self, fetching) -> None:
        """A held SUBSCRIBE goes on once what it reads is here."""
        held, reads = self._held, self.broker.reads
        assert isinstance(held, Subscribe)
        try:
            await fetching
        except StoreError as exc:  # the store node did not answer: the client retries
            log.warning("subscribe not prepared client_id=%s error=%s", self.client_id, exc)
            self.close()
            return
        finally:
            if self.closed:
                reads.subscribed(held)
        self._held = None
        self._ready = held
        self.read_pauses.resume("store")
        try:
            self.process(held)
        finally:
            reads.subscribed(held)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.ended is None:
            self.ended = (SOCKET_CLOSED if exc is None else SOCKET_ERROR, None)
        self.closed = True
        self.broker.saves.drop(self)
        self.conn.closed()
        Deadlines.cancel(self._timer, self)
        self._timer = None
        self.broker.stalled.forget(self)
        self._leave_gate()
        detach(self)

    def ingest_open(self) -> None:
        """The ingest gate opened: the held publish and what follows it are read now."""
        if "subscribers" in self.read_pauses and not self.closed:
            held, self._held = self._held, None
            self.read_pauses.resume("subscribers")
            self.process(held)

    def resource_alarm(self, reason: str | None) -> None:
        """The store's resource alarm was raised (a reason) or cleared (None). A client that
        publishes while it is raised is not read from until it clears (MQTT has no way to tell
        it why; its keepalive is not enforced meanwhile); subscribers go on receiving."""
        if reason is None and "alarm" in self.read_pauses and not self.closed:
            held, self._held = self._held, None
            self.read_pauses.resume("alarm")
            self.process(held)

    # -- the transport's flow control: the delivery component's ----------------------------------
    def pause_writing(self) -> None:
        self.delivery.pause_writing()

    def resume_writing(self) -> None:
        self.delivery.resume_writing()

    # -- writing and closing -------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        self.out += data

    def flush(self) -> None:
        """What was sent goes to the socket -- once the session's changes it depends on are
        durable (the write-ahead rule: session_saves.py)."""
        if self.out and self.transport is not None and not self.closed:
            data = bytes(self.out)
            self.out.clear()
            self.broker.saves.write(self, data, self.client_id)
        else:
            self.out.clear()

    def write_now(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.broker.stats.bytes_sent += len(data)
            self.transport.write(data)

    def released(self) -> None:
        if self.closed and self.transport is not None:
            self.transport.close()  # (it closed while its last bytes waited for its session's write)

    def abort(self) -> None:
        """Its session could not be written: what waited for that write never leaves; a 5.0
        client is told why (DISCONNECT 0x80), a 3.1.1 one has no way to be: it is closed."""
        self.out.clear()
        if self.closed:
            if self.transport is not None:
                self.transport.close()
            return
        if self.conn.version == MQTT_5 and self.conn.state is State.CONNECTED:
            self.ended = (server_reason(ReasonCode.UNSPECIFIED_ERROR), int(ReasonCode.UNSPECIFIED_ERROR))
            self.write_now(self.conn.send(Disconnect(ReasonCode.UNSPECIFIED_ERROR,
                                                     Properties(reason_string="the session could not be stored"))))
        self._close()

    def send_packet(self, packet: Packet) -> None:
        if not self.closed:  # (what is sent after the close is dropped, as flush drops it)
            self.send(self.conn.send(packet))

    def close(self) -> None:
        self.flush()
        self._close()

    def _close(self) -> None:
        if self.transport is not None and not self.closed:
            if self.ended is None:
                self.ended = (SERVER_CLOSED, None)
            self.closed = True
            self.conn.closed()
            if self.ended[1] == ReasonCode.PACKET_TOO_LARGE:
                # The client is most likely still writing that packet: closing now, with its
                # bytes unread, would reset the connection and lose the DISCONNECT 0x95 on the
                # way, so the rest is read and dropped until the client closes, or LINGER_S.
                asyncio.get_running_loop().call_later(LINGER_S, self.transport.close)
            elif not self.broker.saves.holds(self):  # (else once what it holds is written: released)
                self.transport.close()
            self._leave_gate()
            detach(self)

    def _leave_gate(self) -> None:
        if self._delivery is not None:
            self._delivery.leave_gate()
        else:
            self.broker.gate.forget(self)

    def disconnect(self, reason: ReasonCode, message: str) -> None:
        """Server-side close: DISCONNECT with a reason code first in 5.0, then close."""
        if self.closed:
            return
        if self.ended is None:
            self.ended = (server_reason(reason), int(reason))
        if self.conn.version == MQTT_5 and self.conn.state is State.CONNECTED:
            props = Properties(reason_string=message[:200]) if message else Properties()
            self.send_packet(Disconnect(reason, props))
        self.close()

    def protocol_error(self, reason: ReasonCode, message: str) -> None:
        log.info("closing connection client_id=%s peer=%s reason=0x%02X error=%r",
                 self.client_id or "-", self.peer, reason, message)
        if not self.closed:
            refusal = self.conn.refusal(reason)  # before CONNACK: a refusing one, where it is read
            if refusal:
                self.send(refusal)
        self.disconnect(reason, message)

    def shutdown(self) -> None:
        self.disconnect(ReasonCode.SERVER_SHUTTING_DOWN, "server shutting down")

    def restart_keep_alive(self) -> None:
        """The CONNECT was accepted: its keep alive (1.5 times, MQTT 3.1.2.10) replaces the
        connect timeout."""
        Deadlines.cancel(self._timer, self)
        self._timer = None
        if self.keep_alive:
            self._timer = self.broker.deadlines.later(self.keep_alive * 1.5, self)

    def allowed(self, topic: str, *, write: bool) -> bool:
        acl = self.broker.acl
        if acl is None:
            return True
        if write:
            return acl.allows_publish(self.username, self.client_id, topic)
        return acl.allows_subscribe(self.username, self.client_id, topic)

    def deadline_reached(self) -> None:
        """The connect timeout, or the keep alive's (then: is it still alive?)."""
        self._timer = None
        if self.closed:
            return
        if self.conn.state is State.AWAIT_CONNECT:
            log.info("no CONNECT in time peer=%s", self.peer)
            self.close()
            return
        if self.keep_alive:
            limit = self.keep_alive * 1.5
            idle = time.monotonic() - self.last_received
            if self.read_pauses.reasons:  # we are not reading: its packets wait in the socket
                idle = 0.0
            if idle >= limit:
                log.info("keep alive timeout client_id=%s keep_alive=%d", self.client_id, self.keep_alive)
                self.disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT, "keep alive timeout")
                return
            self._timer = self.broker.deadlines.later(limit - idle + 0.05, self)

    def stalled_since(self) -> float | None:
        if self.closed or not self.conn.buffered:
            return None
        if self.read_pauses.reasons:  # we are not reading: the rest may wait in the socket
            self.last_received = time.monotonic()
        return self.last_received

    def read_timed_out(self) -> None:
        log.info("packet unfinished, closing client_id=%s peer=%s buffered=%d timeout_s=%s", self.client_id or "-",
                 self.peer, self.conn.buffered, self.settings.read_timeout_s)
        self.close()

    # -- packet dispatch -----------------------------------------------------------------------
    def _dispatch(self, packet: Packet) -> None:
        if isinstance(packet, (PubAck, PubComp)):
            self.delivery.pusher.on_ack(packet)
        elif isinstance(packet, PubRec):
            self.delivery.on_pubrec(packet)
        elif isinstance(packet, PubRel):
            self.inbound.on_pubrel(packet)
        elif isinstance(packet, Subscribe):
            subscribe(self, packet)
        elif isinstance(packet, Unsubscribe):
            unsubscribe(self, packet)
        elif isinstance(packet, PingReq):
            self.send(_PINGRESP)
        else:  # DISCONNECT: conn.events() lets through only what a client may send
            assert isinstance(packet, Disconnect)
            disconnect_received(self, packet)
