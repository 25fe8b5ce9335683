# cython: annotation_typing=False
"""The per-message core of MQTT delivery, sans-IO: what a pump does with each message a queue read
gives a session (the skip rules, its QoS, a packet id, the inflight record, its PUBLISH bytes
appended to the connection's output buffer), and the end of a delivery (PUBACK / PUBCOMP: settle).

Compiled by Cython (pyproject.toml ``[tool.tidemq] compiled``); the same file runs interpreted
with ``TIDEMQ_PURE_PYTHON=1``. A ``Pusher`` is owned by an ``outbound.Delivery``, the asyncio side
(the socket's drain, retained and shared deliveries, resends), which calls it and keeps no
per-message work of its own; the Pusher never calls back into it. Annotations are for readers (``annotation_typing=False``): compiled,
C types come from ``cython.declare`` and ``cython.locals`` only.
"""

from __future__ import annotations

import logging

import cython

from protocols.mqtt.connection import free_packet_id
from protocols.mqtt.packets import MQTT_5, PubAck
from protocols.mqtt.topics import matches

from .messages import Delivery as MessageDelivery

log = logging.getLogger("tidemq.mqtt")

PULL_BATCH = 64  # messages per store read of one queue
# output a pump gathers before it writes it (and may find the socket full): about 256 small
# PUBLISHes; the transport's high-water mark bounds a pump too
FLUSH_BYTES = 32 << 10
_V5 = cython.declare(cython.int, MQTT_5)


@cython.no_gc  # not tracked by the cyclic GC, one per message (ints and strings: it can be in no cycle)
@cython.cclass
class Inflight:
    """A QoS 1/2 PUBLISH sent to the client, waiting for PUBACK / PUBREC / PUBCOMP.

    A session record (``session.py`` exports it, and its users import it from there), defined
    here because the pusher makes one per QoS 1/2 delivery and drops it at its ack: as an
    interpreted class in ``session.py`` it made the delivery core measurably slower per message,
    and ``session.py`` (persistence, not per-message work) is no module to compile."""

    if cython.compiled:
        packet_id = cython.declare(cython.int, visibility="public")
        queue = cython.declare(object, visibility="public")  # "" for a retained message
        offset = cython.declare(object, visibility="public")  # (the message's int: none made per delivery)
        qos = cython.declare(cython.int, visibility="public")
        position = cython.declare(object, visibility="public")  # commitlog position of the message (to resend it)
        released = cython.declare(cython.bint, visibility="public")  # QoS 2: PUBREC received, PUBREL sent, waiting for PUBCOMP
        share = cython.declare(object, visibility="public")  # the shared subscription ("$share/g/f") it was delivered for
    else:
        __slots__ = ("offset", "packet_id", "position", "qos", "queue", "released", "share")

    def __init__(self, packet_id: int, queue: str, offset: int, qos: int, position: int, released: bool = False,
                 share: str | None = None) -> None:
        self.packet_id = packet_id
        self.queue = queue
        self.offset = offset
        self.qos = qos
        self.position = position
        self.released = released
        self.share = share

    def __repr__(self) -> str:
        return (f"Inflight(packet_id={self.packet_id}, queue={self.queue!r}, offset={self.offset}, qos={self.qos}, "
                f"position={self.position}, released={bool(self.released)}, share={self.share!r})")


def allocate_packet_id(session: object) -> int | None:
    """A free packet id of ``session`` (its ``inflight`` and ``next_packet_id``), or None when
    all 65,535 are in use."""
    return _allocate(session, session.inflight)


@cython.cfunc
@cython.locals(pid=cython.int)
def _allocate(session: object, inflight: object) -> object:
    start = session.next_packet_id
    found = start if start not in inflight else free_packet_id(inflight, start)
    if found is None:
        return None
    pid = found
    session.next_packet_id = pid % 65_535 + 1
    return found


