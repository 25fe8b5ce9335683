"""The outbound side of an MQTT connection (``Delivery``, a component it owns): the push half of
push-pull delivery, shared-subscription deliveries, retained messages on subscribe, and the
acknowledgements of what was sent (PUBACK / PUBREC / PUBCOMP, resending after a reconnect).

A notify event (or an ack that frees the window) schedules ``pump``; the pump pulls each queue
the session reads from its cursor (through the node's queue cache), skips what the session
must not get, and writes PUBLISH bytes encoded once per variant for all subscribers. What is
done per message -- deciding, encoding, settling -- is push.py's (compiled); this is the
asyncio side.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from protocols.mqtt.connection import PubRecAnswer
from protocols.mqtt.packets import PubRec, PubRel
from protocols.mqtt.reason_codes import ReasonCode
from store import StoredMessage, StoreError

from .messages import Delivery as MessageDelivery
from .push import Pusher
from .session import Inflight, Session, SubscriptionState

if TYPE_CHECKING:
    from .connection import MQTTConnection

log = logging.getLogger("tidemq.mqtt")


class Delivery:
    """What one MQTTConnection sends its client unasked: a component the connection owns (it
    writes through the connection's buffer, and reads its session and client id), made when
    first needed (a subscription, a session with something to deliver): an idle client has none.
    Its ``pusher`` (push.py, compiled) does the per-message work: it is the reader the broker
    wakes and registers, and it settles PUBACK / PUBCOMP; this side calls it, never the reverse."""

    __slots__ = ("_paused_at", "_stall_timer", "connection", "pusher", "settings")

    def __init__(self, connection: MQTTConnection) -> None:
        self.connection = connection
        self.settings = connection.settings
        self.pusher = Pusher(connection)
        # (Pusher.slow:) made after the CONNECT was handled (by a first SUBSCRIBE), it starts
        # caught up: the session had nothing to send
        self.pusher.slow = connection.connecting or connection.session is None
        self._paused_at = 0.0  # loop time of the last pause_writing
        self._stall_timer: asyncio.TimerHandle | None = None  # runs out when the socket has not drained in time

    @property
    def writing_paused(self) -> bool:
        """The transport's buffer is above its high-water mark (the pusher stops writing)."""
        return self.pusher.writing_paused

    def may_read(self, topic: str) -> bool:
        """Whether the ACL lets this client have a message on ``topic`` (the pusher's check)."""
        return self.pusher.may_read(topic)

    # -- acknowledgements of our PUBLISHes (PUBACK and PUBCOMP: the pusher's on_ack) ----------
    def on_pubrec(self, packet: PubRec) -> None:
        session = self.connection.session
        assert session is not None
        inflight = session.inflight.get(packet.packet_id)
        first = inflight if inflight is not None and not inflight.released else None  # its first PUBREC
        answer = self.pusher.conn.pubrec(packet, session.inflight)
        if answer is PubRecAnswer.RELEASE:
            if first is not None and first.share is not None:
                self.pusher.shared_settled(first, session)
            self.connection.broker.mark_dirty(session)
            self.connection.send_packet(PubRel(packet.packet_id))
        elif answer is PubRecAnswer.REFUSED:  # the client refused it: the exchange ends here
            self.pusher.settle(packet.packet_id)
        else:
            self.connection.send_packet(PubRel(packet.packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))

    async def inflight_messages(self) -> dict[int, StoredMessage | None]:
        """The messages of the session's unacknowledged PUBLISHes, by position, for
        ``resend_inflight``; None for one retention removed (the store said so: a gateway node
        asks its store node, and a StoreError means nothing is known)."""
        session = self.connection.session
        assert session is not None
        positions = [i.position for i in session.inflight.values() if not i.released]
        return await self.connection.broker.read_positions(positions) if positions else {}

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
            if message is None or not self.pusher.may_read(message.topic):  # removed by retention, or the
                self.pusher.settle(inflight.packet_id)  # ACL changed since it was sent: not sent again
                continue
            message.queue, message.queue_offset = inflight.queue, inflight.offset
            if not self.pusher.send_message(message, self.pusher.deliveries(message), inflight.qos, None, inflight.packet_id,
                                     dup=True):
                self.pusher.settle(inflight.packet_id)
        self.connection.flush()

    def send_retained(self, state: SubscriptionState, message: StoredMessage) -> None:
        if not self.pusher.may_read(message.topic):
            return  # a wildcard's retained message on a topic the ACL does not let this client read
        delivery = self.pusher.deliveries(message)
        remaining = delivery.remaining_expiry()
        if remaining is not None and remaining <= 0:
            try:
                self.connection.broker.set_retained(message.topic, None)  # an expired retained message is gone
            except StoreError:  # (still retained, never sent: cleared by a later try)
                pass
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
        if not self.pusher.send_message(message, delivery, qos, sub_ids, packet_id, retain=True, remaining=remaining) \
                and packet_id is not None:
            session.inflight.pop(packet_id, None)

    # -- shared subscriptions (shared.py chooses the member) -------------------------------------
    def shared_subscription(self, key: str) -> SubscriptionState | None:
        session = self.connection.session
        return session.subscriptions.get(key) if session is not None else None

    def has_window(self) -> bool:
        session = self.connection.session
        return session is not None and self.pusher.conn.window(session.inflight) > 0

    def deliver_shared(self, key: str, message: StoredMessage, delivery: MessageDelivery, qos: int,
                       state: SubscriptionState, remaining: int | None) -> bool:
        """Send ``message`` to this member, which the group chose (it may read it, and has
        room); False when it was dropped (too large for the client): the group moves on."""
        session = self.connection.session
        assert session is not None
        packet_id = None
        if qos:
            packet_id = session.allocate_packet_id()
            if packet_id is None:
                return False
        sub_ids = (state.identifier,) if state.identifier else ()
        if not self.pusher.send_message(message, delivery, qos, sub_ids, packet_id, remaining=remaining):
            return False
        if packet_id is not None:
            session.add_inflight(Inflight(packet_id, message.queue, message.queue_offset, qos, message.position,
                                          share=key))
            if qos == 2:
                self.connection.broker.mark_dirty(session)  # the member's from now on: written before it leaves
            else:
                self.connection.broker.mark_progress(session)
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
        self.pusher.writing_paused = True
        loop = asyncio.get_running_loop()
        self._paused_at = loop.time()
        if not self.pusher.slow and self._stall_timer is None:
            self._stall_timer = loop.call_later(self.settings.subscriber_stall_s, self._stalled)

    def resume_writing(self) -> None:
        self.pusher.writing_paused = False
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        elif self.pusher.slow and asyncio.get_running_loop().time() - self._paused_at < self.settings.subscriber_stall_s:
            self.pusher.slow = False  # a quick drain: it keeps up again
        self.pusher.schedule_pump()

    def _stalled(self) -> None:
        """The socket did not drain in ``subscriber_stall_s``: this client is slow, not kept
        waiting by us. It holds publishers no longer; its QoS 0 backlog is cut from now on."""
        self._stall_timer = None
        if self.pusher.writing_paused and not self.connection.closed:
            self.pusher.slow = True
            log.info("subscriber stalled client_id=%s peer=%s unsent_bytes=%d", self.connection.client_id, self.connection.peer,
                     self.connection.transport.get_write_buffer_size() if self.connection.transport is not None else 0)
            self.connection.broker.gate.done(self.connection)

    def leave_gate(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        self.connection.broker.gate.forget(self.connection)
