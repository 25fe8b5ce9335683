"""The MQTT gateway's ports (gateway/ports.py) on a gateway node (``--role gateway``): what
differs from a standalone node, each behind the port the MQTT code calls.

- Sessions (``ClusterSessions``) live in the store node's KV table; a node loads one when its
  client connects (``claim``: after the client was disconnected wherever else it was) and writes
  it back as it changes. Offline sessions cost no gateway node anything.
- The wildcard filters (``RemoteWildcards``) are the cluster's, kept by the store node: a
  subscription holds its filter there (durably for a persistent session), and a publish names
  ``WILDCARD_TARGETS`` for the store node to expand, so a message published on any node reaches
  every wildcard queue.
- Retained messages (``RemoteRetained``) are the store node's too.
- What a SUBSCRIBE needs before it can be handled synchronously (the new queues' offsets,
  retained messages) is fetched by ``ClusterReads``'s ``prepare_subscribe`` while the connection
  is not read; the queues read here are counted, so that the store node routes their notify
  events here.
- Shared subscriptions are refused (``SHARED_REFUSAL``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from lookup.api import IN_DOUBT, InDoubt, InterestLookup, Lookup
from protocols.mqtt.packets import RetainHandling, Subscribe
from protocols.mqtt.reason_codes import ReasonCode
from protocols.mqtt.topics import TopicError, is_wildcard, parse_shared
from store import StoredMessage

from ..interop import TOPIC_QUEUE_PREFIX, queue_for_filter
from ..mqtt.session import SESSIONS_TABLE
from ..ports import MQTTPorts
from ..tasks import all_done
from .gateway_store import GatewayStore
from .store_link import WILDCARD_TARGETS

if TYPE_CHECKING:
    from ..mqtt.broker import MQTTBroker

log = logging.getLogger("tidemq.cluster")

# Each gateway node would run its own copy of a $share group over the one committed offset in
# the store node: a message once per node, not once per group (MQTT 5.0 section 4.8.2). Lifted
# when a group has one owner in the cluster (docs/cluster.md).
SHARED_REFUSAL = "a gateway node of a cluster; a shared group needs one owner in the cluster"

Spawn = Callable[[Coroutine[Any, Any, Any]], "asyncio.Task[Any]"]


class RemoteWildcards:
    """The publish path's target queues on a gateway node: the topic's queue, and the wildcard
    queues the store node finds for it; a subscription to a wildcard filter holds it there."""

    def __init__(self, store: GatewayStore) -> None:
        self.store = store
        self._holds: dict[tuple[str, str], bool] = {}  # (filter, holder) -> durable: held from here
        self._unsent_releases: set[tuple[str, str]] = set()  # released while no link was up

    def hold(self, topic_filter: str, holder: str, durable: bool) -> None:
        if is_wildcard(topic_filter):  # (a concrete filter's queue is written anyway)
            self._holds[(topic_filter, holder)] = durable
            self.store.remote.filter_hold(topic_filter, holder, durable)

    def release(self, topic_filter: str, holder: str) -> None:
        if is_wildcard(topic_filter):
            self._holds.pop((topic_filter, holder), None)
            if not self.store.connected:  # (a one-way request is dropped meanwhile: sent on the next link)
                self._unsent_releases.add((topic_filter, holder))
            self.store.remote.filter_release(topic_filter, holder)

    def hold_again(self) -> None:
        """On a new link: the store node keeps a clean session's holds only for its node's link,
        and a release made while no link was up (a durable hold would stay) goes now."""
        remote = self.store.remote
        for topic_filter, holder in self._unsent_releases:
            if (topic_filter, holder) not in self._holds:
                remote.filter_release(topic_filter, holder)
        self._unsent_releases.clear()
        for (topic_filter, holder), durable in self._holds.items():
            remote.filter_hold(topic_filter, holder, durable)

    def queues_for(self, topic: str) -> list[str]:
        return [TOPIC_QUEUE_PREFIX + topic, WILDCARD_TARGETS]

    def reads(self, queue: str) -> bool:
        raise NotImplementedError  # (never asked: a gateway node has no store to reclaim from)


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

    def set(self, topic: str, position: int | None) -> asyncio.Future[None]:
        """Answered once the store node holds it as its store promises (replicated: confirmed)."""
        return self.store.retained_set(topic, position)

    def matching(self, topic_filter: str) -> list[StoredMessage]:
        return self._matched.pop(topic_filter, [])

    async def prefetch(self, topic_filter: str) -> None:
        self._matched[topic_filter] = await self.store.remote.retained_match(topic_filter)


class ClusterSessions:
    """``SessionRepository``: one connection per client id in the whole cluster, its session in
    the store node's table."""

    keeps_offline = False

    def __init__(self, store: GatewayStore, node_id: str, lookup: Lookup | None, spawn: Spawn) -> None:
        self.store = store
        self.node_id = node_id
        self.lookup = lookup  # client id -> node (None: takeover asks every node)
        self.table = store.table(SESSIONS_TABLE)
        self.takeovers = Counter[str]()  # how takeovers were sent: targeted, everywhere (lookup in doubt)
        self._spawn = spawn
        self._going: dict[str, asyncio.Task[Any]] = {}  # client id -> its "offline" on its way to the lookup

    def unavailable(self) -> str | None:
        return None if self.store.connected else "no store node"

    def stored(self) -> Iterable[tuple[str, bytes]]:
        return ()  # (loaded one by one, when their clients connect)

    async def claim(self, client_id: str, restore: Callable[[str, bytes | None], None]) -> None:
        """Where the client is connected still, it is disconnected, and its session saved,
        before this node loads the session. The lookup says where; when it is in doubt (or
        there is none), every other node is asked."""
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
        # from the store node, after the other node's write above (its readers are read afresh
        # when they start, and the messages it resends by the connection)
        restore(client_id, await self.table.load(client_id))

    def put(self, client_id: str, raw: bytes) -> None:
        self.table.put(client_id, raw)

    def save(self, sessions: Sequence[tuple[str, bytes]]) -> Coroutine[Any, Any, None]:
        """Sent now, in order on the link; done once the store node has written every one (its
        table's writes go through its WAL before it answers)."""
        store = self.store
        return all_done([store.kv_put_sent(SESSIONS_TABLE, client_id, raw) for client_id, raw in sessions])

    def delete(self, client_id: str) -> None:
        self.table.delete(client_id)

    def client_gone(self, client_id: str) -> None:
        """Offline in the lookup."""
        if self.lookup is not None:
            task = self._going[client_id] = self._spawn(self.lookup.client_offline(client_id))

            def gone(done: asyncio.Task[Any]) -> None:
                if self._going.get(client_id) is done:
                    del self._going[client_id]
            task.add_done_callback(gone)


