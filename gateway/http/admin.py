"""The admin API behind ``tidemq ctl``, served as JSON on the metrics listener under ``/admin/``:
clients, MQTT sessions, subscriptions of every protocol, queue statistics, kicking a client,
and message lookup by key or message id (the store's, or the client's msgId).

The views here read what they are given (the protocol gateways, the store: ``deps.py``) and
return plain data; ``app.HttpServer`` routes HTTP to them, and its guard lets only the
operator reach them once credentials are required (they show message bodies and kick clients).
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from lookup.api import IN_DOUBT
from protocols.mqtt.reason_codes import ReasonCode
from protocols.remoting.properties import UNIQ_KEY
from store import StoredMessage
from store import decode_msg_id

from .. import trace as message_trace
from ..interop import AMQP_QUEUE_PREFIX as AMQP_STORE_QUEUE_PREFIX, of_dollar_topics
from .errors import AdminError, no_store
from .queue_pages import queue_page

if TYPE_CHECKING:
    from store import MessageStore

    from ..mqtt.broker import MQTTBroker
    from .deps import Brokers, NodePlace

MAX_ROWS = 1000
MAX_SAME_ID = 16  # messages stored with one client msgId (a send retried after a lost answer)
MAX_TOPICS_SEARCHED = 100_000  # topics with keys a client msgId is looked for in, when no topic is given


def clients(brokers: Brokers) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if brokers.mqtt is not None:
        for client_id, conn in brokers.mqtt.connections.items():
            rows.append({"protocol": "mqtt", "id": client_id, "peer": conn.peer, "username": conn.username,
                         "mqtt_version": conn.version})
    if brokers.amqp is not None:
        for amqp_conn in brokers.amqp.connections:
            rows.append({"protocol": "amqp", "id": amqp_conn.peer, "peer": amqp_conn.peer,
                         "username": amqp_conn.username, "channels": len(amqp_conn.channels)})
    if brokers.remoting is not None:
        for remoting_conn in brokers.remoting.connections:
            rows.append({"protocol": "remoting", "id": remoting_conn.client_id or remoting_conn.peer,
                         "peer": remoting_conn.peer})
    return rows[:MAX_ROWS]


async def locate_client(mqtt: MQTTBroker | None, node: NodePlace, client_id: str) -> list[dict[str, Any]]:
    """Where an MQTT client is connected: this node, or (a gateway node with a lookup) the node
    the lookup names -- "in doubt" while the lookup cannot say."""
    here = mqtt is not None and client_id in mqtt.connections
    where: str | None = node.node_id if here else None
    lookup = node.lookup
    if lookup is not None and not here:
        found = await lookup.where_is(client_id)
        where = "in doubt" if found is IN_DOUBT else found
    return [{"protocol": "mqtt", "id": client_id, "node": where or "offline", "here": here}]


def sessions(mqtt: MQTTBroker | None) -> list[dict[str, Any]]:
    if mqtt is None:
        return []
    rows = []
    for client_id, session in list(mqtt.sessions.items())[:MAX_ROWS]:
        rows.append({"client_id": client_id, "connected": client_id in mqtt.connections,
                     "persistent": session.persistent, "expiry_interval": session.expiry_interval,
                     "subscriptions": len(session.subscriptions), "inflight": len(session.inflight)})
    return rows


def subscriptions(brokers: Brokers) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if brokers.mqtt is not None:
        for client_id, session in brokers.mqtt.sessions.items():
            for sub in session.subscriptions.values():
                rows.append({"protocol": "mqtt", "client": client_id, "filter": sub.topic_filter,
                             "qos": sub.options.qos, "queue": sub.queue, "share_group": sub.share_group})
    if brokers.amqp is not None:
        for queue in brokers.amqp.queues.values():
            for consumer in queue.consumers.values():
                rows.append({"protocol": "amqp", "client": consumer.channel.connection.peer,
                             "queue": queue.name, "consumer_tag": consumer.tag, "unacked": consumer.unacked})
    if brokers.remoting is not None:
        for group, members in brokers.remoting.groups.groups.items():
            for member in members.values():
                for remoting_sub in member.subscriptions.values():
                    rows.append({"protocol": "remoting", "client": member.client_id, "group": group,
                                 "topic": remoting_sub.topic, "expression": remoting_sub.expression,
                                 "expression_type": remoting_sub.expression_type})
    return rows[:MAX_ROWS]


def queues(store: MessageStore | None, brokers: Brokers, prefix: str = "", after: str = "",
           limit: int = 100) -> dict[str, Any]:
    """A page of the store queues whose name starts with ``prefix``, past ``after``: offsets,
    entries ``stored`` (max - min offset), the ``backlog`` where one cursor reads the whole queue
    (an AMQP queue: max offset - its consumer offset), and who reads them; ``next_after``: the
    ``after`` of the next page (None: the listing is complete). Left out: store queues of AMQP
    queues that no longer exist (deleted, before a restart too: the store keeps their entries
    until retention, but nothing can read them), and those of ``$`` topics (presence events)
    unless the prefix names them (``t:$``)."""
    if not 1 <= limit <= MAX_ROWS:
        raise AdminError(400, f"limit must be 1 to {MAX_ROWS}: page on with after (the answer's next_after)")
    if store is None:
        return {"queues": [], "next_after": None}
    readers: dict[str, int] = {}
    cursors: dict[str, str] = {}  # store queue -> the consumer whose offset is its backlog's start
    if brokers.mqtt is not None:
        readers.update({queue: len(conns) for queue, conns in brokers.mqtt.readers.items()})
    if brokers.amqp is not None:
        for queue in brokers.amqp.queues.values():
            readers[queue.store_queue] = len(queue.consumers)
            cursors[queue.store_queue] = queue.consumer_name
    amqp_gone = brokers.amqp is not None
    dollar = of_dollar_topics(prefix)

    def listed(name: str) -> bool:
        if amqp_gone and name.startswith(AMQP_STORE_QUEUE_PREFIX) and name not in cursors:
            return False
        return dollar or not of_dollar_topics(name)

    page = queue_page(store.index.iter_names, prefix, after, limit, listed)
    rows = []
    for name in page.names:
        result = store.get_now(name, -1, 1)  # answers with the queue's offsets only
        backlog = None
        if name in cursors:
            start = store.get_offset_now(cursors[name], name)
            backlog = result.max_offset - max(result.min_offset, start if start is not None else result.max_offset)
        rows.append({"queue": name, "min_offset": result.min_offset, "max_offset": result.max_offset,
                     "stored": result.max_offset - result.min_offset, "backlog": backlog,
                     "readers": readers.get(name, 0)})
    return {"queues": rows, "next_after": page.next_after}


def kick(brokers: Brokers, protocol: str, client: str) -> dict[str, Any]:
    """Disconnect a client: MQTT by client id (DISCONNECT 0x98 for 5.0), AMQP by peer address
    (connection.close 320), remoting by client id or peer."""
    if protocol == "mqtt" and brokers.mqtt is not None:
        conn = brokers.mqtt.connections.get(client)
        if conn is not None:
            conn.disconnect(ReasonCode.ADMINISTRATIVE_ACTION, "disconnected by an administrator")
            return {"kicked": client}
    elif protocol == "amqp" and brokers.amqp is not None:
        for amqp_conn in list(brokers.amqp.connections):
            if amqp_conn.peer == client:
                amqp_conn.shutdown()
                return {"kicked": client}
    elif protocol == "remoting" and brokers.remoting is not None:
        for remoting_conn in list(brokers.remoting.connections):
            if client in (remoting_conn.client_id, remoting_conn.peer):
                remoting_conn.close()
                return {"kicked": client}
    elif protocol not in ("mqtt", "amqp", "remoting"):
        raise AdminError(400, f"unknown protocol {protocol!r}: mqtt, amqp or remoting")
    raise AdminError(404, f"no {protocol} client {client!r} is connected")


def message_view(message: StoredMessage) -> dict[str, Any]:
    try:
        body: dict[str, str] = {"body": message.body.decode()}
    except UnicodeDecodeError:
        body = {"body_base64": base64.b64encode(message.body).decode()}
    return {"msg_id": message.msg_id, "position": message.position, "topic": message.topic, "key": message.key,
            "born_timestamp": message.born_timestamp, "store_timestamp": message.store_timestamp,
            "size": message.size, "queues": dict(message.queues), "properties": message.properties, **body}


async def find_messages(store: MessageStore | None, *, key: str | None, topic: str | None, msg_id: str | None,
                        begin_ms: int = 0, end_ms: int = 1 << 62) -> list[dict[str, Any]]:
    if store is None:
        raise no_store()
    if msg_id:
        return [message_view(m) for m in await messages_with_id(store, msg_id, topic)]
    if not key or not topic:
        raise AdminError(400, "give msg_id, or key and topic")
    return [message_view(m) for m in store.query_by_key(topic, key, max_messages=64, begin_ms=begin_ms, end_ms=end_ms)]


async def messages_with_id(store: MessageStore, msg_id: str, topic: str | None = None) -> list[StoredMessage]:
    """The message an id names, in either of RocketMQ's forms: the store's own (offsetMsgId, a
    commitlog position), or the one a client made and prints as msgId (property UNIQ_KEY,
    indexed as a key) -- in ``topic``, or in every topic. (A resent message can have two.)"""
    check_msg_id(msg_id)
    found: dict[int, StoredMessage] = {}
    at_position = await store.get_by_id(msg_id)
    if at_position is not None and topic in (None, at_position.topic):
        found[at_position.position] = at_position
    unique = msg_id.upper()  # (clients write it in upper case, as the store its own ids)
    if topic:
        candidates, complete = store.query_by_key(topic, unique, max_messages=MAX_SAME_ID), True
    else:
        candidates, complete = store.query_by_key_in_every_topic(unique, max_messages=MAX_SAME_ID,
                                                                 max_topics=MAX_TOPICS_SEARCHED)
    for message in candidates:
        if message.properties.get(UNIQ_KEY, "").upper() == unique:
            found[message.position] = message
    if not found and not complete:
        raise AdminError(422, f"msg_id {msg_id}: not found as a stored message's id, and looked for as a client's "
                              f"msgId in the first {MAX_TOPICS_SEARCHED} topics with keys only: give its topic too")
    return [found[position] for position in sorted(found)]


def check_msg_id(msg_id: str) -> None:
    """A malformed id is the caller's mistake (400), not a message that is not there."""
    try:
        decode_msg_id(msg_id)
    except ValueError as exc:
        raise AdminError(400, f"msg_id {msg_id!r}: {exc}") from None


async def trace(store: MessageStore | None, traced_listeners: frozenset[str], *, msg_id: str | None,
                key: str | None) -> dict[str, Any]:
    """The trace events of one message (by either form of its id: ``messages_with_id``) or of
    the messages published with a key; the listeners whose traffic is traced."""
    if store is None:
        raise no_store()
    if msg_id:
        check_msg_id(msg_id)
        events = message_trace.trace_of(store, msg_id)
        if not events:  # (a client's msgId: the trace is kept under the store's id)
            for message in await messages_with_id(store, msg_id):
                if message.msg_id != msg_id:
                    events.extend(message_trace.trace_of(store, message.msg_id))
    elif key:
        events = message_trace.traces_by_key(store, key)
    else:
        raise AdminError(400, "give msg_id or key")
    return {"tracing": sorted(traced_listeners), "events": events}
