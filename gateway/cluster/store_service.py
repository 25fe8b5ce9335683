"""The store node's side of the store link (``--role store``): the store served to gateway
nodes over the remoting port, beside RocketMQ clients, with the private request codes of
``gateway.cluster.store_link``.

Each handler answers at once from the store, except PUT (answered when the put is durable, as
a RocketMQ send) and SUBSCRIBE_NOTIFY (the connection then receives one-way NOTIFY requests,
coalesced per queue, for as long as it lasts: a gateway node subscribes once, and the end of
that subscription is the end of the node's link).

The store node also keeps what must be one for the whole cluster for MQTT: the wildcard
filters sessions subscribe to (so that a publish on any node is indexed into every matching
wildcard queue: PUT expands ``WILDCARD_TARGETS``) and the retained messages.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from protocols.remoting.codes import ResponseCode
from protocols.remoting.frames import FLAG_ONEWAY, RemotingCommand, response_to
from store import MessageStore, PutResult, StoredMessage

from ..mqtt.expiry import SessionExpiry, stored_sessions
from ..mqtt.queues import WildcardQueues
from ..mqtt.retained import RetainedIndex
from ..mqtt.session import SESSIONS_TABLE, Session
from ..remoting.requests import BadRequest, Pending, Reply, int_field, str_field
from ..tasks import cancel_and_wait
from .notify_router import NotifyRouter
from .store_link import (
    WILDCARD_TARGETS,
    StoreCode,
    decode_names,
    decode_put,
    encode_items,
    encode_messages,
    encode_offsets,
    encode_put_results,
    result_fields,
)

if TYPE_CHECKING:
    from ..remoting.connection import RemotingConnection

    Handler = Callable[[RemotingConnection, RemotingCommand], Any]  # (as the remoting broker's handlers)

log = logging.getLogger("tidemq.cluster")

MAX_GET_MESSAGES = 1024
TAKEOVER_TIMEOUT_S = 5.0  # a gateway node asked to disconnect a client answers within this
MAX_KV_ITEMS = 100_000

FILTERS_TABLE = "cluster.filters"  # "{filter}\x00{holder}" of durable holds (persistent sessions)
# "{node}\x00{filter}\x00{holder}" of a gateway node's holds for its link only (clean sessions):
# written too, so that a store node taking over (a new leader, a restart) holds them until the
# node links again and says them again, or RELINK_S has passed
NODE_FILTERS_TABLE = "cluster.node_filters"
RELINK_S = 15.0  # a gateway node's FAILOVER_S: how long it keeps its clients while linking again


class StoreService:
    """``wildcards``: the cluster's MQTT wildcard filters (shared with the store node's own MQTT
    broker when it has one); a session of a gateway node holds each filter it subscribes to,
    durably (persistent sessions: kept across restarts) or for as long as its node's link
    lasts. ``retained``: the cluster's retained messages."""

    def __init__(self, store: MessageStore, wildcards: WildcardQueues, retained: RetainedIndex,
                 router: NotifyRouter | None = None, token: str = "", amqp_port: int = 0) -> None:
        self.store = store
        self.amqp_port = amqp_port  # where gateway nodes relay AMQP clients to (0: no AMQP listener)
        self.grpc_port = 0  # where gateway nodes proxy gRPC calls to (0: no gRPC listener)
        self.token = token  # the cluster token gateway nodes must present ("": none asked)
        self._trusted: weakref.WeakSet[RemotingConnection] = weakref.WeakSet()
        self.wildcards = wildcards
        self.retained = retained
        self.router = router or NotifyRouter()
        self._links: dict[str, RemotingConnection] = {}  # gateway node id -> its link
        self._node_of: dict[RemotingConnection, str] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._durable: set[tuple[str, str]] = set()
        self._volatile: dict[object, set[tuple[str, str]]] = {}  # per gateway node link
        self._filters = store.table(FILTERS_TABLE)
        self._node_filters = store.table(NODE_FILTERS_TABLE)
        self.stopping = False  # the links end because this node stops serving: their holds stay written
        # link-only holds found written: held until their node says them again on a new link,
        # or until RELINK_S after start (``release_unclaimed``)
        self._unclaimed: dict[str, set[tuple[str, str]]] = {}
        for key in self._node_filters.names():
            node, _, rest = key.partition("\x00")
            topic_filter, _, holder = rest.partition("\x00")
            self._unclaimed.setdefault(node, set()).add((topic_filter, holder))
            wildcards.add(topic_filter)
        sessions = store.table(SESSIONS_TABLE)
        self._expiry = SessionExpiry(lambda: stored_sessions(sessions), self._end_session)
        for key in self._filters.names():
            topic_filter, _, holder = key.partition("\x00")
            self._durable.add((topic_filter, holder))
            wildcards.add(topic_filter)

    # -- offline MQTT sessions ----------------------------------------------------------------
    def start(self, expiry_check_interval_s: float = 30.0) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._expiry.run(expiry_check_interval_s), name="session-expiry"),
                       loop.create_task(self._route_notify(), name="notify-router")]
        if self._unclaimed:
            self._tasks.append(loop.create_task(self._release_unclaimed_later(), name="unclaimed-holds"))

    async def _release_unclaimed_later(self) -> None:
        await asyncio.sleep(RELINK_S)
        self.release_unclaimed()

    def release_unclaimed(self) -> None:
        """The link-only holds of nodes that did not say them again: their clean sessions ended
        while no store node served them (or their node is gone)."""
        for node, holds in self._unclaimed.items():
            for topic_filter, holder in holds:
                self.wildcards.remove(topic_filter)
                self._node_filters.delete(f"{node}\x00{topic_filter}\x00{holder}")
        self._unclaimed.clear()

    async def stop(self) -> None:
        self.router.close()
        await cancel_and_wait(self._tasks)
        self._tasks = []

    def expire_sessions(self, now: float | None = None) -> list[str]:
        """End the stored MQTT sessions whose expiry ran out while their clients were away
        (gateway nodes keep only their connected clients' sessions); their client ids."""
        return self._expiry.sweep(now)

    def _end_session(self, session: Session) -> None:
        """The stored session, and the wildcard filters it held."""
        client_id = session.client_id
        self.store.table(SESSIONS_TABLE).delete(client_id)
        for hold in [h for h in self._durable if h[1] == client_id]:
            self._durable.discard(hold)
            self._filters.delete(f"{hold[0]}\x00{hold[1]}")
            self.wildcards.remove(hold[0])

    def handlers(self) -> dict[int, Handler]:
        """The store link's request handlers, each behind the cluster token check."""
        handlers: dict[int, Handler] = {
            StoreCode.HELLO: self.hello,
            StoreCode.PUT: self.put,
            StoreCode.GET: self.get,
            StoreCode.READ_AT: self.read_at,
            StoreCode.OFFSETS: self.offsets,
            StoreCode.COMMIT_OFFSET: self.commit_offset,
            StoreCode.GET_OFFSET: self.get_offset,
            StoreCode.KV_GET: self.kv_get,
            StoreCode.KV_PUT: self.kv_put,
            StoreCode.KV_DELETE: self.kv_delete,
            StoreCode.KV_ITEMS: self.kv_items,
            StoreCode.SUBSCRIBE_NOTIFY: self.subscribe_notify,
            StoreCode.INTEREST: self.interest,
            StoreCode.TAKEOVER: self.takeover,
            StoreCode.FILTER_HOLD: self.filter_hold,
            StoreCode.FILTER_RELEASE: self.filter_release,
            StoreCode.RETAINED_SET: self.retained_set,
            StoreCode.RETAINED_MATCH: self.retained_match,
        }
        return {code: self._guarded(code, handler) for code, handler in handlers.items()}

    def _guarded(self, code: int, handler: Handler) -> Handler:
        """With a cluster token, a link must start with a HELLO that carries it; anything else
        on a link that has not is refused (RocketMQ's NO_PERMISSION)."""
        def guarded(conn: RemotingConnection, request: RemotingCommand) -> Any:
            if self.token and conn not in self._trusted and code != StoreCode.HELLO:
                log.warning("store link request without the cluster token refused code=%d peer=%s",
                            code, conn.peer)
                return response_to(request, ResponseCode.NO_PERMISSION, "say HELLO with the cluster token first")
            return handler(conn, request)
        return guarded

    def trusts(self, conn: RemotingConnection) -> bool:
        """Whether ``conn`` may do what gateway nodes do (it said HELLO with the cluster token,
        or none is asked)."""
        return not self.token or conn in self._trusted

    def hello(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        if self.token:
            if not hmac.compare_digest(request.ext_fields.get("token", ""), self.token):
                log.warning("store link HELLO with a wrong cluster token peer=%s", conn.peer)
                return response_to(request, ResponseCode.NO_PERMISSION, "wrong cluster token")
            self._trusted.add(conn)
        conn.exempt_from_idle_timeout()  # a gateway node's link may be quiet for long
        options = self.store.options
        return response_to(request, ResponseCode.SUCCESS, ext_fields={
            "idPrefix": self.store.msg_id_prefix, "maxMessageSize": str(options.max_message_size),
            "amqpPort": str(self.amqp_port), "grpcPort": str(self.grpc_port)})

    def put(self, conn: RemotingConnection, request: RemotingCommand) -> Reply:
        items = decode_put(request.body)
        if not items:
            raise BadRequest("a PUT with no message")
        matching: dict[str, list[str]] = {}  # topic -> its wildcard queues (a put's messages share a few topics)
        for message, queues in items:
            if WILDCARD_TARGETS in queues:
                queues.remove(WILDCARD_TARGETS)
                wildcards = matching.get(message.topic)
                if wildcards is None:
                    wildcards = matching[message.topic] = self.wildcards.queues_for(message.topic)
                queues.extend(q for q in wildcards if q not in queues)
        ext = request.ext_fields
        producer = (str_field(ext, "producer").encode(), int_field(ext, "seq")) if "producer" in ext else None
        future = self.store.put_batch_nowait(items, producer=producer)
        offsets = ext.get("offsets") != "0"

        def respond(results: Sequence[PutResult]) -> RemotingCommand:
            return response_to(request, ResponseCode.SUCCESS, body=encode_put_results(results, offsets))
        return Pending(future, respond)

    def get(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        ext = request.ext_fields
        tags = ext.get("tags")
        try:
            tag_hashes = frozenset(int(t) for t in tags.split(",") if t) if tags is not None else None
        except ValueError:
            raise BadRequest("the tags field is not a list of numbers") from None
        result = self.store.get_now(str_field(ext, "queue"), int_field(ext, "offset"),
                                    max(1, min(int_field(ext, "max"), MAX_GET_MESSAGES)),
                                    int_field(ext, "maxBytes", 4 << 20), tag_hashes)
        body = encode_messages(result.messages, self._records(result.messages)) if result.messages else b""
        return response_to(request, ResponseCode.SUCCESS, ext_fields=result_fields(result), body=body)

    def _records(self, messages: list[StoredMessage]) -> list[bytes]:
        return self.store.commitlog.records([(m.position, m.size) for m in messages])

    def read_at(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        message = self.store.read_at(int_field(request.ext_fields, "position"))
        if message is None:
            return response_to(request, ResponseCode.SUCCESS, ext_fields={"found": "false"})
        return response_to(request, ResponseCode.SUCCESS, ext_fields={"found": "true"},
                           body=encode_messages([message], self._records([message])))

    def offsets(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        """Body: queue names; answer: ``max`` in the body, ``min`` offsets in a second part."""
        store = self.store
        names = decode_names(request.body)
        highs = {name: store.max_offset_now(name) for name in names}
        lows = {name: store.min_offset_now(name) for name in names}
        high, low = encode_offsets(highs), encode_offsets(lows)
        return response_to(request, ResponseCode.SUCCESS, ext_fields={"split": str(len(high))}, body=high + low)

    def commit_offset(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand | None:
        ext = request.ext_fields
        # "durable": a group's start, written through (MessageStore.save_offset_now)
        commit = self.store.save_offset_now if ext.get("durable") == "1" else self.store.commit_offset_now
        commit(str_field(ext, "consumer"), str_field(ext, "queue"), int_field(ext, "offset"))
        return None if request.is_oneway else response_to(request, ResponseCode.SUCCESS)

    def get_offset(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        ext = request.ext_fields
        offset = self.store.get_offset_now(str_field(ext, "consumer"), str_field(ext, "queue"))
        return response_to(request, ResponseCode.SUCCESS, ext_fields={"offset": str(-1 if offset is None else offset)})

    def kv_get(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        ext = request.ext_fields
        value = self.store.table(str_field(ext, "table")).get(str_field(ext, "key"))
        if value is None:
            return response_to(request, ResponseCode.SUCCESS, ext_fields={"found": "false"})
        return response_to(request, ResponseCode.SUCCESS, ext_fields={"found": "true"}, body=value)

    def kv_put(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand | None:
        ext = request.ext_fields
        self.store.table(str_field(ext, "table")).put(str_field(ext, "key"), request.body)
        return None if request.is_oneway else response_to(request, ResponseCode.SUCCESS)

    def kv_delete(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand | None:
        ext = request.ext_fields
        self.store.table(str_field(ext, "table")).delete(str_field(ext, "key"))
        return None if request.is_oneway else response_to(request, ResponseCode.SUCCESS)

    def kv_items(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        ext = request.ext_fields
        table = self.store.table(str_field(ext, "table"))
        items = []
        for item in table.items(ext.get("prefix", "")):
            items.append(item)
            if len(items) >= MAX_KV_ITEMS:
                break
        return response_to(request, ResponseCode.SUCCESS, body=encode_items(items))

    # -- wildcard filters and retained messages -----------------------------------------------
    def filter_hold(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand | None:
        ext = request.ext_fields
        hold = (str_field(ext, "filter"), str_field(ext, "holder"))
        if ext.get("durable") == "true":
            self._release_volatile(conn, hold)
            if hold not in self._durable:
                self._durable.add(hold)
                self._filters.put(f"{hold[0]}\x00{hold[1]}", b"")
                self.wildcards.add(hold[0])
        elif hold not in self._durable:
            holds = self._volatile.setdefault(conn, set())
            if hold not in holds:
                holds.add(hold)
                node = self._node_of.get(conn)
                unclaimed = self._unclaimed.get(node) if node is not None else None
                if unclaimed is not None and hold in unclaimed:
                    unclaimed.discard(hold)  # (counted in the wildcards since start: claimed, not added)
                else:
                    self.wildcards.add(hold[0])
                    if node is not None:
                        self._node_filters.put(f"{node}\x00{hold[0]}\x00{hold[1]}", b"")
        return None if request.is_oneway else response_to(request, ResponseCode.SUCCESS)

    def filter_release(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand | None:
        ext = request.ext_fields
        hold = (str_field(ext, "filter"), str_field(ext, "holder"))
        if hold in self._durable:
            self._durable.discard(hold)
            self._filters.delete(f"{hold[0]}\x00{hold[1]}")
            self.wildcards.remove(hold[0])
        self._release_volatile(conn, hold)
        return None if request.is_oneway else response_to(request, ResponseCode.SUCCESS)

    def _release_volatile(self, conn: object, hold: tuple[str, str]) -> None:
        holds = self._volatile.get(conn)
        if holds is not None and hold in holds:
            holds.discard(hold)
            self.wildcards.remove(hold[0])
            node = self._node_of.get(conn) if isinstance(conn, RemotingConnection) else None
            if node is not None:
                self._node_filters.delete(f"{node}\x00{hold[0]}\x00{hold[1]}")

    def link_closed(self, conn: object, node: str | None = None) -> None:
        """A gateway node's link ended: the holds of its clean sessions end with it (those its
        node holds again on a newer link are kept written)."""
        newer = self._volatile.get(self._links.get(node)) if node is not None else None
        for topic_filter, holder in self._volatile.pop(conn, set()):
            self.wildcards.remove(topic_filter)
            if node is not None and not self.stopping and (newer is None or (topic_filter, holder) not in newer):
                self._node_filters.delete(f"{node}\x00{topic_filter}\x00{holder}")

    def retained_set(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand | None:
        ext = request.ext_fields
        position = int_field(ext, "position")
        self.retained.set(str_field(ext, "topic"), position if position >= 0 else None)
        return None if request.is_oneway else response_to(request, ResponseCode.SUCCESS)

    def retained_match(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        messages = self.retained.matching(str_field(request.ext_fields, "filter"))
        return response_to(request, ResponseCode.SUCCESS,
                           body=encode_messages(messages, self._records(messages)))

    # -- notify -------------------------------------------------------------------------------
    def subscribe_notify(self, conn: RemotingConnection, request: RemotingCommand) -> Reply:
        return self._feed_notify(conn, request)

    async def _feed_notify(self, conn: RemotingConnection, request: RemotingCommand) -> None:
        """Answer, then hold the node's place in notify routing until its link closes."""
        node = request.ext_fields.get("nodeId") or conn.peer
        conn.send(response_to(request, ResponseCode.SUCCESS))
        conn.flush()
        if node in self._links:
            log.warning("a gateway node id is used twice node_id=%s peer=%s", node, conn.peer)
        self._links[node] = conn
        self._node_of[conn] = node
        self.router.node_joined(node)
        log.info("gateway node subscribed to notify node_id=%s peer=%s", node, conn.peer)
        try:
            await asyncio.get_running_loop().create_future()  # until the link closes (cancelled)
        finally:
            self._node_of.pop(conn, None)
            if self._links.get(node) is conn:
                del self._links[node]
                self.router.node_left(node)
            self.link_closed(conn, node)

    def interest(self, conn: RemotingConnection, request: RemotingCommand) -> None:
        """A gateway node starts (or stops) reading a queue: a routing hint, one-way."""
        node = self._node_of.get(conn)
        if node is None:
            raise BadRequest("INTEREST before SUBSCRIBE_NOTIFY on this link")
        ext = request.ext_fields
        self.router.hint(str_field(ext, "queue"), node, ext.get("reading") == "true")

    def takeover(self, conn: RemotingConnection, request: RemotingCommand) -> Reply:
        return self._takeover(conn, request)

    async def _takeover(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        """A client connected to the asking node: the node it was on (``node``, or ``*``: every
        other node) disconnects it and saves its session, then the asking node is answered --
        so it loads the session as the old node left it."""
        ext = request.ext_fields
        client_id, target = str_field(ext, "clientId"), str_field(ext, "node")
        asking = self._node_of.get(conn)
        links = [c for node, c in self._links.items() if node != asking and (target == "*" or node == target)]
        results = await asyncio.gather(*(self._kick(c, client_id) for c in links))
        return response_to(request, ResponseCode.SUCCESS, ext_fields={"kicked": str(sum(results)),
                                                                      "asked": str(len(links))})

    async def _kick(self, conn: RemotingConnection, client_id: str) -> bool:
        try:
            reply = await conn.call(StoreCode.CLIENT_KICK, {"clientId": client_id}, TAKEOVER_TIMEOUT_S)
        except (TimeoutError, ConnectionError) as exc:  # that node is gone or stuck: it will lose the client
            log.warning("takeover: a gateway node did not answer peer=%s client_id=%s error=%r",
                        conn.peer, client_id, exc)
            return False
        return reply.ext_fields.get("kicked") == "true"

    async def _route_notify(self) -> None:
        """Every notify event of the store, to the gateway nodes that need it."""
        subscription = self.store.subscribe_notify()
        try:
            async for queue, max_offset in subscription:
                # a turn first: the puts of the commit that notified are answered in it, so a
                # gateway node hears its own puts' offsets before their notify (and so does not
                # read back what it wrote: GatewayStore's write-through)
                await asyncio.sleep(0)
                events = {queue: max_offset}
                events.update(subscription.drain())
                for node, routed in self.router.route(events).items():
                    conn = self._links.get(node)
                    if conn is not None:
                        conn.send(RemotingCommand(StoreCode.NOTIFY, flag=FLAG_ONEWAY, body=encode_offsets(routed)))
                        conn.flush()
                await asyncio.sleep(0)  # let the next events coalesce meanwhile
        finally:
            subscription.close()