class ClusterReads:
    """``Reads``: which queues this node reads (notify routing), and what is fetched from the
    store node before a read can be answered at once."""

    def __init__(self, store: GatewayStore, retained: RemoteRetained, lookup: Lookup | None, spawn: Spawn) -> None:
        self.store = store
        self.retained = retained
        # queue -> nodes, only where the store node reads it (Redis): the embedded lookup has no reader
        self.interests = lookup if isinstance(lookup, InterestLookup) else None
        self._spawn = spawn
        self._reading: dict[str, int] = {}  # queue -> local readers, and subscriptions being prepared
        store.read_here = self._reading  # (the store fetches these queues' news on notify)
        self._preparing: dict[int, list[str]] = {}  # id(SUBSCRIBE) -> the queues it counts as read

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

    def interest_again(self) -> None:
        """On a new link: the store node routes notify events by what each link said it reads."""
        for queue in self._reading:
            self.store.remote.interest(queue, True)

    def prepare_subscribe(self, packet: Subscribe) -> Coroutine[Any, Any, None] | None:
        queues: list[str] = []
        retained: list[str] = []
        for request in packet.subscriptions:
            try:
                group, topic_filter = parse_shared(request.topic_filter)
            except TopicError:
                continue  # refused when handled
            if group is not None:
                continue  # refused when handled (SHARED_REFUSAL): nothing to read
            queues.append(queue_for_filter(topic_filter))
            if request.retain_handling != RetainHandling.DO_NOT_SEND:
                retained.append(topic_filter)
        if not queues:
            return None
        for queue in queues:
            self.reading(queue)
        self._preparing[id(packet)] = queues
        return self._fetch(queues, retained)

    def subscribed(self, packet: Subscribe) -> None:
        for queue in self._preparing.pop(id(packet), ()):
            self.not_reading(queue)

    async def _fetch(self, queues: list[str], retained: list[str]) -> None:
        await self.store.ensure_offsets(queues)
        for topic_filter in retained:
            await self.retained.prefetch(topic_filter)

    async def prepare_groups(self, groups: Sequence[tuple[str, str]]) -> None:
        for consumer, queue in groups:
            await self.store.ensure_consumer_offset(consumer, queue)

    async def read_positions(self, positions: Iterable[int]) -> dict[int, StoredMessage | None]:
        return await self.store.read_positions(positions)


