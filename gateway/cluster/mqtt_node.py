"""The MQTT broker of a gateway node (``--role gateway``): what differs from an embedded one.

- Sessions live in the store node's KV table; a node loads one when its client connects
  (``load_session``) and writes it back as it changes. Offline sessions cost no node anything.
- The wildcard filters are the cluster's, kept by the store node: a subscription holds its
  filter there (durably for a persistent session), and a publish names ``WILDCARD_TARGETS``
  for the store node to expand, so a message published on any node reaches every wildcard
  queue.
- Retained messages are the store node's too; a subscription fetches the matching ones first.
- What a SUBSCRIBE needs before it can be handled synchronously (the new queues' offsets, the
  shared subscriptions' committed offsets, retained messages) is fetched by
  ``prepare_subscribe`` while the connection is not read.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from lookup.api import IN_DOUBT, InDoubt, InterestLookup, Lookup
from protocols.mqtt.packets import RetainHandling, Subscribe
from protocols.mqtt.reason_codes import ReasonCode
from protocols.mqtt.topics import TopicError, parse_shared
from store import StoredMessage

from ..interop import TOPIC_QUEUE_PREFIX, queue_for_filter
from ..mqtt.session import Session
from .gateway_store import GatewayStore
from .store_link import WILDCARD_TARGETS

if TYPE_CHECKING:
    from ..mqtt.broker import MQTTBroker

log = logging.getLogger("tidemq.cluster")


class RemoteWildcards:
    """The publish path's target queues on a gateway node: the topic's queue, and the wildcard
    queues the store node finds for it."""

    def __init__(self) -> None:
        self.extras: list = []  # (other protocols' queues: not on gateway nodes)

    def queues_for(self, topic: str) -> list[str]:
        return [TOPIC_QUEUE_PREFIX + topic, WILDCARD_TARGETS]

    def invalidate(self) -> None:
        pass

    def __len__(self) -> int:
        return 0


class RemoteRetained:
    """The store node's retained messages: set at once; matched by ``prefetch`` beforehand."""

    def __init__(self, store: GatewayStore) -> None:
        self.store = store
        self._matched: dict[str, list[StoredMessage]] = {}

    def load(self) -> None:
        pass

    def __len__(self) -> int:
        return len(self._matched)  # ($SYS counts what this node holds: the store node knows them all)

    def __contains__(self, topic: str) -> bool:
        return False

    def set(self, topic: str, position: int | None) -> None:
        self.store.remote.retained_set(topic, position)

    def matching(self, topic_filter: str) -> list[StoredMessage]:
        return self._matched.pop(topic_filter, [])

    async def prefetch(self, topic_filter: str) -> None:
        self._matched[topic_filter] = await self.store.remote.retained_match(topic_filter)