@cython.final  # composed, not extended: its own calls need no vtable
@cython.cclass
class Pusher:
    """The compiled core of one connection's outbound side (``outbound.Delivery.pusher``): the
    reader the broker wakes (``schedule_pump``, ``pump``) and the settler of PUBACK / PUBCOMP. It
    writes into the connection's output buffer, and reads its session and client id."""

    if cython.compiled:
        connection = cython.declare(object, visibility="public")
        broker = cython.declare(object, visibility="public")
        conn = cython.declare(object, visibility="public")  # the protocol state: version, the client's limits, aliases
        out = cython.declare(bytearray, visibility="public")  # the connection's output buffer
        deliveries = cython.declare(object, visibility="public")  # the broker's DeliveryMemo
        tracer = cython.declare(object, visibility="public")
        max_queued_messages = cython.declare(cython.longlong, visibility="public")
        _pump_scheduled = cython.declare(cython.bint, visibility="public")
        # the last pump stopped at the client's window (an ack then pumps again)
        _window_full = cython.declare(cython.bint, visibility="public")
        writing_paused = cython.declare(cython.bint, visibility="public")  # the transport's buffer is above its high-water mark
        # its socket stalled (or it has not caught up since it connected): its QoS 0 backlog is
        # cut to max_queued_messages and publishers do not wait for it; true until it has
        # caught up, so a backlog from before it connected is cut
        slow = cython.declare(cython.bint, visibility="public")
        # acks settled since the connection's last read ended: its read progress is marked then
        _acks_settled = cython.declare(cython.bint, visibility="public")
        # a batch's progress while ``_deliver_each`` runs: the cursor's next offset, PUBLISHes written
        _next = cython.declare(cython.longlong)
        _sent = cython.declare(cython.Py_ssize_t)

    def __init__(self, connection: object) -> None:
        # fixed for the connection's life: kept here, off the per-message attribute chain
        self.connection = connection
        self.broker = connection.broker
        self.conn = connection.conn
        self.out = connection.out
        self.deliveries = self.broker.deliveries
        self.tracer = connection.tracer
        self.max_queued_messages = connection.settings.max_queued_messages
        self._pump_scheduled = False
        self._window_full = False
        self.writing_paused = False
        self.slow = True
        self._acks_settled = False
        self._next = 0
        self._sent = 0

    def schedule_pump(self) -> None:
        if not self._pump_scheduled and not self.connection.closed:
            self._pump_scheduled = True
            self.broker.wake(self)

    # -- acknowledgements of our PUBLISHes ------------------------------------------------------
    def on_ack(self, packet: object) -> None:
        """PUBACK (QoS 1) or PUBCOMP (QoS 2): the delivery is done."""
        inflight = self.conn.acked(packet, self.connection.session.inflight)
        if inflight is None:
            if packet.__class__ is PubAck:
                log.debug("PUBACK for unknown packet id client_id=%s id=%d", self.connection.client_id, packet.packet_id)
            return
        self._settle(packet.packet_id, True)
        if self.tracer is not None:
            self.tracer.acked("mqtt", self.connection.client_id, inflight.position, inflight.queue, inflight.offset)

    def settle(self, packet_id: int) -> Inflight | None:
        return self._settle(packet_id, False)

    def acks_done(self) -> None:
        """The connection read what it had (``on_ack`` leaves the read progress of a QoS 1
        settle to this: marked once per read, not once per PUBACK)."""
        if self._acks_settled:
            self._acks_settled = False
            session = self.connection.session
            if session is not None:
                self.broker.mark_progress(session)

    @cython.cfunc
    def _settle(self, packet_id: object, read_on: cython.bint) -> object:
        """``read_on``: more of the client's packets may follow (``acks_done`` marks the progress)."""
        session = self.connection.session
        inflight = session.inflight.pop(packet_id, None)
        if inflight is None:
            return None
        entry: Inflight = inflight
        if entry.share is not None:
            if not entry.released:  # (a released one was the member's at its PUBREC)
                self.shared_settled(entry, session)
        else:
            cursor = session.cursors.get(entry.queue)
            if cursor is not None:
                cursor.unacked.pop(entry.offset, None)
        if entry.qos == 2:
            self.broker.mark_dirty(session)  # the exchange's end: saved with the turn
        elif read_on:
            self._acks_settled = True
        else:
            self.broker.mark_progress(session)
        if self._window_full or entry.share is not None:
            # the window was what held deliveries back; otherwise notify drives the pump, and
            # a pump per batch of acks would only find the cursors at their queues' ends
            self.schedule_pump()
        return inflight

    def shared_settled(self, inflight: Inflight, session: object) -> None:
        """A shared delivery is the member's: acknowledged (QoS 1), or received (QoS 2: PUBREC,
        after which no other member may get it, MQTT 5.0 section 4.8.2) -- its group is done
        with it, and keeps a QoS 2 one from coming again (``ShareGroup.acked``)."""
        group = self.broker.share_groups.get(inflight.share)
        if group is not None:
            group.acked(inflight.offset, session if inflight.qos == 2 else None)

    # -- the pump ----------------------------------------------------------------------------------
    def pump(self) -> None:
        """Deliver what the session's queues hold for it (``broker.wake`` calls this), then write."""
        self._pump_scheduled = False
        self._window_full = False
        connection = self.connection
        session = connection.session
        if session is None or connection.closed or connection.connecting:
            return
        behind = self.pump_queues(session)
        self.connection.flush()  # (not a bound method kept per connection: 64 B of every subscriber)
        gate = self.broker.gate
        if behind and not self.slow:
            gate.wait(connection)  # publishers wait for this subscriber's socket to drain
        else:
            gate.done(connection)
            if self.slow and not behind and not connection.transport.get_write_buffer_size():
                self.slow = False  # caught up, all sent: it keeps up (again)

    @cython.locals(behind=cython.bint, needs_quota=cython.bint)
    def pump_queues(self, session: object) -> bool:
        """Read each queue of ``session`` from its cursor and deliver what it should get, until
        the client's window or the socket is full; True when a QoS 0 queue was left unread
        because the socket is (its publishers may wait for this subscriber)."""
        broker = self.broker
        cache = broker.cache
        max_offset = broker.store.max_offset_now
        conn = self.conn
        out = self.out
        behind = False  # a QoS 0 queue not read to its end: only a full socket stops those
        cursors = session.cursors
        for queue in list(cursors):
            cursor = cursors.get(queue)
            if cursor is None:
                continue
            needs_quota = _needs_quota(session, queue)
            if not needs_quota and self.slow:
                self._drop_qos0_backlog(cursor)
            while not self.writing_paused:
                if needs_quota and conn.send_quota - len(session.inflight) <= 0:
                    self._window_full = True
                    break
                result = cursor.read(cache, PULL_BATCH, self._cursor_moved)
                if result is None:
                    break
                delivered = self._deliver_batch(session, cursor, result.messages)
                if len(out) >= FLUSH_BYTES:
                    self.connection.flush()
                if not delivered or self.writing_paused or result.next_offset >= result.max_offset:
                    break  # (at the queue's end as of this read: its next notify wakes this pump)
            if not needs_quota and self.writing_paused and max_offset(queue) > cursor.next_offset:
                behind = True
        return behind

    def _cursor_moved(self, cursor: object, start: int, to: int) -> None:
        """The store no longer has (or never had) what the cursor pointed at: it goes on from ``to``."""
        log.info("cursor moved client_id=%s queue=%s from=%d to=%d", self.connection.client_id, cursor.queue, start, to)
        session = self.connection.session
        if session is not None:
            self.broker.mark_progress(session)

    @cython.cfunc
    def _drop_qos0_backlog(self, cursor: object) -> cython.void:
        """A stalled QoS 0 reader more than max_queued_messages behind skips ahead (counted as
        dropped), as brokers drop QoS 0 for slow consumers; QoS 1/2 stays in the store. One
        that keeps reading is not cut: publishers wait for it instead (ingest_gate.py)."""
        behind = self.broker.store.max_offset_now(cursor.queue) - cursor.next_offset
        excess = behind - self.max_queued_messages
        if excess > 0:
            cursor.next_offset += excess
            self.broker.stats.publish_dropped += excess
            log.info("qos 0 backlog dropped client_id=%s queue=%s count=%d", self.connection.client_id, cursor.queue, excess)

    def deliver_batch(self, cursor: object, messages: list) -> bool:
        """Send what the session should get of ``messages`` (read from ``cursor``); False when
        the window is full (stop pulling)."""
        return self._deliver_batch(self.connection.session, cursor, messages)

    @cython.cfunc
    @cython.locals(fixed=cython.bint, no_local=cython.bint, fixed_retain=cython.bint, more=cython.bint)
    def _deliver_batch(self, session: object, cursor: object, messages: list) -> cython.bint:
        queue = cursor.queue
        own = []  # every message of a queue matches the subscription that reads it (that is how it got there)
        others = []  # only the session's other subscriptions need the topic matched
        no_local = False
        fixed_retain = False
        for s in session.subscriptions.values():
            if s.share_group is None:
                (own if s.queue == queue else others).append(s)
                if s.options.no_local:
                    no_local = True
        # the same subscriptions match every message of the batch: what they decide is decided once
        fixed = not others and not no_local
        primary = None
        if fixed and own:
            primary = own[0] if len(own) == 1 else max(own, key=_primary_key)
            for s in own:
                if s.options.retain_as_published:
                    fixed_retain = True
        # the cursor moves past each message taken or skipped: kept here, and written back however
        # the batch ends (an error included: what was sent is not pulled again)
        self._next = cursor.next_offset
        self._sent = 0
        more = True
        try:
            more = self._deliver_each(session, queue, cursor.unacked, messages, own, others, no_local, fixed, primary,
                                      fixed_retain)
        finally:
            cursor.next_offset = self._next
            if self._sent:
                self.broker.stats.messages_sent += self._sent
        if more:
            self.broker.mark_progress(session)
        return more

    @cython.cfunc
    @cython.locals(offset=cython.longlong, qos=cython.int, fixed=cython.bint, no_local=cython.bint,
                   fixed_retain=cython.bint, quota=cython.Py_ssize_t, fixed_qos=cython.int)
    def _deliver_each(self, session: object, queue: object, unacked: dict, messages: list, own: list, others: list,
                      no_local: cython.bint, fixed: cython.bint, primary: object, fixed_retain: cython.bint
                      ) -> cython.bint:
        """The batch's messages one by one (``_deliver_batch`` decided what holds for them all)."""
        connection = self.connection
        client_id = connection.client_id
        read_check = connection.read_check
        inflight = session.inflight
        quota = self.conn.send_quota
        fixed_qos = 0
        fixed_ids = None
        if primary is not None:
            fixed_qos = primary.options.qos
            fixed_ids = _sub_ids(own, primary)
        # the memo saves a decoding per message for each further reader of the cached object;
        # a queue read by this session alone (fan-in) has none, and would pay for the memo only
        deliveries = self.deliveries if self.broker.reader_count(queue) > 1 else MessageDelivery.of
        for message in messages:
            key = message.queue_offset
            offset = key
            if unacked and key in unacked:  # restored QoS 2 inflight, resent from the inflight table
                self._next = offset + 1
                continue
            if read_check is not None and not self.may_read(message.topic):
                self._next = offset + 1  # the ACL does not let this client read it
                continue
            delivery = deliveries(message)
            if fixed:
                if primary is None:
                    self._next = offset + 1
                    continue
                qos = min(delivery.qos, fixed_qos)
                sub_ids = fixed_ids
                retain = delivery.retain and fixed_retain
            else:
                matched = own + [s for s in others if matches(s.topic_filter, message.topic)] if others else own
                if no_local and delivery.publisher == client_id:
                    matched = [s for s in matched if not s.options.no_local]
                if not matched:
                    self._next = offset + 1
                    continue
                # overlapping subscriptions: the message is delivered once, from the queue of the
                # matching subscription with the highest QoS (ties: the smallest queue name); the
                # other queues skip it, so no per-session set of seen message ids is needed
                best = matched[0] if len(matched) == 1 else max(matched, key=_primary_key)
                if best.queue != queue:
                    self._next = offset + 1
                    continue
                qos = min(delivery.qos, best.options.qos)
                sub_ids = _sub_ids(matched, best)
                retain = delivery.retain and any(s.options.retain_as_published for s in matched)
            remaining = None
            if delivery.expires_at is not None:
                remaining = delivery.remaining_expiry()
                if remaining <= 0:
                    self._next = offset + 1
                    continue
            packet_id = None
            if qos:
                if quota - len(inflight) <= 0:
                    self._window_full = True
                    return False
                packet_id = _allocate(session, inflight)
                if packet_id is None:
                    self._window_full = True
                    return False
            self._next = offset + 1
            if not self._send(message, delivery, qos, sub_ids, packet_id, retain, False, remaining):
                continue
            self._sent += 1
            if packet_id is not None:
                if type(inflight) is not dict:  # the session's shared empty table (session.NO_ENTRIES)
                    inflight = session.inflight = {}
                inflight[packet_id] = Inflight(packet_id, queue, key, qos, message.position)
                unacked[key] = packet_id
                if qos == 2:
                    self.broker.mark_dirty(session)
            if self.writing_paused:
                return False
        return True

    # -- one PUBLISH -------------------------------------------------------------------------------
    @cython.ccall
    def may_read(self, topic: object) -> cython.bint:
        """Whether the ACL lets this client have a message on ``topic``: asked by every path that
        hands it a stored message (queued, shared, retained, resent); no check is set when no
        single message can be refused (connect.py)."""
        connection = self.connection
        read_check = connection.read_check
        return read_check is None or read_check(connection.username, connection.client_id, topic)

    def send_message(self, message: object, delivery: MessageDelivery, qos: int, sub_ids: tuple[int, ...] | None,
                     packet_id: int | None, *, retain: bool = False, dup: bool = False,
                     remaining: int | None = None) -> bool:
        """Write one PUBLISH (``delivery``: the message's, from the memo); False if the
        client's Maximum Packet Size forbids it (dropped)."""
        if self._send(message, delivery, qos, sub_ids, packet_id, retain, dup, remaining):
            self.broker.stats.messages_sent += 1
            return True
        return False

    @cython.cfunc
    @cython.locals(qos=cython.int, version=cython.int, max_packet=cython.Py_ssize_t)
    def _send(self, message: object, delivery: object, qos: object, sub_ids: object, packet_id: object,
              retain: object, dup: object, remaining: object) -> cython.bint:
        """(``messages_sent`` is the caller's to count.)"""
        conn = self.conn
        topic = message.topic
        send_topic = topic
        alias = None
        version = conn.version
        if version == _V5:
            if remaining is None:
                remaining = delivery.remaining_expiry()
            if conn.alias_max_out:
                send_topic, alias = conn.alias_out(topic)
            template = delivery.template(send_topic, qos, retain, version, sub_ids or (), remaining, alias)
        else:
            template = delivery.template(send_topic, qos, retain, version)
        max_packet = conn.client_max_packet
        if max_packet and len(template.data) > max_packet:
            self.broker.stats.publish_dropped += 1
            if alias is not None and send_topic:  # the alias was never announced
                conn.alias_unsent(topic)
            return False
        template.render_into(self.out, packet_id, dup)
        if self.tracer is not None:
            self.tracer.delivered("mqtt", self.connection.client_id, message.position, message.queue,
                                  message.queue_offset, qos)
        return True


@cython.cfunc
def _needs_quota(session: object, queue: object) -> cython.bint:
    """Whether a subscription at QoS 1 or 2 reads ``queue`` (its deliveries count against the window)."""
    for s in session.subscriptions.values():
        if s.queue == queue and s.options.qos > 0:
            return True
    return False


@cython.cfunc
def _sub_ids(matched: list, primary: object) -> tuple:
    """The Subscription Identifiers a copy carries: those of every matching subscription."""
    if len(matched) == 1:
        return (primary.identifier,) if primary.identifier else ()
    return tuple([s.identifier for s in matched if s.identifier])


def _primary_key(s: object) -> tuple:
    """max() picks the subscription of the highest QoS, ties: the smallest queue name."""
    return (s.options.qos, tuple([-ord(c) for c in s.queue]))