class GatewayNode:
    """A gateway node's cluster side: its ports, its lookup, and what the store link asks of its
    clients (another node takes one over; the store node is lost)."""

    def __init__(self, store: GatewayStore, node_id: str, lookup: Lookup | None = None) -> None:
        self.store = store
        self.node_id = node_id
        self.lookup = lookup
        self._tasks: set[asyncio.Task[Any]] = set()
        self.wildcards = RemoteWildcards(store)
        self.retained = RemoteRetained(store)
        self.sessions = ClusterSessions(store, node_id, lookup, self._spawn)
        self.reads = ClusterReads(store, self.retained, lookup, self._spawn)
        self._clients: MQTTBroker | None = None

    @property
    def takeovers(self) -> Counter[str]:
        return self.sessions.takeovers

    def ports(self) -> MQTTPorts:
        return MQTTPorts(self.store, self.sessions, self.wildcards, self.retained, self.reads,
                         shared_refusal=SHARED_REFUSAL)

    def attach(self, clients: MQTTBroker) -> None:
        """The MQTT gateway built on ``ports()``: the store link's kicks and loss reach its
        clients, and what the link fetches reaches its queue cache (the node's one cache)."""
        self._clients = clients
        self.store.answers = clients.cache
        self.store.remote.on_kick = self.kick
        self.store.on_lost = self.store_lost
        self.store.on_relinked = self.store_relinked

    def store_relinked(self) -> None:
        """Linked again (a store node restarted, or a new leader): the clients stayed. What the
        store node kept for the old link only is said again, every connected persistent
        session is written again (a one-way write the old link took may be lost), and every
        reader reads afresh (what the cache knows of queues' ends may be behind the new node's)."""
        clients = self._clients
        assert clients is not None
        self.wildcards.hold_again()
        self.reads.interest_again()
        for client_id in list(clients.connections):
            session = clients.sessions.get(client_id)
            if session is not None:
                clients.saves.mark_dirty(session, holds_output=False)
        clients.cache.clear()
        for readers in list(clients.readers.values()):
            for reader in list(readers):
                reader.schedule_pump()
        log.info("store node linked again: clients kept connections=%d", len(clients.connections))

    def store_lost(self) -> None:
        """No store node for ``failover_s``: every client of this node is disconnected (they
        reconnect, to any node, once one has its store again); what this node cached is stale."""
        clients = self._clients
        assert clients is not None
        for conn in list(clients.connections.values()):
            conn.disconnect(ReasonCode.UNSPECIFIED_ERROR, "the gateway lost its store node")
        clients.cache.clear()

    def kick(self, client_id: str) -> bool:
        """Another node has ``client_id`` now: disconnect it here (5.0: reason 0x8E) and write
        its session at once, ahead of the answer on the store link."""
        clients = self._clients
        assert clients is not None
        conn = clients.connections.get(client_id)
        if conn is None:
            return False
        log.info("session taken over by another node client_id=%s", client_id)
        conn.disconnect(ReasonCode.SESSION_TAKEN_OVER, "the client connected to another node")
        clients.flush_sessions()
        return True

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