class GatewayNode:
    def __init__(self, store: GatewayStore, node_id: str, lookup: Lookup | None = None) -> None:
        self.store = store
        self.node_id = node_id
        self.lookup = lookup  # client id -> node (None: takeover asks every node)
        # queue -> nodes, only where the store node reads it (Redis): the embedded lookup has no reader
        self.interests = lookup if isinstance(lookup, InterestLookup) else None
        self.takeovers = Counter[str]()  # how takeovers were sent: targeted, everywhere (lookup in doubt)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._going: dict[str, asyncio.Task[Any]] = {}  # client id -> its "offline" on its way to the lookup
        self.wildcards = RemoteWildcards()
        self.retained = RemoteRetained(store)
        self._reading: dict[str, int] = {}  # queue -> local readers, and subscriptions being prepared
        store.read_here = self._reading  # (the store fetches these queues' news on notify)
        self._preparing: dict[int, list[str]] = {}  # id(SUBSCRIBE) -> the queues it counts as read

    def attach(self, broker: MQTTBroker) -> None:
        self.broker = broker
        self.store.remote.on_kick = self.kick
        self.store.on_lost = self.store_lost

    def store_lost(self) -> None:
        """No store node: every client of this node is disconnected (they reconnect, to any
        node, once one has its store again); what this node cached is stale."""
        broker = self.broker
        for conn in list(broker.connections.values()):
            conn.disconnect(ReasonCode.UNSPECIFIED_ERROR, "the gateway lost its store node")
        broker.cache.clear()

    # -- clients: one connection per client id in the cluster -----------------------------------
    async def claim(self, client_id: str) -> None:
        """A client connects here: where it is connected still, it is disconnected, and its
        session saved, before this node loads the session. The lookup says where; when it is in
        doubt (or there is none), every other node is asked."""
        where: str | None | InDoubt = IN_DOUBT
        if self.lookup is not None:
            going = self._going.get(client_id)
            if going is not None:  # its last connection here goes offline first, not after this
                await asyncio.wait([going])
            where = await self.lookup.client_online(client_id)
        if where is IN_DOUBT:
            self.takeovers["everywhere"] += 1
            await self.store.remote.takeover(client_id, "*")
        elif where is not None and where != self.node_id:
            self.takeovers["targeted"] += 1
            await self.store.remote.takeover(client_id, where)

    def client_gone(self, client_id: str) -> None:
        """A client of this node disconnected (its session is written): offline in the lookup."""
        if self.lookup is not None:
            task = self._going[client_id] = self._spawn(self.lookup.client_offline(client_id))

            def gone(done: asyncio.Task[Any]) -> None:
                if self._going.get(client_id) is done:
                    del self._going[client_id]
            task.add_done_callback(gone)

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self.lookup is not None:
            await self.lookup.close()

    def kick(self, client_id: str) -> bool:
        """Another node has ``client_id`` now: disconnect it here (5.0: reason 0x8E) and write
        its session at once, ahead of the answer on the store link."""
        broker = self.broker
        conn = broker.connections.get(client_id)
        if conn is None:
            return False
        log.info("session taken over by another node client_id=%s", client_id)
        conn.disconnect(ReasonCode.SESSION_TAKEN_OVER, "the client connected to another node")
        broker.flush_sessions()
        return True

    # -- which queues this node reads (notify routing) ------------------------------------------
    def reading(self, queue: str) -> None:
        """One more local reader of ``queue``; the first one tells the store node, before this
        node asks anything else about the queue."""
        count = self._reading.get(queue, 0)
        self._reading[queue] = count + 1
        if not count:
            self.store.remote.interest(queue, True)
            if self.interests is not None:
                self._spawn(self.interests.add_interest(queue))

    def not_reading(self, queue: str) -> None:
        count = self._reading.get(queue, 0) - 1
        if count > 0:
            self._reading[queue] = count
            return
        self._reading.pop(queue, None)
        self.store.forget(queue)
        self.store.remote.interest(queue, False)
        if self.interests is not None:
            self._spawn(self.interests.remove_interest(queue))

    # -- filters --------------------------------------------------------------------------------
    def hold_filter(self, session: Session, topic_filter: str) -> None:
        self.store.remote.filter_hold(topic_filter, session.client_id, session.persistent)

    def release_filter(self, session: Session, topic_filter: str) -> None:
        self.store.remote.filter_release(topic_filter, session.client_id)

    # -- sessions -------------------------------------------------------------------------------
    async def load_session(self, broker: MQTTBroker, client_id: str) -> None:
        """Replace what this node remembers of ``client_id``'s session with the stored one
        (another node may have had the client since). Its queues are read afresh when its
        readers start (after their notify events are routed here), and the messages it resends
        by the connection (``Delivery.inflight_messages``)."""
        raw = await broker.sessions_table.load(client_id)
        broker.sessions.pop(client_id, None)
        if raw is None:
            return
        broker.restore_session(client_id, raw)

    def prepare_subscribe(self, session: Session, packet: Subscribe) -> Coroutine[Any, Any, None] | None:
        """A coroutine fetching what handling ``packet`` reads, or None when all is here. The
        queues count as read from now until ``subscribed`` (the store node routes their notify
        events here before their offsets are read)."""
        queues: list[str] = []
        consumers: list[tuple[str, str]] = []
        retained: list[str] = []
        for request in packet.subscriptions:
            try:
                group, topic_filter = parse_shared(request.topic_filter)
            except TopicError:
                continue  # refused when handled
            queue = queue_for_filter(topic_filter)
            queues.append(queue)
            if group is not None:
                consumers.append((request.topic_filter, queue))
            elif request.retain_handling != RetainHandling.DO_NOT_SEND:
                retained.append(topic_filter)
        if not queues:
            return None
        for queue in queues:
            self.reading(queue)
        self._preparing[id(packet)] = queues
        return self._fetch(queues, consumers, retained)

    def subscribed(self, packet: Subscribe) -> None:
        """The prepared SUBSCRIBE was handled (or its connection went): its readers count now."""
        for queue in self._preparing.pop(id(packet), ()):
            self.not_reading(queue)

    async def _fetch(self, queues: list[str], consumers: list[tuple[str, str]], retained: list[str]) -> None:
        await self.store.ensure_offsets(queues)
        for consumer, queue in consumers:
            await self.store.ensure_consumer_offset(consumer, queue)
        for topic_filter in retained:
            await self.retained.prefetch(topic_filter)
