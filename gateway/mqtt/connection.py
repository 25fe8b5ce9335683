"""One MQTT client connection: an asyncio Protocol that feeds the sans-IO codec, handles each
packet type (as Mosquitto's handle_*.c) and runs the push side of push-pull delivery.

Delivery: a notify event (or an ack that frees the window) schedules ``pump``; the pump pulls
each queue the session reads from its cursor (through the node's queue cache), skips what the
session must not get, and writes PUBLISH bytes encoded once per variant for all subscribers.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid
from typing import TYPE_CHECKING

from protocols.mqtt.codec import PacketReader, encode
from protocols.mqtt.errors import MQTTError, ProtocolViolation
from protocols.mqtt.packets import (
    MQTT_5,
    Auth,
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
from protocols.mqtt.topics import TopicError, matches, parse_shared, validate_topic_name
from store import GetStatus, StoredMessage, StoreError

from .messages import StoreMessageFactory
from .queues import queue_for_filter
from .session import NEVER_EXPIRES, Inflight, QueueCursor, Session, SubscriptionState

if TYPE_CHECKING:
    from .broker import MQTTBroker

log = logging.getLogger("tidemq.mqtt")

_PINGRESP = encode(PingResp())
_PUBACK_HEAD = b"\x40\x02"
_PULL_BATCH = 64


class MQTTConnection(asyncio.Protocol):
    def __init__(self, broker: MQTTBroker) -> None:
        self.broker = broker
        self.settings = broker.settings
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.reader = PacketReader(self.settings.max_packet_size)
        self.version = 4
        self.session: Session | None = None
        self.client_id = ""
        self.username: str | None = None
        self.connecting = False
        self.closed = False
        self.will = None
        self.keep_alive = 0
        self.last_received = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None
        self._pump_scheduled = False
        self._writing_paused = False
        self._out: list[bytes] = []
        # client-side limits (5.0 CONNECT properties)
        self.send_quota = self.settings.max_inflight
        self.client_max_packet = 0  # 0: no limit
        self.alias_max_out = 0
        self._aliases_out: dict[str, int] = {}
        self._aliases_in: dict[int, str] = {}
        self._inbound_unacked = 0  # QoS 1/2 publishes not yet acknowledged to the client
        self._pending_puts = 0  # publishes handed to the store, not yet stored
        self._read_check = None  # the ACL's per-message read check, when deny rules need it
        self._reading_paused = False

    # -- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
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
        self.reader.feed(data)
        self._process()

    def _process(self) -> None:
        batch: list = []
        try:
            for packet in self.reader.packets():
                if self.closed:
                    return
                if self.session is None:
                    if self.connecting or not isinstance(packet, Connect):
                        # packets after CONNECT but before its CONNACK wait in the reader
                        raise ProtocolViolation("a packet before CONNECT completed")
                    self.connecting = True
                    self.transport.pause_reading()  # type: ignore[union-attr]
                    asyncio.get_running_loop().create_task(self._connect(packet))
                    return
                if isinstance(packet, Publish):
                    self._on_publish(packet, batch)
                else:
                    if batch:
                        self._submit_publishes(batch)
                        batch = []
                    self._dispatch(packet)
        except MQTTError as exc:
            if batch:
                self._submit_publishes(batch)
            self.protocol_error(exc.reason_code, str(exc))
            return
        if batch:
            self._submit_publishes(batch)
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        self._detach(graceful=False)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self.schedule_pump()

    # -- writing and closing -------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        self._out.append(data)

    def flush(self) -> None:
        if self._out and self.transport is not None and not self.closed:
            data = b"".join(self._out) if len(self._out) > 1 else self._out[0]
            self._out.clear()
            self.broker.stats.bytes_sent += len(data)
            self.transport.write(data)
        else:
            self._out.clear()

    def send_packet(self, packet: Packet) -> None:
        self.send(encode(packet, self.version))

    def close(self) -> None:
        self.flush()
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()
            self._detach(graceful=False)

    def disconnect(self, reason: ReasonCode, message: str) -> None:
        """Server-side close: DISCONNECT with a reason code first in 5.0, then close."""
        if self.closed:
            return
        if self.version == MQTT_5 and self.session is not None:
            props = Properties(reason_string=message[:200]) if message else Properties()
            self.send_packet(Disconnect(reason, props))
        self.close()

    def protocol_error(self, reason: ReasonCode, message: str) -> None:
        log.info("closing connection client_id=%s peer=%s reason=0x%02X error=%r",
                 self.client_id or "-", self.peer, reason, message)
        if self.session is None and self.version == MQTT_5 and reason in (
            ReasonCode.UNSUPPORTED_PROTOCOL_VERSION, ReasonCode.MALFORMED_PACKET, ReasonCode.PROTOCOL_ERROR,
            ReasonCode.PACKET_TOO_LARGE,
        ) and self.reader.version == MQTT_5:
            self.send_packet(ConnAck(False, reason))
        elif self.session is None and reason == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION:
            # the client's level is unknown: answer in 3.1.1 (return code 1), as the spec asks
            self.send(encode(ConnAck(False, reason), 4))
        self.disconnect(reason, message)

    def shutdown(self) -> None:
        self.disconnect(ReasonCode.SERVER_SHUTTING_DOWN, "server shutting down")

    def _check_alive(self) -> None:
        if self.closed:
            return
        loop = asyncio.get_running_loop()
        if self.session is None and not self.connecting:
            log.info("no CONNECT in time peer=%s", self.peer)
            self.close()
            return
        if self.keep_alive:
            limit = self.keep_alive * 1.5
            idle = time.monotonic() - self.last_received
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
        self.connecting = False
        if not accepted or self.closed:
            return
        self.transport.resume_reading()  # type: ignore[union-attr]
        self._resend_inflight()
        self.pump()
        self._process()  # packets that arrived behind the CONNECT

    async def _accept(self, packet: Connect) -> bool:
        broker = self.broker
        self.version = packet.version
        props = packet.properties
        refuse = None
        client_id = packet.client_id
        assigned = None
        if not client_id:
            if not packet.clean_start and self.version != MQTT_5:
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
        self.client_id = client_id
        self._messages = StoreMessageFactory(client_id)
        self.username = packet.username
        acl = broker.acl
        if acl is not None and acl.checks_deliveries(self.username, client_id):  # type: ignore[attr-defined]
            self._read_check = acl.allows_read  # type: ignore[attr-defined]
        # takeover: the newest connection wins
        old = broker.connections.get(client_id)
        if old is not None and old is not self:
            log.info("session taken over client_id=%s old_peer=%s new_peer=%s", client_id, old.peer, self.peer)
            old.disconnect(ReasonCode.SESSION_TAKEN_OVER, "another connection uses this client id")
        broker.cancel_will(client_id)
        expiry = (props.session_expiry_interval or 0) if self.version == MQTT_5 else (
            0 if packet.clean_start else NEVER_EXPIRES)
        session = broker.sessions.get(client_id)
        session_present = False
        if session is not None and (packet.clean_start or session.expired()):
            broker.end_session(session)
            session = None
        if session is None:
            session = Session(client_id, self.version, expiry)
            broker.sessions[client_id] = session
        else:
            session_present = True
            session.version = self.version
            session.expiry_interval = expiry
        session.disconnected_at = None
        self.session = session
        broker.connections[client_id] = self
        self.will = packet.will
        # limits the client asked for
        if self.version == MQTT_5:
            self.send_quota = props.receive_maximum or 65_535
            self.client_max_packet = props.maximum_packet_size or 0
            self.alias_max_out = props.topic_alias_maximum or 0
        self.keep_alive = packet.keep_alive
        connack_props = Properties()
        if self.version == MQTT_5:
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
        log.debug("client connected client_id=%s peer=%s version=%d", client_id, self.peer, self.version)
        return True

    async def _authenticate(self, packet: Connect, client_id: str) -> ReasonCode | None:
        auth = self.broker.authenticator
        if packet.username is None and packet.password is None:
            return None if self.settings.allow_anonymous else ReasonCode.NOT_AUTHORIZED
        if auth is None:
            return None if self.settings.allow_anonymous else ReasonCode.BAD_USER_NAME_OR_PASSWORD
        ok = await auth.verify_async(packet.username or "", packet.password or b"")  # type: ignore[attr-defined]
        return None if ok else ReasonCode.BAD_USER_NAME_OR_PASSWORD

    # -- packet dispatch -----------------------------------------------------------------------
    def _dispatch(self, packet: Packet) -> None:
        if isinstance(packet, PubAck):
            self._on_puback(packet)
        elif isinstance(packet, PubRec):
            self._on_pubrec(packet)
        elif isinstance(packet, PubComp):
            self._on_pubcomp(packet)
        elif isinstance(packet, PubRel):
            self._on_pubrel(packet)
        elif isinstance(packet, Subscribe):
            self._on_subscribe(packet)
        elif isinstance(packet, Unsubscribe):
            self._on_unsubscribe(packet)
        elif isinstance(packet, PingReq):
            self.send(_PINGRESP)
        elif isinstance(packet, Disconnect):
            self._on_disconnect(packet)
        elif isinstance(packet, Connect):
            raise ProtocolViolation("a second CONNECT")
        elif isinstance(packet, Auth):
            raise ProtocolViolation("AUTH without an authentication method")
        else:
            raise ProtocolViolation(f"a client must not send {type(packet).__name__.upper()}")

    # -- PUBLISH from the client ---------------------------------------------------------------
    def _on_publish(self, packet: Publish, batch: list) -> None:
        session = self.session
        assert session is not None
        topic = packet.topic
        props = packet.properties
        if self.version == MQTT_5 and props.topic_alias is not None:
            alias = props.topic_alias
            if alias > self.settings.topic_alias_maximum:
                raise ProtocolViolation(f"topic alias {alias} above the maximum", ReasonCode.TOPIC_ALIAS_INVALID)
            if topic:
                self._aliases_in[alias] = topic
            else:
                known = self._aliases_in.get(alias)
                if known is None:
                    raise ProtocolViolation(f"unknown topic alias {alias}")
                topic = known
        try:
            validate_topic_name(topic)
        except TopicError as exc:
            raise ProtocolViolation(str(exc), ReasonCode.TOPIC_NAME_INVALID) from None
        if packet.qos and packet.packet_id in session.awaiting_release and packet.qos == 2:
            self.send_packet(PubRec(packet.packet_id))  # a resent QoS 2 PUBLISH: stored once already
            return
        if packet.qos:
            self._inbound_unacked += 1
            if self._inbound_unacked > self.settings.receive_maximum and self.version == MQTT_5:
                raise ProtocolViolation("more unacknowledged publishes than Receive Maximum",
                                        ReasonCode.RECEIVE_MAXIMUM_EXCEEDED)
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
            log.info("publish refused client_id=%s topic=%s reason=0x%02X", self.client_id, topic, refuse)
            if packet.qos == 0:
                if refuse == ReasonCode.PAYLOAD_FORMAT_INVALID and self.version == MQTT_5:
                    raise ProtocolViolation("payload is not UTF-8", refuse)
                return
            # 3.1.1 has no negative acknowledgement: the publish is acknowledged and dropped
            self._ack_inbound(packet, refuse if self.version == MQTT_5 else ReasonCode.SUCCESS)
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
            fut = broker.store.put_batch_nowait(items)
        except StoreError as exc:
            self._publishes_failed(batch, exc)
            return
        # back-pressure: a publisher with many puts still on their way to the store stops
        # being read until they are stored, so ingest cannot starve delivery or grow memory
        self._pending_puts += len(batch)
        if self._pending_puts > self.settings.max_pending_puts and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]
        if any(p.retain for p, _ in batch):
            retained = [(topic, bool(p.payload)) if p.retain else None for p, topic in batch]
            fut.add_done_callback(lambda f: broker.record_retained(retained, f))
        fut.add_done_callback(lambda f: self._publishes_stored(batch, f))

    def _publishes_stored(self, batch: list[tuple[Publish, str]], fut: asyncio.Future) -> None:
        self._pending_puts -= len(batch)
        if self._reading_paused and self._pending_puts <= self.settings.max_pending_puts // 2 and not self.closed:
            self._reading_paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]
        if fut.cancelled() or fut.exception() is not None:
            self._publishes_failed(batch, fut.exception() if not fut.cancelled() else None)
            return
        if self.closed:
            return
        for packet, _ in batch:
            if packet.qos:
                self._ack_inbound(packet, ReasonCode.SUCCESS)
        self.flush()

    def _publishes_failed(self, batch: list[tuple[Publish, str]], exc: BaseException | None) -> None:
        log.error("publish not stored client_id=%s count=%d error=%s", self.client_id, len(batch), exc)
        if self.closed:
            return
        if self.version != MQTT_5:  # no negative acknowledgement in 3.1.1: the client resends
            self.close()
            return
        for packet, _ in batch:
            if packet.qos:
                self._ack_inbound(packet, ReasonCode.UNSPECIFIED_ERROR)
        self.flush()

    def _ack_inbound(self, packet: Publish, code: ReasonCode) -> None:
        self._inbound_unacked -= 1
        assert packet.packet_id is not None
        if packet.qos == 1:
            if code == ReasonCode.SUCCESS:  # the hot path: the same 4 bytes in 3.1.1 and 5.0
                self.send(_PUBACK_HEAD + packet.packet_id.to_bytes(2, "big"))
            else:
                self.send_packet(PubAck(packet.packet_id, code))
        else:
            if code < 0x80:
                self.session.awaiting_release.add(packet.packet_id)  # type: ignore[union-attr]
                self.broker.mark_dirty(self.session)  # type: ignore[arg-type]
            self.send_packet(PubRec(packet.packet_id, code))

    def _on_pubrel(self, packet: PubRel) -> None:
        session = self.session
        assert session is not None
        if packet.packet_id in session.awaiting_release:
            session.awaiting_release.discard(packet.packet_id)
            self.broker.mark_dirty(session)
            self.send_packet(PubComp(packet.packet_id))
        else:
            self.send_packet(PubComp(packet.packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))

    # -- acknowledgements of our PUBLISHes ------------------------------------------------------
    def _settle(self, packet_id: int) -> Inflight | None:
        session = self.session
        assert session is not None
        inflight = session.inflight.pop(packet_id, None)
        if inflight is None:
            return None
        if inflight.share is not None:
            group = self.broker.share_groups.get(inflight.share)
            if group is not None:
                group.acked(inflight.offset)
        else:
            cursor = session.cursors.get(inflight.queue)
            if cursor is not None:
                cursor.unacked.pop(inflight.offset, None)
        self.broker.mark_dirty(session)
        self.schedule_pump()
        return inflight

    def _on_puback(self, packet: PubAck) -> None:
        inflight = self.session.inflight.get(packet.packet_id)  # type: ignore[union-attr]
        if inflight is None or inflight.qos != 1:
            log.debug("PUBACK for unknown packet id client_id=%s id=%d", self.client_id, packet.packet_id)
            return
        self._settle(packet.packet_id)

    def _on_pubrec(self, packet: PubRec) -> None:
        session = self.session
        assert session is not None
        inflight = session.inflight.get(packet.packet_id)
        if inflight is None or inflight.qos != 2:
            self.send_packet(PubRel(packet.packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))
            return
        if packet.reason_code >= 0x80:  # the client refused it: the exchange ends here
            self._settle(packet.packet_id)
            return
        inflight.released = True
        self.broker.mark_dirty(session)
        self.send_packet(PubRel(packet.packet_id))

    def _on_pubcomp(self, packet: PubComp) -> None:
        inflight = self.session.inflight.get(packet.packet_id)  # type: ignore[union-attr]
        if inflight is None or inflight.qos != 2:
            return
        self._settle(packet.packet_id)

    def _resend_inflight(self) -> None:
        """After a reconnect: unacknowledged PUBLISHes again with DUP, PUBRELs again (in order)."""
        session = self.session
        assert session is not None
        store = self.broker.store
        for inflight in list(session.inflight.values()):
            if inflight.released:
                self.send_packet(PubRel(inflight.packet_id))
                continue
            message = store.read_at(inflight.position)
            if message is None:  # removed by retention meanwhile
                self._settle(inflight.packet_id)
                continue
            message.queue, message.queue_offset = inflight.queue, inflight.offset
            if not self._send_message(message, inflight.qos, None, inflight.packet_id, dup=True):
                self._settle(inflight.packet_id)
        self.flush()

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
                codes.append(ReasonCode.TOPIC_FILTER_INVALID if self.version == MQTT_5 else SUBACK_FAILURE_V3)
                continue
            if group is not None and request.no_local and self.version == MQTT_5:
                raise ProtocolViolation("No Local on a shared subscription")
            if not self._allowed(topic_filter, write=False):
                codes.append(ReasonCode.NOT_AUTHORIZED if self.version == MQTT_5 else SUBACK_FAILURE_V3)
                continue
            key = request.topic_filter  # "$share/g/f" stays distinct from a plain "f"
            request.topic_filter = topic_filter
            queue = queue_for_filter(topic_filter)
            existing = session.subscriptions.get(key)
            state = SubscriptionState(request, queue, group, identifier)
            session.subscriptions[key] = state
            if existing is None:
                broker.wildcards.add(topic_filter)
                if group is not None:
                    broker.join_share(key, self)
                else:
                    if queue not in session.cursors:
                        session.cursors[queue] = QueueCursor(queue, broker.store.max_offset_now(queue))
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
                self._send_retained(state, message)
        broker.mark_dirty(session)
        self.schedule_pump()

    def _send_retained(self, state: SubscriptionState, message: StoredMessage) -> None:
        delivery = self.broker.delivery(message)
        remaining = delivery.remaining_expiry()
        if remaining is not None and remaining <= 0:
            self.broker.set_retained(message.topic, None)  # an expired retained message is gone
            return
        qos = min(state.options.qos, delivery.qos)
        packet_id = None
        if qos:
            packet_id = self.session.allocate_packet_id()  # type: ignore[union-attr]
            if packet_id is None:
                return
            self.session.inflight[packet_id] = Inflight(packet_id, "", -1, qos, message.position)  # type: ignore[union-attr]
        sub_ids = (state.identifier,) if state.identifier else ()
        if not self._send_message(message, qos, sub_ids, packet_id, retain=True, remaining=remaining) \
                and packet_id is not None:
            self.session.inflight.pop(packet_id, None)  # type: ignore[union-attr]

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
            self.broker.wildcards.remove(state.topic_filter)
            if state.share_group is not None:
                self.broker.leave_share(topic_filter, self, self._take_shared_inflight(topic_filter))
                continue
            if state.queue not in session.queues_read():
                cursor = session.cursors.pop(state.queue, None)
                self.broker.remove_reader(state.queue, self)
                if cursor is not None:  # inflight messages of that queue finish, without a cursor
                    cursor.unacked.clear()
        self.send_packet(UnsubAck(packet.packet_id, codes if self.version == MQTT_5 else []))
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
                broker.leave_share(key, self, self._take_shared_inflight(key, session))
        session.disconnected_at = time.time()
        will, self.will = self.will, None
        if session.expiry_interval == 0:
            broker.end_session(session)
        else:
            broker.mark_dirty(session)
        if will is not None:
            delay = will.properties.will_delay_interval or 0 if self.version == MQTT_5 else 0
            if session.expiry_interval == 0 or delay == 0:
                broker.publish_will(self.client_id, will)
            else:
                broker.schedule_will(session, will, min(delay, session.expiry_interval))

    # -- shared subscriptions (shared.py chooses the member) -------------------------------------
    def shared_subscription(self, key: str) -> SubscriptionState | None:
        return self.session.subscriptions.get(key) if self.session is not None else None

    @property
    def writing_paused(self) -> bool:
        return self._writing_paused

    def has_window(self) -> bool:
        return self.session is not None and self.send_quota - len(self.session.inflight) > 0

    def deliver_shared(self, key: str, message: StoredMessage, qos: int, state: SubscriptionState,
                       remaining: int | None) -> bool:
        session = self.session
        assert session is not None
        if self._read_check is not None and not self._read_check(self.username, self.client_id, message.topic):
            return False  # an ACL deny rule: this member does not get it (the group moves on)
        packet_id = None
        if qos:
            packet_id = session.allocate_packet_id()
            if packet_id is None:
                return False
        sub_ids = (state.identifier,) if state.identifier else ()
        if not self._send_message(message, qos, sub_ids, packet_id, remaining=remaining):
            return False
        if packet_id is not None:
            session.inflight[packet_id] = Inflight(packet_id, message.queue, message.queue_offset, qos,
                                                   message.position, share=key)
        return True

    def _take_shared_inflight(self, key: str, session: Session | None = None) -> list[StoredMessage]:
        """Remove this session's unacknowledged deliveries for a shared subscription and return
        the messages, for the group to give to another member (a QoS 2 message whose PUBREC
        came is the member's already and stays)."""
        session = session or self.session
        assert session is not None
        taken = []
        for pid, inflight in list(session.inflight.items()):
            if inflight.share == key and not inflight.released:
                del session.inflight[pid]
                message = self.broker.store.read_at(inflight.position)
                if message is not None:
                    message.queue, message.queue_offset = inflight.queue, inflight.offset
                    taken.append(message)
        return taken

    # -- delivery (push side of push-pull) -----------------------------------------------------
    def schedule_pump(self) -> None:
        if not self._pump_scheduled and not self.closed:
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self.pump)

    def pump(self) -> None:
        self._pump_scheduled = False
        session = self.session
        if session is None or self.closed or self.connecting:
            return
        broker = self.broker
        read = broker.reader.read
        for queue in list(session.cursors):
            cursor = session.cursors.get(queue)
            if cursor is None:
                continue
            needs_quota = self._queue_needs_quota(queue)
            if not needs_quota:
                self._drop_qos0_backlog(cursor)
            while not self._writing_paused:
                if needs_quota and self.send_quota - len(session.inflight) <= 0:
                    break
                result = read(queue, cursor.next_offset, _PULL_BATCH)
                if result.status != GetStatus.FOUND:
                    if result.status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW):
                        log.info("cursor moved client_id=%s queue=%s from=%d to=%d", self.client_id, queue,
                                 cursor.next_offset, result.next_offset)
                        cursor.next_offset = result.next_offset
                        broker.mark_dirty(session)
                        continue
                    break
                if not self._deliver_batch(cursor, result.messages):
                    break
        self.flush()

    def _drop_qos0_backlog(self, cursor: QueueCursor) -> None:
        """A QoS 0 reader that fell more than max_queued_messages behind skips ahead (counted
        as dropped), as brokers drop QoS 0 for slow consumers; QoS 1/2 stays in the store."""
        behind = self.broker.store.max_offset_now(cursor.queue) - cursor.next_offset
        excess = behind - self.settings.max_queued_messages
        if excess > 0:
            cursor.next_offset += excess
            self.broker.stats.publish_dropped += excess
            log.info("qos 0 backlog dropped client_id=%s queue=%s count=%d", self.client_id, cursor.queue, excess)

    def _queue_needs_quota(self, queue: str) -> bool:
        session = self.session
        return any(s.options.qos > 0 for s in session.subscriptions.values() if s.queue == queue)  # type: ignore[union-attr]

    def _deliver_batch(self, cursor: QueueCursor, messages: list[StoredMessage]) -> bool:
        """Send what the session should get; False when the window is full (stop pulling)."""
        session = self.session
        assert session is not None
        broker = self.broker
        queue = cursor.queue
        subs = [s for s in session.subscriptions.values() if s.share_group is None]
        # every message of a queue matches the subscription that reads it (that is how it got
        # there); only the session's other subscriptions need the topic matched
        own = [s for s in subs if s.queue == queue]
        others = [s for s in subs if s.queue != queue]
        no_local = any(s.options.no_local for s in subs)
        unacked = cursor.unacked
        read_check = self._read_check
        for message in messages:
            offset = message.queue_offset
            if unacked and offset in unacked:  # restored QoS 2 inflight, resent from the inflight table
                cursor.next_offset = offset + 1
                continue
            if read_check is not None and not read_check(self.username, self.client_id, message.topic):
                cursor.next_offset = offset + 1  # a deny rule of the ACL: not for this client
                continue
            delivery = broker.delivery(message)
            matched = own + [s for s in others if matches(s.topic_filter, message.topic)] if others else own
            if no_local and delivery.publisher == self.client_id:
                matched = [s for s in matched if not s.options.no_local]
            if not matched:
                cursor.next_offset = offset + 1
                continue
            # overlapping subscriptions: the message is delivered once, from the queue of the
            # matching subscription with the highest QoS (ties: the smallest queue name); the
            # other queues skip it, so no per-session set of seen message ids is needed
            primary = matched[0] if len(matched) == 1 else max(matched, key=lambda s: (s.options.qos, _neg(s.queue)))
            if primary.queue != queue:
                cursor.next_offset = offset + 1
                continue
            qos = min(delivery.qos, primary.options.qos)
            remaining = delivery.remaining_expiry()
            if remaining is not None and remaining <= 0:
                cursor.next_offset = offset + 1
                continue
            packet_id = None
            if qos:
                if self.send_quota - len(session.inflight) <= 0:
                    return False
                packet_id = session.allocate_packet_id()
                if packet_id is None:
                    return False
            sub_ids = tuple(s.identifier for s in matched if s.identifier)
            retain = delivery.retain and any(s.options.retain_as_published for s in matched)
            cursor.next_offset = offset + 1
            if not self._send_message(message, qos, sub_ids, packet_id, retain=retain, remaining=remaining):
                continue
            if packet_id is not None:
                session.inflight[packet_id] = Inflight(packet_id, queue, offset, qos, message.position)
                cursor.unacked[offset] = packet_id
                if qos == 2:
                    broker.mark_dirty(session)
            if self._writing_paused:
                return False
        broker.mark_dirty(session)
        return True

    def _send_message(self, message: StoredMessage, qos: int, sub_ids: tuple[int, ...] | None,
                      packet_id: int | None, *, retain: bool = False, dup: bool = False,
                      remaining: int | None = None) -> bool:
        """Write one PUBLISH; False if the client's Maximum Packet Size forbids it (dropped)."""
        broker = self.broker
        delivery = broker.delivery(message)
        topic = message.topic
        send_topic = topic
        alias = None
        if self.version == MQTT_5:
            if remaining is None:
                remaining = delivery.remaining_expiry()
            if self.alias_max_out:
                alias = self._aliases_out.get(topic)
                if alias is not None:
                    send_topic = ""
                elif len(self._aliases_out) < self.alias_max_out:
                    alias = self._aliases_out[topic] = len(self._aliases_out) + 1
            props_key = (sub_ids or (), remaining, alias)

            def make_props() -> Properties:
                base = delivery.props or Properties()
                return base.copy(subscription_identifiers=list(sub_ids or ()), message_expiry_interval=remaining
                                 if remaining is not None else base.message_expiry_interval, topic_alias=alias)
        else:
            props_key = ()
            make_props = _no_props

        template = broker.template(message, send_topic, qos, retain, self.version, props_key, make_props)
        if self.client_max_packet and len(template.data) > self.client_max_packet:
            broker.stats.publish_dropped += 1
            if alias is not None and send_topic:  # the alias was never announced
                self._aliases_out.pop(topic, None)
            return False
        self.send(template.render(packet_id, dup))
        broker.stats.messages_sent += 1
        return True


def _no_props() -> None:
    return None  # below 5.0 a PUBLISH has no properties


def _neg(text: str) -> tuple[int, ...]:
    """Sort key that makes max() prefer the smallest string."""
    return tuple(-ord(c) for c in text)
