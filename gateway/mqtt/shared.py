"""Shared subscriptions (``$share/{group}/{filter}``): one cursor per group over the filter's
queue; each message goes to one online member (round robin among those with window left);
a member that goes away without acknowledging gives its messages back for another member.

The group's committed offset (the oldest message not yet acknowledged by anyone) is kept as
a consumer offset in the store under the consumer name ``$share/{group}/{filter}``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING

from store import GetStatus, PositionNotLoadedError, StoredMessage, StoreError

from ..interop import queue_for_filter
from .messages import delivery_of
from .outbound import PULL_BATCH

if TYPE_CHECKING:
    from .broker import MQTTBroker
    from .connection import MQTTConnection
    from .session import SubscriptionState

log = logging.getLogger("tidemq.mqtt")


class ShareGroup:
    def __init__(self, broker: MQTTBroker, group: str, topic_filter: str, start_offset: int) -> None:
        self.broker = broker
        self.group = group
        self.topic_filter = topic_filter
        self.key = f"$share/{group}/{topic_filter}"
        self.queue = queue_for_filter(topic_filter)
        self.next_offset = start_offset
        self.unacked: OrderedDict[int, str] = OrderedDict()  # offset -> member client id
        self.redeliver: list[StoredMessage] = []  # given back by members that left
        self.members: OrderedDict[str, MQTTConnection] = OrderedDict()
        self._rotation = 0
        self._pump_scheduled = False
        self._committed = -1

    @property
    def committed(self) -> int:
        low = self.next_offset
        for offset in self.unacked:
            low = min(low, offset)
            break
        for message in self.redeliver:
            low = min(low, message.queue_offset)
        return low

    # -- membership ----------------------------------------------------------------------------
    def join(self, conn: MQTTConnection) -> None:
        self.members[conn.client_id] = conn
        self.schedule_pump()

    def leave(self, conn: MQTTConnection, unacked: list[tuple[int, int]]) -> None:
        """A member went away (or unsubscribed); what it had not acknowledged -- (queue offset,
        commitlog position) pairs -- goes to another. A message not at hand (a gateway node) is
        read first; until then it counts as unacknowledged, so the committed offset waits."""
        if self.members.get(conn.client_id) is conn:
            del self.members[conn.client_id]
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
            self.unacked.pop(offset, None)
            if message is None:
                continue  # removed by retention meanwhile: nothing left to deliver
            message.queue, message.queue_offset = self.queue, offset
            self.redeliver.append(message)
        if unacked:
            log.info("shared messages given back group=%s count=%d", self.key, len(unacked))
        self.schedule_pump()
        self._save()

    def acked(self, offset: int) -> None:
        self.unacked.pop(offset, None)
        self._save()
        self.schedule_pump()

    # -- delivery ------------------------------------------------------------------------------
    def schedule_pump(self) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self.broker.wake(self)

    def _next_member(self, qos: int) -> tuple[MQTTConnection, SubscriptionState] | None:
        members = list(self.members.values())
        for i in range(len(members)):
            conn = members[(self._rotation + i) % len(members)]
            state = conn.shared_subscription(self.key)
            if state is None or conn.closed or conn.writing_paused:
                continue
            if min(qos, state.options.qos) and not conn.has_window():
                continue
            self._rotation = (self._rotation + i + 1) % len(members)
            return conn, state
        return None

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
            read = self.broker.cache.read
            while True:
                result = read(self.queue, self.next_offset, PULL_BATCH)
                if result.status != GetStatus.FOUND:
                    if result.status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW):
                        self.next_offset = result.next_offset
                        continue
                    break
                sent_all = True
                for message in result.messages:
                    if not self._send(message, touched):
                        sent_all = False
                        break
                    self.next_offset = message.queue_offset + 1
                if not sent_all:
                    break
        for conn in touched:
            conn.flush()
        self._save()

    def _send(self, message: StoredMessage, touched: set[MQTTConnection]) -> bool:
        delivery = delivery_of(message)
        remaining = delivery.remaining_expiry()
        if remaining is not None and remaining <= 0:
            return True  # expired: consumed without delivery
        chosen = self._next_member(delivery.qos)
        if chosen is None:
            return False
        conn, state = chosen
        qos = min(delivery.qos, state.options.qos)
        if conn.deliver_shared(self.key, message, qos, state, remaining) and qos:
            self.unacked[message.queue_offset] = conn.client_id
        touched.add(conn)
        return True

    def _save(self) -> None:
        committed = self.committed
        if committed != self._committed:
            self._committed = committed
            self.broker.store.commit_offset_now(self.key, self.queue, committed)
