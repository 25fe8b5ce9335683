"""One MQTT client connection: an asyncio Protocol that feeds the sans-IO codec and handles
each packet type (as Mosquitto's handle_*.c): CONNECT, inbound PUBLISH, SUBSCRIBE, DISCONNECT.
What goes out to the client (delivery, acks of it) is in outbound.py."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import socket
import time
import uuid
from typing import TYPE_CHECKING

from protocols.mqtt.codec import encode
from protocols.mqtt.connection import ServerConnection, State
from protocols.mqtt.errors import MQTTError, ProtocolViolation
from protocols.mqtt.packets import (
    MQTT_5,
    ConnAck,
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
    RetainHandling,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
)
from protocols.mqtt.properties import Properties
from protocols.mqtt.reason_codes import SUBACK_FAILURE_V3, ReasonCode
from protocols.mqtt.topics import TopicError, parse_shared, validate_topic_name
from store import StoredMessage, StoreError

from ..core.cursor import Cursor
from ..core.ingest import PutPipeline, Refused
from ..interop import queue_for_filter
from ..read_pauses import ReadPauses
from .messages import StoreMessageFactory
from .outbound import Delivery
from .session import NEVER_EXPIRES, Session, SubscriptionState

if TYPE_CHECKING:
    from ..trace import Tracer
    from .broker import MQTTBroker

log = logging.getLogger("tidemq.mqtt")

_PINGRESP = encode(PingResp())


class MQTTConnection(asyncio.Protocol):
    def __init__(self, broker: MQTTBroker, tracer: Tracer | None = None) -> None:
        self.broker = broker
        self.tracer = tracer  # this listener's message trace, when it is on
        self.settings = broker.settings
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        settings = self.settings
        # the protocol state (sans-IO): what may come when, the negotiated version, topic
        # aliases and Receive Maximum both ways, inbound QoS 2 exchanges
        self.conn = ServerConnection(max_packet_size=settings.max_packet_size, receive_maximum=settings.receive_maximum,
                                     topic_alias_maximum=settings.topic_alias_maximum, send_quota=settings.max_inflight)
        self.session: Session | None = None
        self.client_id = ""
        self.username: str | None = None
        self.connecting = False
        self.closed = False
        self.will = None
        self.keep_alive = 0
        self.last_received = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None
        self.out: list[bytes] = []  # what is written at the next flush
        self.read_check = None  # the ACL's per-message read check, when deny rules need it
        # "connect", "puts" (too many on their way), "alarm", "subscribers" (ingest_gate.py)
        self.read_pauses = ReadPauses()
        self.puts = PutPipeline(broker.store, self.read_pauses, listener="mqtt", watcher=tracer)  # the ingest path
        self._held: Publish | Subscribe | None = None  # read while the resource alarm is raised, or being prepared
        self._ready: Subscribe | None = None  # a SUBSCRIBE whose reads were fetched (gateway nodes)
        self.delivery = Delivery(self)  # what goes out unasked: PUBLISHes and their acks

    # -- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.read_pauses.transport = self.transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        transport.set_write_buffer_limits(high=self.settings.write_buffer_high)  # type: ignore[attr-defined]
        self._timer = asyncio.get_running_loop().call_later(self.settings.connect_timeout_s, self._check_alive)
        self.broker.stats.connections_total += 1

    def data_received(self, data: bytes) -> None:
        self.broker.stats.bytes_received += len(data)
        self.last_received = time.monotonic()
        self.conn.receive_data(data)
        self._process()

    def _process(self, held: Publish | None = None) -> None:
        batch: list = []
        pressure = self.broker.pressure
        gate = self.broker.gate
        packets = self.conn.events()
        try:
            for packet in itertools.chain((held,), packets) if held is not None else packets:
                if self.closed:
                    return
                if packet.__class__ is Connect:  # (the only packet before CONNACK: conn gates them)
                    self.connecting = True
                    self.read_pauses.pause("connect")
                    asyncio.get_running_loop().create_task(self._connect(packet))
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
                    self._on_publish(packet, batch)
                else:
                    if batch:
                        self._submit_publishes(batch)
                        batch = []
                    if isinstance(packet, Subscribe) and self.broker.node is not None:
                        if packet is self._ready:
                            self._ready = None
                        else:
                            fetching = self.broker.node.prepare_subscribe(self.session, packet)
                            if fetching is not None:  # what it reads first comes from the store node
                                self._held = packet
                                self.read_pauses.pause("store")
                                asyncio.get_running_loop().create_task(self._prepared(fetching))
                                break
                    self._dispatch(packet)
        except MQTTError as exc:
            if batch:
                self._submit_publishes(batch)
            self.protocol_error(exc.reason_code, str(exc))
            return
        if batch:
            self._submit_publishes(batch)
        self.flush()

    async def _prepared(self, fetching) -> None:
        """A held SUBSCRIBE goes on once what it reads is here (a gateway node's)."""
        held, node = self._held, self.broker.node
        assert isinstance(held, Subscribe) and node is not None
        try:
            await fetching
        except StoreError as exc:  # the store node did not answer: the client retries
            log.warning("subscribe not prepared client_id=%s error=%s", self.client_id, exc)
            self.close()
            return
        finally:
            if self.closed:
                node.subscribed(held)
        self._held = None
        self._ready = held
        self.read_pauses.resume("store")
        try:
            self._process(held)
        finally:
            node.subscribed(held)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.conn.closed()
        if self._timer is not None:
            self._timer.cancel()
        self.delivery.leave_gate()
        self._detach(graceful=False)

    def ingest_open(self) -> None:
        """The ingest gate opened: the held publish and what follows it are read now."""
        if "subscribers" in self.read_pauses and not self.closed:
            held, self._held = self._held, None
            self.read_pauses.resume("subscribers")
            self._process(held)  # type: ignore[arg-type]

    def resource_alarm(self, reason: str | None) -> None:
        """The store's resource alarm was raised (a reason) or cleared (None). A client that
        publishes while it is raised is not read from until it clears (MQTT has no way to tell
        it why; its keepalive is not enforced meanwhile); subscribers go on receiving."""
        if reason is None and "alarm" in self.read_pauses and not self.closed:
            held, self._held = self._held, None
            self.read_pauses.resume("alarm")
            self._process(held)

    # -- for the broker's readers and the transport: the delivery component's --------------------
    def pump(self) -> None:
        self.delivery.pump()

    def schedule_pump(self) -> None:
        self.delivery.schedule_pump()

    def pause_writing(self) -> None:
        self.delivery.pause_writing()

    def resume_writing(self) -> None:
        self.delivery.resume_writing()

    # -- writing and closing -------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        self.out.append(data)

    def flush(self) -> None:
        if self.out and self.transport is not None and not self.closed:
            data = b"".join(self.out) if len(self.out) > 1 else self.out[0]
            self.out.clear()
            self.broker.stats.bytes_sent += len(data)
            self.transport.write(data)
        else:
            self.out.clear()

    def send_packet(self, packet: Packet) -> None:
        self.send(self.conn.send(packet))

    def close(self) -> None:
        self.flush()
        if self.transport is not None and not self.closed:
            self.closed = True
            self.conn.closed()
            self.transport.close()
            self.delivery.leave_gate()
            self._detach(graceful=False)

    def disconnect(self, reason: ReasonCode, message: str) -> None:
        """Server-side close: DISCONNECT with a reason code first in 5.0, then close."""
        if self.closed:
            return
        if self.conn.version == MQTT_5 and self.conn.state is State.CONNECTED:
            props = Properties(reason_string=message[:200]) if message else Properties()
            self.send_packet(Disconnect(reason, props))
        self.close()

    def protocol_error(self, reason: ReasonCode, message: str) -> None:
        log.info("closing connection client_id=%s peer=%s reason=0x%02X error=%r",
                 self.client_id or "-", self.peer, reason, message)
        connected = self.conn.state is State.CONNECTED
        if not connected and self.conn.version == MQTT_5 and reason in (
            ReasonCode.UNSUPPORTED_PROTOCOL_VERSION, ReasonCode.MALFORMED_PACKET, ReasonCode.PROTOCOL_ERROR,
            ReasonCode.PACKET_TOO_LARGE,
        ):
            self.send_packet(ConnAck(False, reason))
        elif not connected and reason == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION:
            # the client's level is unknown: answer in 3.1.1 (return code 1), as the spec asks
            self.send(encode(ConnAck(False, reason), 4))
        self.disconnect(reason, message)

    def shutdown(self) -> None:
        self.disconnect(ReasonCode.SERVER_SHUTTING_DOWN, "server shutting down")

    def _check_alive(self) -> None:
        if self.closed:
            return
        loop = asyncio.get_running_loop()
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
            self._timer = loop.call_later(limit - idle + 0.05, self._check_alive)

    # -- CONNECT -------------------------------------------------------------------------------
    async def _connect(self, packet: Connect) -> None:
        try:
            accepted = await self._accept(packet)
        except Exception:
            log.exception("CONNECT failed client_id=%s", packet.client_id)
            accepted = False
            if not self.closed:
                self.send_packet(ConnAck(False, ReasonCode.UNSPECIFIED_ERROR))
                self.close()
        resend: dict[int, StoredMessage | None] = {}
        if accepted and not self.closed:
            try:
                resend = await self.delivery.inflight_messages()  # (still connecting: its cursors wait meanwhile)
            except StoreError as exc:  # not known whether they are gone: the session keeps them
                log.warning("inflight messages not read client_id=%s error=%s", self.client_id, exc)
                self.disconnect(ReasonCode.UNSPECIFIED_ERROR, "the gateway could not read the session's messages")
        self.connecting = False
        if not accepted or self.closed:
            return
        self.read_pauses.resume("connect")
        self.delivery.resend_inflight(resend)
        self.delivery.pump()
        self._process()  # packets that arrived behind the CONNECT

    async def _accept(self, packet: Connect) -> bool:
        broker = self.broker
        version = self.conn.version
        props = packet.properties
        refuse = None
        client_id = packet.client_id
        assigned = None
        if not client_id:
            if not packet.clean_start and version != MQTT_5:
                refuse = ReasonCode.CLIENT_IDENTIFIER_NOT_VALID
            client_id = assigned = f"tidemq-{uuid.uuid4().hex[:20]}"
        if props.authentication_method is not None:
            refuse = ReasonCode.BAD_AUTHENTICATION_METHOD  # no enhanced authentication methods
        if refuse is None:
            refuse = await self._authenticate(packet, client_id)
        if refuse is None and packet.will is not None:
            try:
                validate_topic_name(packet.will.topic)
            except TopicError:
                refuse = ReasonCode.TOPIC_NAME_INVALID
            else:
                acl = broker.acl
                if packet.will.topic.startswith("$") or (acl is not None and not acl.allows_publish(  # type: ignore[attr-defined]
                        packet.username, client_id, packet.will.topic)):
                    refuse = ReasonCode.NOT_AUTHORIZED
        if self.closed:
            return False
        if refuse is not None:
            log.info("connection refused client_id=%s peer=%s reason=0x%02X", client_id, self.peer, refuse)
            self.send_packet(ConnAck(False, refuse))
            self.close()
            return False
        self.client_id = self.puts.who = client_id
        self._messages = StoreMessageFactory(client_id)
        self.username = packet.username
        acl = broker.acl
        if acl is not None and acl.checks_deliveries(self.username, client_id):  # type: ignore[attr-defined]
            self.read_check = acl.allows_read  # type: ignore[attr-defined]
        if broker.node is not None and not broker.node.store.connected:
            log.info("connection refused: no store node client_id=%s", client_id)
            self.send_packet(ConnAck(False, ReasonCode.SERVER_UNAVAILABLE))
            self.close()
            return False
        if broker.node is not None:
            old = broker.connections.get(client_id)
            if old is not None:  # a takeover on this node: the old connection writes the session back
                log.info("session taken over client_id=%s old_peer=%s new_peer=%s", client_id, old.peer, self.peer)
                old.disconnect(ReasonCode.SESSION_TAKEN_OVER, "another connection uses this client id")
            await broker.node.claim(client_id)  # disconnected on any other node, session saved
            await broker.node.load_session(broker, client_id)  # from the store node (after the write above)
            if self.closed:
                return False
        # takeover: the newest connection wins
        old = broker.connections.get(client_id)
        if old is not None and old is not self:
            log.info("session taken over client_id=%s old_peer=%s new_peer=%s", client_id, old.peer, self.peer)
            old.disconnect(ReasonCode.SESSION_TAKEN_OVER, "another connection uses this client id")
        broker.cancel_will(client_id)
        expiry = (props.session_expiry_interval or 0) if version == MQTT_5 else (
            0 if packet.clean_start else NEVER_EXPIRES)
        session = broker.sessions.get(client_id)
        session_present = False
        if session is not None and (packet.clean_start or session.expired()):
            broker.end_session(session)
            session = None
        if session is None:
            session = Session(client_id, version, expiry)
            broker.sessions[client_id] = session
        else:
            session_present = True
            session.version = version
            session.expiry_interval = expiry
        session.disconnected_at = None
        self.session = session
        broker.connections[client_id] = self
        self.will = packet.will
        self.conn.accepted(packet)  # the limits the client asked for apply from now on
        self.keep_alive = packet.keep_alive
        connack_props = Properties()
        if version == MQTT_5:
            connack_props.receive_maximum = self.settings.receive_maximum
            connack_props.maximum_packet_size = self.settings.max_packet_size
            connack_props.topic_alias_maximum = self.settings.topic_alias_maximum
            if assigned is not None:
                connack_props.assigned_client_identifier = assigned
            if props.request_response_information == 1:
                # the basis of response topics this client may use (MQTT 5.0 section 4.10)
                connack_props.response_information = f"response/{client_id}"
            cap = self.settings.max_keepalive
            if cap and (self.keep_alive == 0 or self.keep_alive > cap):
                self.keep_alive = cap
                connack_props.server_keep_alive = cap
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.keep_alive:
            self._timer = asyncio.get_running_loop().call_later(self.keep_alive * 1.5, self._check_alive)
        self.send_packet(ConnAck(session_present, ReasonCode.SUCCESS, connack_props))
        for queue in session.queues_read():
            broker.add_reader(queue, self)
        for key, state in session.subscriptions.items():
            if state.share_group is not None:
                broker.join_share(key, self)
        broker.mark_dirty(session)
        log.debug("client connected client_id=%s peer=%s version=%d", client_id, self.peer, version)
        return True

    async def _authenticate(self, packet: Connect, client_id: str) -> ReasonCode | None:
        auth = self.broker.authenticator
        if packet.username is None and packet.password is None:
            if self.settings.allow_anonymous:
                return None
            self.broker.stats.auth_failures += 1
            return ReasonCode.NOT_AUTHORIZED
        if auth is None:
            return None if self.settings.allow_anonymous else ReasonCode.BAD_USER_NAME_OR_PASSWORD
        ok = await auth.verify_async(packet.username or "", packet.password or b"")  # type: ignore[attr-defined]
        if not ok:
            self.broker.stats.auth_failures += 1
        return None if ok else ReasonCode.BAD_USER_NAME_OR_PASSWORD

    # -- packet dispatch -----------------------------------------------------------------------
    def _dispatch(self, packet: Packet) -> None:
        if isinstance(packet, PubAck):
            self.delivery.on_puback(packet)
        elif isinstance(packet, PubRec):
            self.delivery.on_pubrec(packet)
        elif isinstance(packet, PubComp):
            self.delivery.on_pubcomp(packet)
        elif isinstance(packet, PubRel):
            self._on_pubrel(packet)
        elif isinstance(packet, Subscribe):
            self._on_subscribe(packet)
        elif isinstance(packet, Unsubscribe):
            self._on_unsubscribe(packet)
        elif isinstance(packet, PingReq):
            self.send(_PINGRESP)
        else:  # DISCONNECT: conn.events() lets through only what a client may send
            assert isinstance(packet, Disconnect)
            self._on_disconnect(packet)

    # -- PUBLISH from the client ---------------------------------------------------------------
    def _on_publish(self, packet: Publish, batch: list) -> None:
        session = self.session
        assert session is not None
        topic = self.conn.inbound_publish(packet, session.awaiting_release)
        if topic is None:
            self.send_packet(PubRec(packet.packet_id))  # a resent QoS 2 PUBLISH: stored once already
            return
        props = packet.properties
        self.broker.stats.messages_received += 1
        refuse = None
        if props.payload_format_indicator == 1:
            try:
                packet.payload.decode("utf-8")
            except UnicodeDecodeError:
                refuse = ReasonCode.PAYLOAD_FORMAT_INVALID
        if refuse is None and (topic.startswith("$") or not self._allowed(topic, write=True)):
            refuse = ReasonCode.NOT_AUTHORIZED
        if refuse is not None:
            # (ACL refusals are counted and logged, rate-limited, by gateway/auth/authorize.py)
            log.debug("publish refused client_id=%s topic=%s reason=0x%02X", self.client_id, topic, refuse)
            if packet.qos == 0:
                if refuse == ReasonCode.PAYLOAD_FORMAT_INVALID and self.conn.version == MQTT_5:
                    raise ProtocolViolation("payload is not UTF-8", refuse)
                return
            # 3.1.1 has no negative acknowledgement: the publish is acknowledged and dropped
            self._ack_inbound(packet, refuse if self.conn.version == MQTT_5 else ReasonCode.SUCCESS)
            return
        batch.append((packet, topic))

    def _allowed(self, topic: str, *, write: bool) -> bool:
        acl = self.broker.acl
        if acl is None:
            return True
        if write:
            return acl.allows_publish(self.username, self.client_id, topic)  # type: ignore[attr-defined]
        return acl.allows_subscribe(self.username, self.client_id, topic)  # type: ignore[attr-defined]

    def _submit_publishes(self, batch: list[tuple[Publish, str]]) -> None:
        broker = self.broker
        queues_for = broker.wildcards.queues_for
        make = self._messages.message
        items = [(make(p, topic), queues_for(topic)) for p, topic in batch]
        try:
            # a publish the store cannot take is refused alone; the others read with it go on
            self.puts.submit(items, lambda fut, refused: self._publishes_stored(batch, fut, refused))
        except StoreError as exc:
            self._publishes_failed(batch, exc)
            return

    def _publishes_stored(self, batch: list[tuple[Publish, str]], fut: asyncio.Future, refused: Refused) -> None:
        """Acknowledge in the order the publishes came (MQTT 4.6), each refused one where it was."""
        if any(p.retain for p, _ in batch):
            stored = [publish for i, publish in enumerate(batch) if i not in refused] if refused else batch
            self.broker.record_retained([(topic, bool(p.payload)) if p.retain else None for p, topic in stored], fut)
        if fut.cancelled() or fut.exception() is not None:
            self._publishes_failed(batch, fut.exception() if not fut.cancelled() else None)
            return
        if self.closed:
            return
        for i, (packet, topic) in enumerate(batch):
            if i in refused:
                self._publish_refused(packet, topic, refused[i])
                if self.closed:
                    return
            elif packet.qos:
                self._ack_inbound(packet, ReasonCode.SUCCESS)
        self.flush()

    def _publishes_failed(self, batch: list[tuple[Publish, str]], exc: BaseException | None) -> None:
        self.broker.limited_log.log(logging.ERROR, type(exc).__name__, "publish not stored client_id=%s count=%d error=%s",
                                    self.client_id, len(batch), json.dumps(str(exc)))
        if self.closed:
            return
        if self.conn.version != MQTT_5:  # no negative acknowledgement in 3.1.1: the client resends
            self.close()
            return
        for packet, _ in batch:
            if packet.qos:
                self._ack_inbound(packet, ReasonCode.UNSPECIFIED_ERROR)
        self.flush()

    def _publish_refused(self, packet: Publish, topic: str, exc: StoreError) -> None:
        """A publish the store refused alone (too large once stored with its queue list, or
        invalid): 5.0 answers it with a negative acknowledgement (a QoS 0 one has none:
        DISCONNECT 0x95); 3.1.1 has no negative acknowledgement, so the connection closes."""
        self.broker.limited_log.log(logging.WARNING, type(exc).__name__,
                                    "publish refused by the store client_id=%s topic=%s error=%s",
                                    self.client_id, json.dumps(topic), json.dumps(str(exc)))
        if self.conn.version != MQTT_5:
            self.close()
        elif not packet.qos:
            self.disconnect(ReasonCode.PACKET_TOO_LARGE, str(exc))
        else:
            self._ack_inbound(packet, ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)

    def _ack_inbound(self, packet: Publish, code: ReasonCode) -> None:
        session = self.session
        assert packet.packet_id is not None and session is not None
        self.send(self.conn.ack_publish(packet.qos, packet.packet_id, code, session.awaiting_release))
        if packet.qos == 2 and code < 0x80:
            self.broker.mark_dirty(session)

    def _on_pubrel(self, packet: PubRel) -> None:
        session = self.session
        assert session is not None
        code = self.conn.release(packet.packet_id, session.awaiting_release)
        if code == ReasonCode.SUCCESS:
            self.broker.mark_dirty(session)
        self.send_packet(PubComp(packet.packet_id, code))

    # -- SUBSCRIBE / UNSUBSCRIBE ---------------------------------------------------------------
    def _on_subscribe(self, packet: Subscribe) -> None:
        session = self.session
        assert session is not None
        broker = self.broker
        codes: list[int] = []
        identifier = packet.properties.subscription_identifiers[0] if packet.properties.subscription_identifiers else None
        retained_to_send: list[tuple[SubscriptionState, list[StoredMessage]]] = []
        for request in packet.subscriptions:
            try:
                group, topic_filter = parse_shared(request.topic_filter)
            except TopicError as exc:
                log.info("subscribe refused client_id=%s filter=%r error=%s", self.client_id, request.topic_filter, exc)
                codes.append(ReasonCode.TOPIC_FILTER_INVALID if self.conn.version == MQTT_5 else SUBACK_FAILURE_V3)
                continue
            if group is not None and request.no_local and self.conn.version == MQTT_5:
                raise ProtocolViolation("No Local on a shared subscription")
            if not self._allowed(topic_filter, write=False):
                codes.append(ReasonCode.NOT_AUTHORIZED if self.conn.version == MQTT_5 else SUBACK_FAILURE_V3)
                continue
            key = request.topic_filter  # "$share/g/f" stays distinct from a plain "f"
            request.topic_filter = topic_filter
            queue = queue_for_filter(topic_filter)
            existing = session.subscriptions.get(key)
            state = SubscriptionState(request, queue, group, identifier)
            session.subscriptions[key] = state
            if existing is None:
                broker.hold_filter(session, topic_filter)
                if group is not None:
                    broker.join_share(key, self)
                else:
                    if queue not in session.cursors:
                        session.cursors[queue] = Cursor(queue, broker.store.max_offset_now(queue))
                    broker.add_reader(queue, self)
            codes.append(request.qos)
            rh = request.retain_handling
            # retained messages are not sent for shared subscriptions (MQTT 5.0 section 4.8.2)
            if group is None and (rh == RetainHandling.SEND_ON_SUBSCRIBE
                                  or (rh == RetainHandling.SEND_IF_NEW_SUBSCRIPTION and existing is None)):
                retained_to_send.append((state, broker.retained_matching(topic_filter)))
        self.send_packet(SubAck(packet.packet_id, codes))
        for state, messages in retained_to_send:
            for message in messages:
                self.delivery.send_retained(state, message)
        broker.mark_dirty(session)
        self.delivery.schedule_pump()

    def _on_unsubscribe(self, packet: Unsubscribe) -> None:
        session = self.session
        assert session is not None
        codes = []
        for topic_filter in packet.topic_filters:
            state = session.subscriptions.pop(topic_filter, None)
            if state is None:
                codes.append(ReasonCode.NO_SUBSCRIPTION_EXISTED)
                continue
            codes.append(ReasonCode.SUCCESS)
            self.broker.release_filter(session, state.topic_filter)
            if state.share_group is not None:
                self.broker.leave_share(topic_filter, self, self.delivery.take_shared_inflight(topic_filter))
                continue
            if state.queue not in session.queues_read():
                cursor = session.cursors.pop(state.queue, None)
                self.broker.remove_reader(state.queue, self)
                if cursor is not None:  # inflight messages of that queue finish, without a cursor
                    cursor.unacked.clear()
        self.send_packet(UnsubAck(packet.packet_id, codes if self.conn.version == MQTT_5 else []))
        self.broker.mark_dirty(session)

    # -- DISCONNECT and connection end ---------------------------------------------------------
    def _on_disconnect(self, packet: Disconnect) -> None:
        session = self.session
        assert session is not None
        expiry = packet.properties.session_expiry_interval
        if expiry is not None:
            if session.expiry_interval == 0 and expiry != 0:
                raise ProtocolViolation("session expiry set at DISCONNECT after 0 at CONNECT")
            session.expiry_interval = expiry
        if packet.reason_code != ReasonCode.DISCONNECT_WITH_WILL_MESSAGE:
            self.will = None
        self.close()

    def _detach(self, *, graceful: bool) -> None:
        session = self.session
        if session is None:
            return
        self.session = None
        broker = self.broker
        if broker.connections.get(self.client_id) is not self:
            return  # taken over: the session belongs to the new connection now
        del broker.connections[self.client_id]
        for queue in session.queues_read():
            broker.remove_reader(queue, self)
        for key, state in list(session.subscriptions.items()):
            if state.share_group is not None:
                broker.leave_share(key, self, self.delivery.take_shared_inflight(key, session))
        session.disconnected_at = time.time()
        will, self.will = self.will, None
        if session.expiry_interval == 0:
            broker.end_session(session)
        else:
            broker.mark_dirty(session)
        if broker.node is not None:  # a gateway node: written now, then offline in the lookup
            broker.flush_sessions()
            broker.node.client_gone(self.client_id)
        if will is not None:
            delay = will.properties.will_delay_interval or 0 if self.conn.version == MQTT_5 else 0
            if session.expiry_interval == 0 or delay == 0:
                broker.publish_will(self.client_id, will)
            else:
                broker.schedule_will(session, will, min(delay, session.expiry_interval))
