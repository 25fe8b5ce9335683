"""Shared subscriptions (``$share/{group}/{filter}``): a consumer group of the delivery core
(gateway/core/group.py) over the filter's queue; each message goes to one online member (round
robin among those with window left); a member that goes away without acknowledging gives its
messages back for another member.

The group's committed offset (the oldest message not yet acknowledged by anyone) is a consumer
offset in the store under the consumer name ``$share/{group}/{filter}``, written through when
the group starts and when a QoS 2 exchange of the group ends; later progress is checkpointed.
What lies past it is recorded in the members' persistent sessions (session.py), under the
write-ahead rule of session_saves.py: each QoS 1/2 delivery not acknowledged yet (in the
session's ``out`` with the share key) and each QoS 2 exchange completed past the group's
written offset (``shared_done``). A group made again after a restart restores both from the
sessions: the first go back to their member with their packet ids (DUP, or PUBREL), the second
are passed over -- neither is handed out as new, so a QoS 2 message completed, or whose PUBREC
came, is never delivered twice; everything else past the offset is delivered again (QoS 1 is
at least once).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from store import PositionNotLoadedError, StoredMessage, StoreError

from ..core.group import ConsumerGroup
from ..interop import queue_for_filter
from .push import PULL_BATCH
from .session import Inflight, Session

if TYPE_CHECKING:
    from .broker import MQTTBroker
    from .connection import MQTTConnection

log = logging.getLogger("tidemq.mqtt")


class ShareGroup(ConsumerGroup["MQTTConnection"]):
    """A ``$share`` group: the delivery core's consumer group over its filter's queue, with the
    group's members (connections, by client id) and MQTT's choice of a member that can take a
    message now (its subscription's QoS, its send window, a socket that is not full)."""

    def __init__(self, broker: MQTTBroker, group: str, topic_filter: str, start_offset: int,
                 sessions: Iterable[Session] = ()) -> None:
        key = f"$share/{group}/{topic_filter}"
        super().__init__(broker.store, key, queue_for_filter(topic_filter), start_offset)
        self.broker = broker
        self.group = group
        self.topic_filter = topic_filter
        self.key = key
        self._pump_scheduled = False
        # offsets past the cursor that sessions hold (restored): not handed out from the cursor,
        # whatever becomes of them meanwhile (settled, or given back: then from ``redeliver``)
        self.passed: set[int] = set()
        for session in sessions:
            self._restore(session)

    def _restore(self, session: Session) -> None:
        """What ``session`` holds of this group past where it starts: its deliveries not
        acknowledged stay its own (resent by its connection), its received QoS 2 are done."""
        start = self.cursor.next_offset
        for inflight in session.inflight.values():
            if inflight.share == self.key and inflight.offset >= start:
                self.passed.add(inflight.offset)
                if not inflight.released:
                    self.hold(inflight.offset, session.client_id)
        self.passed.update(offset for offset in session.shared_done.get(self.key, ()) if offset >= start)

    # -- membership ----------------------------------------------------------------------------
    def join(self, conn: MQTTConnection) -> None:
        self.members[conn.client_id] = conn
        self.schedule_pump()

    def leave(self, conn: MQTTConnection, unacked: list[tuple[int, int]]) -> None:
        """A member went away (or unsubscribed); what it had not acknowledged -- (queue offset,
        commitlog position) pairs -- goes to another."""
        if self.members.get(conn.client_id) is conn:
            del self.members[conn.client_id]
        # (only what the group counts as the member's: a delivery restored with its session that
        # the group had settled before a crash -- the session's write lost -- goes to nobody)
        self.hand_back([pair for pair in unacked if self.cursor.unacked.get(pair[0]) == conn.client_id])

    def hand_back(self, unacked: list[tuple[int, int]]) -> None:
        """``unacked`` goes to another member. A message not at hand (a gateway node) is read
        first; until then it counts as unacknowledged, so the committed offset waits."""
        store = self.broker.store
        found: dict[int, StoredMessage | None] = {}
        pending: list[tuple[int, int]] = []
        for offset, position in unacked:
            try:
                found[position] = store.read_at(position)
            except PositionNotLoadedError:
                pending.append((offset, position))
        self._give_back([pair for pair in unacked if pair[1] in found], found)
        if pending:
            self.broker.spawn(self._read_back(pending))

    async def _read_back(self, pending: list[tuple[int, int]]) -> None:
        delay = 0.5
        while True:
            try:
                found = await self.broker.read_positions(position for _, position in pending)
                break
            except StoreError as exc:  # (the store node is away: these wait, unacknowledged)
                log.warning("shared messages not read back group=%s count=%d error=%s", self.key, len(pending), exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        self._give_back(pending, found)

    def _give_back(self, unacked: list[tuple[int, int]], found: dict[int, StoredMessage | None]) -> None:
        for offset, position in unacked:
            message = found[position]
            if message is None:
                self.settled(offset)  # removed by retention meanwhile: nothing left to deliver
                continue
            message.queue, message.queue_offset = self.queue, offset
            self.give_back([message])
        if unacked:
            log.info("shared messages given back group=%s count=%d", self.key, len(unacked))
        self.schedule_pump()
        self.save()

    def acked(self, offset: int, exchange_of: Session | None = None) -> None:
        """A member settled ``offset``; ``exchange_of``: the session that received it at QoS 2
        (its PUBREC; a refusing one ends the exchange too). The group's offset is then written
        through, and the session keeps ``offset`` while that offset is behind it (written with
        the session, after this): a restart passes over it."""
        self.settled(offset)
        if exchange_of is None:
            self.save()
        else:
            self.save(durable=True)
            committed = self.committed
            done = [o for o in exchange_of.shared_done.get(self.key, ()) if o >= committed and o != offset]
            if offset >= committed:
                done.append(offset)
            if done:
                exchange_of.set_shared_done(self.key, done)
            else:
                exchange_of.shared_done.pop(self.key, None)
        self.schedule_pump()

    def session_ended(self, session: Session, inflight: Inflight) -> None:
        """``session`` ended holding ``inflight`` of this group: not acknowledged, it goes to
        another member (a QoS 2 one whose PUBREC came was settled then: it goes to nobody else)."""
        if self.cursor.unacked.get(inflight.offset) == session.client_id:
            self.hand_back([(inflight.offset, inflight.position)])
        # (else settled already, or behind where the group started after a restart)

    # -- delivery ------------------------------------------------------------------------------
    def schedule_pump(self) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self.broker.wake(self)

    def _can_take(self, conn: MQTTConnection, qos: int) -> bool:
        state = conn.delivery.shared_subscription(self.key)
        if state is None or conn.closed or conn.delivery.writing_paused:
            return False
        return not (min(qos, state.options.qos) and not conn.delivery.has_window())

    def pump(self) -> None:
        self._pump_scheduled = False
        if not self.members:
            return
        touched: set[MQTTConnection] = set()
        while self.redeliver:
            if not self._send(self.redeliver[0], touched):
                break
            self.redeliver.pop(0)
        if not self.redeliver:
            cursor = self.cursor
            while True:
                result = cursor.read(self.broker.cache, PULL_BATCH)
                if result is None:
                    break
                sent_all = True
                for message in result.messages:
                    offset = message.queue_offset
                    if offset in self.passed:
                        self.passed.discard(offset)
                        cursor.next_offset = offset + 1
                        continue
                    if not self._send(message, touched):
                        sent_all = False
                        break
                    cursor.next_offset = message.queue_offset + 1
                if not sent_all:
                    break
        for conn in touched:
            conn.flush()
        self.save()

    def _send(self, message: StoredMessage, touched: set[MQTTConnection]) -> bool:
        delivery = self.broker.deliveries(message)
        remaining = delivery.remaining_expiry()
        if remaining is not None and remaining <= 0:
            return True  # expired: consumed without delivery
        topic = message.topic
        conn = self.next_member(lambda member: self._can_take(member, delivery.qos)
                                and member.delivery.may_read(topic))
        if conn is None:
            # none can take it now: it waits for one that may read it, unless no member may
            # (then it is passed over, as a plain subscription's read check skips it)
            return not any(member.delivery.may_read(topic) for member in self.members.values())
        state = conn.delivery.shared_subscription(self.key)
        assert state is not None
        qos = min(delivery.qos, state.options.qos)
        if conn.delivery.deliver_shared(self.key, message, delivery, qos, state, remaining) and qos:
            self.handed_out(message, conn.client_id)
        touched.add(conn)
        return True
