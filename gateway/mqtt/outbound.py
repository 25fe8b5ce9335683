"""The outbound side of an MQTT connection (``Delivery``, a component it owns): the push half of
push-pull delivery, shared-subscription deliveries, retained messages on subscribe, and the
acknowledgements of what was sent (PUBACK / PUBREC / PUBCOMP, resending after a reconnect).

A notify event (or an ack that frees the window) schedules ``pump``; the pump pulls each queue
the session reads from its cursor (through the node's queue cache), skips what the session
must not get, and writes PUBLISH bytes encoded once per variant for all subscribers.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from protocols.mqtt.connection import PubRecAnswer
from protocols.mqtt.packets import MQTT_5, PubAck, PubComp, PubRec, PubRel
from protocols.mqtt.properties import Properties
from protocols.mqtt.reason_codes import ReasonCode
from protocols.mqtt.topics import matches
from store import StoredMessage

from ..core.cursor import Cursor
from .messages import Delivery as MessageDelivery
from .messages import DeliveryMemo
from .roles import Owner
from .session import NO_ENTRIES, Inflight, Session, SubscriptionState

if TYPE_CHECKING:
    from ..trace import Tracer

log = logging.getLogger("tidemq.mqtt")

PULL_BATCH = 64  # messages per store read of one queue
FLUSH_EVERY = 256  # PUBLISHes a pump gathers before it writes them (and may find the socket full)


class Delivery:
    """What one MQTTConnection sends its client unasked: a component the connection owns (it
    writes through the connection's buffer, and reads its session and client id), made when
    first needed (a subscription, a session with something to deliver): an idle client has none.
    No bound methods are kept (64 bytes each, per connection): the connection's are looked up."""

    __slots__ = ("_out", "_paused_at", "_pump_scheduled", "_stall_timer", "_window_full", "broker", "conn",
                 "connection", "deliveries", "settings", "slow", "tracer", "writing_paused")

    def __init__(self, connection: Owner) -> None:
        self.connection = connection
        # fixed for the connection's life: kept here, off the per-message attribute chain
        self.broker = connection.broker
        self.settings = connection.settings
        self.tracer: Tracer | None = connection.tracer
        self.conn = connection.conn  # the protocol state: version, the client's limits, aliases
        self._out = connection.out  # what the connection writes at its next flush
        self.deliveries: DeliveryMemo = self.broker.deliveries
        self._pump_scheduled = False
        self._window_full = False  # the last pump stopped at the client's window (an ack then pumps again)
        self.writing_paused = False  # the transport's buffer is above its high-water mark
        # its socket stalled (or it has not caught up since it connected): its QoS 0 backlog is
        # cut to max_queued_messages and publishers do not wait for it; true until it has
        # caught up, so a backlog from before it connected is cut. Made after the CONNECT was
        # handled (by a first SUBSCRIBE), it starts caught up: the session had nothing to send
        self.slow = connection.connecting or connection.session is None
        self._paused_at = 0.0  # loop time of the last pause_writing
        self._stall_timer: asyncio.TimerHandle | None = None  # runs out when the socket has not drained in time

    # -- acknowledgements of our PUBLISHes ------------------------------------------------------
    def settle(self, packet_id: int) -> Inflight | None:
        session = self.connection.session
        assert session is not None
        inflight = session.inflight.pop(packet_id, None)
        if inflight is None:
            return None
        if inflight.share is not None:
            if not inflight.released:  # (a released one was the member's at its PUBREC)
                self._shared_settled(inflight, session)
        else:
            cursor = session.cursors.get(inflight.queue)
            if cursor is not None:
                cursor.unacked.pop(inflight.offset, None)
        if inflight.qos == 2:
            self.broker.mark_dirty(session)  # the exchange's end: saved with the turn
        else:
            self.broker.mark_progress(session)
        if self._window_full or inflight.share is not None:
            # the window was what held deliveries back; otherwise notify drives the pump, and
            # a pump per batch of acks would only find the cursors at their queues' ends
            self.schedule_pump()
        return inflight

    def on_ack(self, packet: PubAck | PubComp) -> None:
        """PUBACK (QoS 1) or PUBCOMP (QoS 2): the delivery is done."""
        inflight = self.conn.acked(packet, self.connection.session.inflight)  # type: ignore[union-attr]
        if inflight is None:
            if packet.__class__ is PubAck:
                log.debug("PUBACK for unknown packet id client_id=%s id=%d", self.connection.client_id, packet.packet_id)
            return
        self.settle(packet.packet_id)
        if self.tracer is not None:
            assert isinstance(inflight, Inflight)
            self.tracer.acked("mqtt", self.connection.client_id, inflight.position, inflight.queue, inflight.offset)

    def on_pubrec(self, packet: PubRec) -> None:
        session = self.connection.session
        assert session is not None
        inflight = session.inflight.get(packet.packet_id)
        first = inflight is not None and not inflight.released
        answer = self.conn.pubrec(packet, session.inflight)
        if answer is PubRecAnswer.RELEASE:
            if first and inflight.share is not None:  # type: ignore[union-attr]
                self._shared_settled(inflight, session)  # type: ignore[arg-type]
            self.broker.mark_dirty(session)
            self.connection.send_packet(PubRel(packet.packet_id))
        elif answer is PubRecAnswer.REFUSED:  # the client refused it: the exchange ends here
            self.settle(packet.packet_id)
        else:
            self.connection.send_packet(PubRel(packet.packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))

    def _shared_settled(self, inflight: Inflight, session: Session) -> None:
        """A shared delivery is the member's: acknowledged (QoS 1), or received (QoS 2: PUBREC,
        after which no other member may get it, MQTT 5.0 section 4.8.2) -- its group is done
        with it, and keeps a QoS 2 one from coming again (``ShareGroup.acked``)."""
        group = self.broker.share_groups.get(inflight.share)  # type: ignore[arg-type]
        if group is not None:
            group.acked(inflight.offset, session if inflight.qos == 2 else None)

    async def inflight_messages(self) -> dict[int, StoredMessage | None]:
        """The messages of the session's unacknowledged PUBLISHes, by position, for
        ``resend_inflight``; None for one retention removed (the store said so: a gateway node
        asks its store node, and a StoreError means nothing is known)."""
        session = self.connection.session
        assert session is not None
        positions = [i.position for i in session.inflight.values() if not i.released]
        return await self.broker.read_positions(positions) if positions else {}

    def resend_inflight(self, messages: dict[int, StoredMessage | None]) -> None:
        """After a reconnect: unacknowledged PUBLISHes again with DUP, PUBRELs again (in order)."""
        session = self.connection.session
        assert session is not None
        for inflight in list(session.inflight.values()):
            if inflight.released:
                self.connection.send_packet(PubRel(inflight.packet_id))
                continue
            if inflight.position not in messages:
                continue  # sent while they were read (a shared group's delivery): not a resend
            message = messages[inflight.position]
            if message is None:  # removed by retention meanwhile
                self.settle(inflight.packet_id)
                continue
            message.queue, message.queue_offset = inflight.queue, inflight.offset
            if not self._send_message(message, self.deliveries(message), inflight.qos, None, inflight.packet_id,
                                      dup=True):
                self.settle(inflight.packet_id)
        self.connection.flush()

    def send_retained(self, state: SubscriptionState, message: StoredMessage) -> None:
        delivery = self.deliveries(message)
        remaining = delivery.remaining_expiry()
        if remaining is not None and remaining <= 0:
            self.broker.set_retained(message.topic, None)  # an expired retained message is gone
            return
        qos = min(state.options.qos, delivery.qos)
        session = self.connection.session
        assert session is not None
        packet_id = None
        if qos:
            packet_id = session.allocate_packet_id()
            if packet_id is None:
                return
            session.add_inflight(Inflight(packet_id, "", -1, qos, message.position))
        sub_ids = (state.identifier,) if state.identifier else ()
        if not self._send_message(message, delivery, qos, sub_ids, packet_id, retain=True, remaining=remaining) \
                and packet_id is not None:
            session.inflight.pop(packet_id, None)

    # -- shared subscriptions (shared.py chooses the member) -------------------------------------
    def shared_subscription(self, key: str) -> SubscriptionState | None:
        session = self.connection.session
        return session.subscriptions.get(key) if session is not None else None

    def has_window(self) -> bool:
        session = self.connection.session
        return session is not None and self.conn.window(session.inflight) > 0

    def deliver_shared(self, key: str, message: StoredMessage, delivery: MessageDelivery, qos: int,
                       state: SubscriptionState, remaining: int | None) -> bool:
        session = self.connection.session
        assert session is not None
        connection = self.connection
        read_check = connection.read_check
        if read_check is not None and not read_check(connection.username, connection.client_id, message.topic):
            return False  # an ACL deny rule: this member does not get it (the group moves on)
        packet_id = None
        if qos:
            packet_id = session.allocate_packet_id()
            if packet_id is None:
                return False
        sub_ids = (state.identifier,) if state.identifier else ()
        if not self._send_message(message, delivery, qos, sub_ids, packet_id, remaining=remaining):
            return False
        if packet_id is not None:
            session.add_inflight(Inflight(packet_id, message.queue, message.queue_offset, qos, message.position,
                                          share=key))
            if qos == 2:
                self.broker.mark_dirty(session)  # the member's from now on: written before it leaves
            else:
                self.broker.mark_progress(session)
        return True

    def take_shared_inflight(self, key: str, session: Session | None = None) -> list[tuple[int, int]]:
        """Remove this session's unacknowledged deliveries for a shared subscription and return
        them -- (queue offset, commitlog position) -- for the group to give to another member
        (a QoS 2 message whose PUBREC came is the member's already and stays)."""
        session = session or self.connection.session
        assert session is not None
        taken = []
        for pid, inflight in list(session.inflight.items()):
            if inflight.share == key and not inflight.released:
                del session.inflight[pid]
                taken.append((inflight.offset, inflight.position))
        return taken

    # -- the socket's drain, and fair turns with publishers (ingest_gate.py) --------------------
    def pause_writing(self) -> None:
        self.writing_paused = True
        loop = asyncio.get_running_loop()
        self._paused_at = loop.time()
        if not self.slow and self._stall_timer is None:
            self._stall_timer = loop.call_later(self.settings.subscriber_stall_s, self._stalled)

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        elif self.slow and asyncio.get_running_loop().time() - self._paused_at < self.settings.subscriber_stall_s:
            self.slow = False  # a quick drain: it keeps up again
        self.schedule_pump()

    def _stalled(self) -> None:
        """The socket did not drain in ``subscriber_stall_s``: this client is slow, not kept
        waiting by us. It holds publishers no longer; its QoS 0 backlog is cut from now on."""
        self._stall_timer = None
        if self.writing_paused and not self.connection.closed:
            self.slow = True
            log.info("subscriber stalled client_id=%s peer=%s unsent_bytes=%d", self.connection.client_id, self.connection.peer,
                     self.connection.transport.get_write_buffer_size() if self.connection.transport is not None else 0)
            self.broker.gate.done(self.connection)

    def leave_gate(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        self.broker.gate.forget(self.connection)

    # -- delivery (push side of push-pull) -----------------------------------------------------
    def schedule_pump(self) -> None:
        if not self._pump_scheduled and not self.connection.closed:
            self._pump_scheduled = True
            self.broker.wake(self)

    def pump(self) -> None:
        self._pump_scheduled = False
        self._window_full = False
        session = self.connection.session
        if session is None or self.connection.closed or self.connection.connecting:
            return
        broker = self.broker
        cache = broker.cache
        max_offset = broker.store.max_offset_now
        conn = self.conn
        behind = False  # a QoS 0 queue not read to its end: only a full socket stops those
        for queue in list(session.cursors):
            cursor = session.cursors.get(queue)
            if cursor is None:
                continue
            needs_quota = self._queue_needs_quota(queue)
            if not needs_quota and self.slow:
                self._drop_qos0_backlog(cursor)
            while not self.writing_paused:
                if needs_quota and conn.send_quota - len(session.inflight) <= 0:
                    self._window_full = True
                    break
                result = cursor.read(cache, PULL_BATCH, self._cursor_moved)
                if result is None:
                    break
                delivered = self._deliver_batch(cursor, result.messages)
                if len(self._out) >= FLUSH_EVERY:  # the transport's high-water mark bounds a pump too
                    self.connection.flush()
                if not delivered or self.writing_paused or result.next_offset >= result.max_offset:
                    break  # (at the queue's end as of this read: its next notify wakes this pump)
            if not needs_quota and self.writing_paused and max_offset(queue) > cursor.next_offset:
                behind = True
        self.connection.flush()
        if behind and not self.slow:
            broker.gate.wait(self.connection)  # publishers wait for this subscriber's socket to drain
        else:
            broker.gate.done(self.connection)
            if self.slow and not behind and not self.connection.transport.get_write_buffer_size():  # type: ignore[union-attr]
                self.slow = False  # caught up, all sent: it keeps up (again)

    def _cursor_moved(self, cursor: Cursor, start: int, to: int) -> None:
        """The store no longer has (or never had) what the cursor pointed at: it goes on from ``to``."""
        log.info("cursor moved client_id=%s queue=%s from=%d to=%d", self.connection.client_id, cursor.queue, start, to)
        session = self.connection.session
        if session is not None:
            self.broker.mark_progress(session)

    def _drop_qos0_backlog(self, cursor: Cursor) -> None:
        """A stalled QoS 0 reader more than max_queued_messages behind skips ahead (counted as
        dropped), as brokers drop QoS 0 for slow consumers; QoS 1/2 stays in the store. One
        that keeps reading is not cut: publishers wait for it instead (ingest_gate.py)."""
        behind = self.broker.store.max_offset_now(cursor.queue) - cursor.next_offset
        excess = behind - self.settings.max_queued_messages
        if excess > 0:
            cursor.next_offset += excess
            self.broker.stats.publish_dropped += excess
            log.info("qos 0 backlog dropped client_id=%s queue=%s count=%d", self.connection.client_id, cursor.queue, excess)

    def _queue_needs_quota(self, queue: str) -> bool:
        session = self.connection.session
        return any(s.options.qos > 0 for s in session.subscriptions.values() if s.queue == queue)  # type: ignore[union-attr]

    def _deliver_batch(self, cursor: Cursor, messages: list[StoredMessage]) -> bool:
        """Send what the session should get; False when the window is full (stop pulling)."""
        connection = self.connection
        session = connection.session
        assert session is not None
        client_id = connection.client_id
        broker = self.broker
        queue = cursor.queue
        subs = [s for s in session.subscriptions.values() if s.share_group is None]
        # every message of a queue matches the subscription that reads it (that is how it got
        # there); only the session's other subscriptions need the topic matched
        own = [s for s in subs if s.queue == queue]
        others = [s for s in subs if s.queue != queue]
        no_local = any(s.options.no_local for s in subs)
        unacked = cursor.unacked
        read_check = connection.read_check
        # the memo saves a decoding per message for each further reader of the cached object;
        # a queue read by this session alone (fan-in) has none, and would pay for the memo only
        deliveries = self.deliveries if broker.reader_count(queue) > 1 else MessageDelivery.of
        for message in messages:
            offset = message.queue_offset
            if unacked and offset in unacked:  # restored QoS 2 inflight, resent from the inflight table
                cursor.next_offset = offset + 1
                continue
            if read_check is not None and not read_check(connection.username, client_id, message.topic):
                cursor.next_offset = offset + 1  # a deny rule of the ACL: not for this client
                continue
            delivery = deliveries(message)
            matched = own + [s for s in others if matches(s.topic_filter, message.topic)] if others else own
            if no_local and delivery.publisher == client_id:
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
            remaining = None
            if delivery.expires_at is not None:
                remaining = delivery.remaining_expiry()
                if remaining <= 0:  # type: ignore[operator]
                    cursor.next_offset = offset + 1
                    continue
            packet_id = None
            if qos:
                if self.conn.send_quota - len(session.inflight) <= 0:
                    self._window_full = True
                    return False
                packet_id = session.allocate_packet_id()
                if packet_id is None:
                    self._window_full = True
                    return False
            if len(matched) == 1:
                sub_ids = (primary.identifier,) if primary.identifier else ()
            else:
                sub_ids = tuple(s.identifier for s in matched if s.identifier)
            retain = delivery.retain and any(s.options.retain_as_published for s in matched)
            cursor.next_offset = offset + 1
            if not self._send_message(message, delivery, qos, sub_ids, packet_id, retain=retain, remaining=remaining):
                continue
            if packet_id is not None:
                if session.inflight is NO_ENTRIES:  # (Session.add_inflight, inline: per message)
                    session.inflight = {}
                session.inflight[packet_id] = Inflight(packet_id, queue, offset, qos, message.position)
                cursor.unacked[offset] = packet_id
                if qos == 2:
                    broker.mark_dirty(session)
            if self.writing_paused:
                return False
        broker.mark_progress(session)
        return True

    def _send_message(self, message: StoredMessage, delivery: MessageDelivery, qos: int,
                      sub_ids: tuple[int, ...] | None, packet_id: int | None, *, retain: bool = False,
                      dup: bool = False, remaining: int | None = None) -> bool:
        """Write one PUBLISH (``delivery``: the message's, from the memo); False if the
        client's Maximum Packet Size forbids it (dropped)."""
        broker = self.broker
        topic = message.topic
        send_topic = topic
        alias = None
        conn = self.conn
        version = conn.version
        if version == MQTT_5:
            if remaining is None:
                remaining = delivery.remaining_expiry()
            if conn.alias_max_out:
                send_topic, alias = conn.alias_out(topic)
            props_key = (sub_ids or (), remaining, alias)

            def make_props() -> Properties:
                base = delivery.props or Properties()
                return base.copy(subscription_identifiers=list(sub_ids or ()), message_expiry_interval=remaining
                                 if remaining is not None else base.message_expiry_interval, topic_alias=alias)
        else:
            props_key = ()
            make_props = _no_props

        template = delivery.template(send_topic, qos, retain, version, props_key, make_props)
        if conn.client_max_packet and len(template.data) > conn.client_max_packet:
            broker.stats.publish_dropped += 1
            if alias is not None and send_topic:  # the alias was never announced
                conn.alias_unsent(topic)
            return False
        self._out.append(template.render(packet_id, dup))  # (the connection's send)
        broker.stats.messages_sent += 1
        if self.tracer is not None:
            self.tracer.delivered("mqtt", self.connection.client_id, message.position, message.queue, message.queue_offset, qos)
        return True


def _no_props() -> None:
    return None  # below 5.0 a PUBLISH has no properties


def _neg(text: str) -> tuple[int, ...]:
    """Sort key that makes max() prefer the smallest string."""
    return tuple(-ord(c) for c in text)
